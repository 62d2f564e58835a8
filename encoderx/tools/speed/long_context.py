"""Long context on this machine: the tiny ModernBERT's train step at batch 1 over rows of
1,024 to 8,192 tokens, its time and its peak memory.

    python -m encoderx.tools.speed.long_context [--lengths=1024,4096,8192] [--kernels=auto] \
        [--steps=5] [--json=FILE]

For each kernel (model.attention.kernel; `--kernels=xla,auto` compares XLA's whole-mask
attention with what "auto" picks) and length, in a fresh subprocess so that each peak is
its own: the tiny ModernBERT (configs/modernbert.py:tiny where it exists, else
`tiny_modernbert`: ModernBERT's fields at bert tiny's size, 2 x 128 with a 64-token
window, one global layer and one local) trains on one row of that length at a time:
`Trainer.train_step` (30% masking, forward, MLM loss, backward, the optimizer step),
compiled ahead of time (the compile seconds), WARMUP_STEPS untimed steps, then --steps
timed ones (their median). The rows are synthetic packed documents
(`packed_row`: documents of a few hundred to two thousand tokens, positions restarting
in each, the tail padded), so that no input pipeline (nor its memory) takes part.

Each row gives the process's peak resident memory (VmHWM of /proc/self/status, the
high-water mark of the whole process: the runtime, the compiled step, the state and
what the step allocates), XLA's temporaries of the compiled step and whether its program
holds an [L, L] array. The last line compares the peak at the longest length with the
shortest's against the bound of issue 36 (8,192 tokens at most 1.5 GB above 1,024).
--json=FILE writes the rows as the bench's record (encoderx/tools/figures/report.py: date,
commit, device, malloc, command).
"""
from __future__ import annotations

from encoderx.models import attention_kernels, model_config
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # pylint: disable=g-import-not-at-top

MODULE = "encoderx.tools.speed.long_context"
KIND = "long_context"
WARMUP_STEPS = 1
BOUND_GB = 1.5  # issue 36: the peak at 8,192 tokens at most this above 1,024's
RESULT = "RESULT "  # the child's last line: RESULT {json}


def tiny_modernbert():
  """The tiny ModernBERT: configs/modernbert.py:tiny where it exists; else ModernBERT's
  fields (Hugging Face's ModernBertConfig defaults, read as --init_from reads them) at
  bert tiny's size (configs/common.py tiny_sizes: 2 layers of 128, 2 heads) on the
  bundled byte-level BPE vocabulary, with a 64-token window: layer 0 global, layer 1
  local."""
  from encoderx import configs  # pylint: disable=g-import-not-at-top
  from encoderx.configs import common as configs_common  # pylint: disable=g-import-not-at-top
  from encoderx.hf import engine  # pylint: disable=g-import-not-at-top
  try:
    return configs.get("modernbert:tiny")
  except ModuleNotFoundError:
    pass
  config = configs.get("roberta:tiny")  # the bundled byte-level BPE vocabulary
  _, fields = engine.model_fields({"model_type": "modernbert"})
  config.model.update(model_config.nested({
      **fields, "vocab_size": 0, "attention.window": 64, "hidden_dropout": 0.0,
      "attention.dropout": 0.0, "dtype": "float32"}))
  return configs_common.tiny_sizes(config)


def long_config(length: int, kernel: str):
  """The tiny ModernBERT training on rows of `length` at batch 1 with `kernel`."""
  config = tiny_modernbert()
  config.data.seq_length = length
  config.model.embeddings.max_positions = max(config.model.embeddings.max_positions, length)
  config.model.attention.kernel = kernel
  config.train.batch_size, config.train.grad_accum_steps = 1, 1
  config.train.long_fraction = 0.0
  if "batch_size_schedule" in config.train:
    config.train.batch_size_schedule = ()
  config.objective.mlm.rate = 0.3  # ModernBERT's
  config.objective.mlm.max_predictions = -(-int(0.3 * length) // 8) * 8
  return config


def packed_row(length: int, vocab_size: int, seed: int) -> dict[str, np.ndarray]:
  """One row [1, length] of documents of 200..2,000 tokens packed end to end (segment
  ids 1, 2, ..., positions restarting at each), the last 3% padding; token ids drawn
  from the vocabulary past its first 10 ids (the special ones)."""
  rng = np.random.default_rng(seed)
  real = length - length // 32
  segments, positions, document, start = np.zeros(length, np.int32), np.zeros(
      length, np.int32), 1, 0
  while start < real:
    end = min(real, start + int(rng.integers(200, 2000)))
    segments[start:end], positions[start:end] = document, np.arange(end - start)
    document, start = document + 1, end
  input_ids = np.where(segments > 0, rng.integers(10, vocab_size, length), 0)
  return {"input_ids": input_ids[None].astype(np.int32),
          "token_type_ids": np.zeros((1, length), np.int32),
          "segment_ids": segments[None], "positions": positions[None],
          "word_starts": (segments > 0).astype(np.int32)[None]}


def peak_resident_mb() -> float:
  """This process's peak resident memory in MiB: VmHWM of /proc/self/status, else
  ru_maxrss."""
  try:
    with open("/proc/self/status", encoding="utf-8") as status:
      for line in status:
        if line.startswith("VmHWM:"):
          return int(line.split()[1]) / 1024
  except OSError:
    pass
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def has_square_array(compiled, length: int) -> bool:
  """Whether the compiled program (`jax.stages.Compiled`) holds an array with two axes
  of `length`: an [L, L] mask, scores or probabilities."""
  return f"{length},{length}]" in compiled.as_text()


def measure_one(length: int, kernel: str, steps: int) -> dict:
  """The row of one length and kernel, measured in this process."""
  import jax  # pylint: disable=g-import-not-at-top
  from encoderx.train import trainer as trainer_lib  # pylint: disable=g-import-not-at-top
  config = long_config(length, kernel)
  trainer = trainer_lib.Trainer(config, devices=jax.devices()[:1])
  model = trainer.method.model_config
  batches = [packed_row(length, model.vocab_size, seed) for seed in range(2)]
  state = trainer.init_state()
  before = peak_resident_mb()
  step, cost = trainer.compile_train_step(state, trainer.device_batch(batches[0]))
  times = []
  for index in range(WARMUP_STEPS + steps):
    start = time.perf_counter()
    state, metrics = step(state, trainer.device_batch(batches[index % len(batches)]))
    jax.block_until_ready(metrics)
    times.append(time.perf_counter() - start)
  times = times[WARMUP_STEPS:]
  dummy = jax.ShapeDtypeStruct((1, length, model.num_heads, model.head_dim), jax.numpy.float32)
  kinds = sorted({attention_kernels.choose(model, dummy, dummy, dummy, window, False,
                                           False) for window in
                  {0 if model.is_global_layer(i) else model.attention.window
                   for i in range(model.num_layers)}})
  return {"kernel": kernel, "kernels_run": ",".join(kinds), "seq_length": length,
          "compile_seconds": cost.compile_seconds,
          "step_ms": 1e3 * statistics.median(times), "step_ms_min": 1e3 * min(times),
          "steps": steps, "tokens_per_second": length / statistics.median(times),
          "loss": float(metrics["loss"]),
          "temp_mb": cost.temp_bytes / 2**20,
          "square_array": has_square_array(step.__wrapped__, length),
          "peak_mb_before_compile": before, "peak_mb": peak_resident_mb()}


def run_child(length: int, kernel: str, steps: int) -> dict:
  """`measure_one` in a fresh process (its own peak memory)."""
  command = [sys.executable, "-m", MODULE, f"--measure_one={length}", f"--kernels={kernel}",
             f"--steps={steps}"]
  ran = subprocess.run(command, capture_output=True, text=True, check=False)
  results = [line for line in ran.stdout.splitlines() if line.startswith(RESULT)]
  if ran.returncode or not results:
    tail = "\n".join((ran.stdout + ran.stderr).strip().splitlines()[-15:])
    raise SystemExit(f"{' '.join(command)} failed (exit {ran.returncode}):\n{tail}")
  return json.loads(results[-1][len(RESULT):])


def memory_line(rows: list[dict]) -> list[str]:
  """Per kernel: the peak at its longest length less its shortest's, against BOUND_GB
  where those are 8,192 and 1,024 tokens."""
  lines = []
  for kernel in dict.fromkeys(row["kernel"] for row in rows):
    mine = sorted((r for r in rows if r["kernel"] == kernel), key=lambda r: r["seq_length"])
    if len(mine) < 2:
      continue
    short, long = mine[0], mine[-1]
    growth = (long["peak_mb"] - short["peak_mb"]) / 1024
    line = (f"{kernel}: peak at {long['seq_length']:,} tokens - peak at "
            f"{short['seq_length']:,} = {growth:.2f} GB")
    if (short["seq_length"], long["seq_length"]) == (1024, 8192):
      line += (f" (bound {BOUND_GB} GB: "
               f"{'within' if growth <= BOUND_GB else 'EXCEEDED'})")
    lines.append(line)
  return lines


def parse_args(argv):
  parser = argparse.ArgumentParser(prog=f"python -m {MODULE}",
                                   description=__doc__.split("\n", 1)[0])
  parser.add_argument("--lengths", default="1024,4096,8192",
                      help="comma-separated row lengths (tokens)")
  parser.add_argument("--kernels", default="auto",
                      help="comma-separated model.attention.kernel values, among "
                      f"{', '.join(attention_kernels.ATTENTION_KERNELS)}")
  parser.add_argument("--steps", type=int, default=5, help="timed steps per row")
  parser.add_argument("--json", default="", metavar="FILE",
                      help="also write the rows with the date, commit, device, malloc and "
                      "this command to FILE")
  parser.add_argument("--measure_one", type=int, default=0, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  try:
    args.lengths = [int(x) for x in args.lengths.split(",")]
  except ValueError:
    parser.error(f"--lengths: comma-separated integers, got {args.lengths!r}")
  args.kernels = [k.strip() for k in args.kernels.split(",") if k.strip()]
  if set(args.kernels) - set(attention_kernels.ATTENTION_KERNELS):
    parser.error(f"--kernels: among {', '.join(attention_kernels.ATTENTION_KERNELS)}, got "
                 f"{','.join(args.kernels)}")
  if args.steps < 1 or min(args.lengths) < 128:
    parser.error("--steps must be positive and --lengths at least 128 (the window)")
  return args


def main(argv=None) -> None:
  argv = sys.argv[1:] if argv is None else list(argv)
  args = parse_args(argv)
  if args.measure_one:
    print(RESULT + json.dumps(measure_one(args.measure_one, args.kernels[0], args.steps)),
          flush=True)
    return
  from encoderx.tools.figures import report  # pylint: disable=g-import-not-at-top
  print(f"long context: the tiny ModernBERT's train step at batch 1, {WARMUP_STEPS} "
        f"warm-up + {args.steps} timed steps; each row in a fresh process; load average "
        f"{os.getloadavg()[0]:.2f}", flush=True)
  rows = []
  for kernel in args.kernels:
    for length in args.lengths:
      rows.append(run_child(length, kernel, args.steps))
      print(f"  {kernel} @ {length:,}: step {rows[-1]['step_ms']:,.0f} ms, peak "
            f"{rows[-1]['peak_mb']:,.0f} MB", flush=True)
  print("\n" + report.table(KIND, rows))
  for line in memory_line(rows):
    print(line)
  if args.json:
    report.write_json(args.json, report.record(KIND, rows, MODULE, argv))


if __name__ == "__main__":
  main()

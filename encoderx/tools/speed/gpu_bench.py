"""The bench's accelerator rows on a GPU host whose image has jax, PyTorch and transformers
but not the text stack (tensorflow, tensorflow-text, seqio): NVIDIA's JAX containers, for
one, and the GPU machines this project is lent, which have no network.

    # where the text stack is installed: record the bench's batches and vocabulary facts
    python launch/gpu_bench.py record DIR [PLAN] [--batch_size=32]
    # on the GPU host, with DIR copied there (encoderx importable, e.g. PYTHONPATH=.)
    python launch/gpu_bench.py all DIR --out=OUT [--budget_s=480]
    python launch/gpu_bench.py rows DIR bert_large@512,bert_base@128 [--dropouts=0,config]
        [--kernels=xla,auto]
    python launch/gpu_bench.py profile DIR bert_large@512 [--dropouts=0] [--trace_out=D]
    python launch/gpu_bench.py tune [--shape=32,512,16,64]

PLAN is `size@length[:batch]`, comma-separated: a size of BERT_ACCELERATOR_SIZES or a
bench model (`modernbert_base`), its length, its batch (default --batch_size); the
default plan is ALL_PLAN. `all` is the issue's one device run: the rows of the plan
(ALL_PLAN: BERT-large at 512 with the config's attention dropout and without, then
ModernBERT-base at 8,192 tokens, 4 rows of packed documents; the first item's row
without dropout only where its config has dropout), each with Hugging Face PyTorch
beside it; a profile of the first item's step with the config's dropout; the first item's train
step with contraction.py's kernel gradients against jax's order, in that order, each part
skipped once --budget_s has passed. With JAX_COMPILATION_CACHE_DIR set, the profile
reuses the rows' compilation. It writes OUT/gpu_bench.json (report.py's
record: the rows, the contraction table, the kernels' times) and OUT/traces/.

`rows` prints the table of `python -m encoderx.tools.speed.bench --device=gpu` (the same
functions: encoderx's jitted train step, Hugging Face PyTorch with SDPA and bf16 autocast
beside it) and first checks the attention kernels on the device (attention_checks.py),
unless every row is --kernels=xla. `profile` traces a few encoderx steps (jax.profiler)
and sums the GPU's time by kernel. `tune` times the attention kernel's tilings (no
recordings needed) and prints the fastest.

Without the text stack: nothing on the paths of rows, profile, all and tune imports it
(the input pipeline and the vocabularies are imported where they are used); the
recordings stand in for what it would make: the batches (the real pipeline's, recorded)
and, through `use_recordings`, the vocabulary's facts (size, mask id, special ids: all
the model and objectives read of it) with no corpus to check. Everything timed is the
bench's own code.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import glob
import itertools
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback

import jax
import numpy as np

from encoderx.methods import pretrain
from encoderx.tools.figures import report
from encoderx.tools.speed import accelerator, attention_checks, bench_models, costs
from encoderx.tools.speed import op_profile, timing, train_steps

VOCABULARY_FILE = "vocabulary.json"  # {the config's data.vocab.path: its facts}
STEPS = 10
ALL_PLAN = "bert_large@512:32,modernbert_base@8192:4"


# --- recordings -------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class RecordedVocabulary:
  """What the model and the objectives read of a vocabulary."""
  vocab_size: int
  mask_id: int
  special_ids: tuple[int, ...]


def batches_file(family: str, length: int) -> str:
  return f"batches_{family}_{length}.npz"


def record(directory: str, plan) -> None:
  """Each plan item's batches (its family's data config at its length, its batch size)
  and each vocabulary's facts, written to `directory` (needs the text stack)."""
  count = 1 + accelerator.ACCELERATOR_WARMUP_STEPS + STEPS
  os.makedirs(directory, exist_ok=True)
  path = os.path.join(directory, VOCABULARY_FILE)
  facts = {}
  if os.path.exists(path):
    with open(path) as f:
      facts = json.load(f)
  for size, length, batch in plan:
    config = accelerator.accelerator_config(size, length, batch)
    batches = bench_models.training_batches(config, count)
    np.savez(os.path.join(directory, batches_file(config.model.family, length)),
             **{f"{i}/{k}": v for i, b in enumerate(batches) for k, v in b.items()})
    vocabulary = pretrain.build_vocabulary(config.data.vocab)
    facts[config.data.vocab.path] = dict(
        vocab_size=int(vocabulary.vocab_size), mask_id=int(vocabulary.mask_id),
        special_ids=[int(i) for i in vocabulary.special_ids])
    print(f"recorded {config.model.family} at {length}: {count} batches of {batch}",
          flush=True)
  with open(path, "w") as f:
    json.dump(facts, f)
  print(f"recorded in {directory}; vocabularies {facts}")


class Recordings:
  """The batches and vocabulary facts `record` wrote to `directory`."""

  def __init__(self, directory: str):
    self.directory = directory
    with open(os.path.join(directory, VOCABULARY_FILE)) as f:
      self.facts = json.load(f)

  def vocabulary(self, vocab_config) -> RecordedVocabulary:
    if vocab_config.path not in self.facts:
      raise SystemExit(f"no recorded vocabulary {vocab_config.path} in {self.directory}")
    known = self.facts[vocab_config.path]
    return RecordedVocabulary(known["vocab_size"], known["mask_id"],
                              tuple(known["special_ids"]))

  def batches(self, config, count: int) -> list[dict]:
    """The first `count` recorded batches of the config's family at its data.seq_length,
    cut to its train.batch_size (bench_models.training_batches' recorded twin)."""
    family, length = config.model.family, config.data.seq_length
    batch_size = config.train.batch_size
    path = os.path.join(self.directory, batches_file(family, length))
    if not os.path.exists(path):
      raise SystemExit(f"no recorded batches of {family} at length {length} in "
                       f"{self.directory}")
    arrays = np.load(path)
    batches = collections.defaultdict(dict)
    for key in arrays.files:
      index, name = key.split("/")
      batches[int(index)][name] = arrays[key]
    recorded = [batches[i] for i in sorted(batches)]
    if len(recorded) < count or recorded[0]["input_ids"].shape[0] < batch_size:
      raise SystemExit(f"{path} holds {len(recorded)} batches of "
                       f"{recorded[0]['input_ids'].shape[0]}; {count} of {batch_size} "
                       "are needed: record more")
    return [{k: v[:batch_size] for k, v in b.items()} for b in recorded[:count]]


def use_recordings(directory: str) -> Recordings:
  """The recordings of `directory`, and pretraining set to read them where the text stack
  is absent: its vocabulary is the recorded facts (pretrain.build_vocabulary) and no
  corpus is checked (pretrain.validate_data: the batches are the recorded ones)."""
  recordings = Recordings(directory)
  pretrain.build_vocabulary = recordings.vocabulary
  pretrain.validate_data = lambda config: None
  return recordings


# --- rows, profile ----------------------------------------------------------------------
def rows(plan, dropouts, kernels, with_torch: bool, take_batches) -> list[dict]:
  """The accelerator rows of each plan item, dropout and kernel (a failing row is printed
  and left out), after the attention kernels' checks on a GPU."""
  if jax.default_backend() == "gpu":
    attention_checks.check_fused_attention()
    if set(kernels) != {"xla"}:
      try:  # the kernel's first compile on a GPU: report a failure, keep the rows
        attention_checks.check_flash_attention()
      except Exception:  # pylint: disable=broad-except
        traceback.print_exc()
  table = []
  for (size, length, batch), dropout, kernel in itertools.product(plan, dropouts, kernels):
    start = time.perf_counter()
    try:  # one failing row (memory, say, or the kernel's compile) must not lose others
      table += accelerator.accelerator_rows([size], [length], batch, STEPS, with_torch,
                                            [dropout], [kernel], take_batches=take_batches)
    except Exception:  # pylint: disable=broad-except
      traceback.print_exc()
    print(f"  ({time.perf_counter() - start:.0f} s)", flush=True)
  print("\n" + report.table("accelerator", table), flush=True)
  return table


def kernel_times(trace_path: str, steps: int, top: int = 40) -> list[dict]:
  """The GPU's busy time per step, by kernel, from a perfetto trace of `steps` steps
  (printed; returned as rows of the `top` kernels)."""
  events = op_profile.trace_events(trace_path)
  process = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
  kernels = [e for e in events if e.get("ph") == "X" and "GPU" in process.get(e["pid"], "")]
  if not kernels:
    print("no GPU kernels in the trace")
    return []
  totals = collections.Counter()
  for e in kernels:
    totals[e["name"][:100]] += e["dur"]
  busy = sum(totals.values())
  print(f"\nGPU busy {busy / 1e3 / steps:.1f} ms per step, {len(totals)} kernels:")
  for name, duration in totals.most_common(top):
    print(f"  {duration / 1e3 / steps:8.2f} ms  {100 * duration / busy:5.1f}%  {name}")
  return [{"kernel": name, "ms_per_step": duration / 1e3 / steps,
           "share": duration / busy} for name, duration in totals.most_common(top)]


def profile(plan, dropouts, kernels, trace_out: str | None, take_batches) -> list[dict]:
  """Traces and sums by kernel the steps of each plan item (rows of every kernel's time,
  named by the item)."""
  found = []
  for size, length, batch in plan:
    for dropout, kernel in itertools.product(dropouts, kernels):
      config = accelerator.accelerator_config(size, length, batch, dropout, kernel)
      stepper, _, cost = train_steps.encoderx_stepper(config, take_batches(config, 8))
      times = timing.time_steps(stepper.run_step, accelerator.ACCELERATOR_WARMUP_STEPS,
                                STEPS)
      print(f"\n{size} @{length}, attention dropout {config.model.attention.dropout:g}, "
            f"{kernel} kernel (prng {jax.config.jax_default_prng_impl}): compile "
            f"{cost.compile_seconds:.0f} s, step median "
            f"{1e3 * statistics.median(times):.1f} ms", flush=True)
      trace_dir = tempfile.mkdtemp(prefix="encoderx_trace_")  # one trace in it
      traced = 5
      with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
        for index in range(traced):
          stepper.run_step(index)
      (path,) = glob.glob(f"{trace_dir}/**/perfetto_trace.json.gz", recursive=True)
      if trace_out:
        os.makedirs(trace_out, exist_ok=True)
        shutil.copy(path, os.path.join(trace_out,
                                       f"{size}_{length}_{dropout}_{kernel}.json.gz"))
      item = f"{size} @{length}, attention dropout {config.model.attention.dropout:g}"
      found += [{"item": item, **row} for row in kernel_times(path, traced)]
  return found


# --- all --------------------------------------------------------------------------------
def first_item_dropouts(item) -> list[float | None]:
  """`all`'s attention dropouts for its first plan item: the config's and 0, or the
  config's alone where it is 0 already (ModernBERT's), not the same row twice."""
  if accelerator.accelerator_config(*item).model.attention.dropout == 0:
    return [None]
  return [None, 0.0]


def run_all(plan, out: str, budget_s: float, take_batches, with_torch: bool = True) -> None:
  """The rows, the profile and the contraction comparison (see the module doc) of `plan`
  (its first item has both dropouts where its config has one, the profile and the
  contraction), each part started only while the budget lasts; OUT/gpu_bench.json after
  each part."""
  start, tables, rows_found = time.perf_counter(), {}, []
  os.makedirs(out, exist_ok=True)
  warmup = accelerator.ACCELERATOR_WARMUP_STEPS

  def save():
    kind = jax.devices()[0].device_kind
    record_ = report.record("accelerator", rows_found, "", [], kind,
                            accelerator.published_peak(kind), tables)
    record_["command"] = " ".join(["python launch/gpu_bench.py", *sys.argv[1:]])
    report.write_json(os.path.join(out, "gpu_bench.json"), record_)

  def contraction():
    size, length, batch = plan[0]
    config = accelerator.accelerator_config(size, length, batch)
    tables["kernel_gradient_cost"] = [costs.kernel_gradient_row(
        f"{size} @{length}", config, take_batches(config, 1 + warmup + STEPS), STEPS,
        warmup)]

  parts = [("first item's rows", lambda: rows_found.extend(
               rows(plan[:1], first_item_dropouts(plan[0]), ["auto"], with_torch,
                    take_batches))),
           ("the other items' rows", lambda: rows_found.extend(
               rows(plan[1:], [None], ["auto"], with_torch, take_batches))),
           # The profile before the contraction: under JAX_COMPILATION_CACHE_DIR it reuses
           # the rows' compilation, where the contraction compiles two new steps.
           ("profile", lambda: tables.__setitem__("gpu_kernels", profile(
               plan[:1], [None], ["auto"], os.path.join(out, "traces"), take_batches))),
           ("contraction", contraction)]
  for name, part in parts:
    elapsed = time.perf_counter() - start
    if elapsed > budget_s:
      print(f"\n{name}: skipped, {elapsed:.0f} s of the {budget_s:.0f} s budget spent",
            flush=True)
      continue
    print(f"\n== {name} ({elapsed:.0f} s in)", flush=True)
    try:
      part()
    except Exception:  # pylint: disable=broad-except
      traceback.print_exc()
    save()
  print(f"\nall: {time.perf_counter() - start:.0f} s; wrote {out}/gpu_bench.json", flush=True)


# --- the command line -------------------------------------------------------------------
def parse_plan(plan: str, batch_size: int) -> list[tuple[str, int, int]]:
  """'size@length[:batch],...' -> [(size, length, batch)], `batch_size` where an item
  names none."""
  items = []
  for item in plan.split(","):
    size, length = item.split("@")
    length, _, batch = length.partition(":")
    items.append((size, int(length), int(batch) if batch else batch_size))
  return items


def parse_args(argv=None):
  parser = argparse.ArgumentParser(prog="launch/gpu_bench.py",
                                   description=__doc__.split("\n", 1)[0])
  parser.add_argument("mode", choices=("record", "all", "rows", "profile", "tune"))
  parser.add_argument("directory", nargs="?",
                      help="the recordings (record, all, rows, profile; not tune)")
  parser.add_argument("plan", nargs="?", default=ALL_PLAN,
                      help="size@length[:batch], comma-separated (record, rows, profile)")
  parser.add_argument("--batch_size", type=int, default=32,
                      help="the batch of plan items that name none")
  parser.add_argument("--out", default=None, help="all: where the JSON and traces go")
  parser.add_argument("--budget_s", type=float, default=480,
                      help="all: no part starts after this many seconds")
  parser.add_argument("--dropouts", default="0,config",
                      help="attention dropouts: numbers, or 'config' for the config's")
  parser.add_argument("--kernels", default="auto",
                      help="model.attention.kernel of each row: auto (on GPU the Pallas "
                      "kernel with attention dropout, cuDNN's without), xla, pallas")
  parser.add_argument("--skip_torch", action="store_true")
  parser.add_argument("--trace_out", default=None, help="profile: copy the traces here")
  parser.add_argument("--shape", default="32,512,16,64",
                      help="tune: the heads' batch,length,heads,head_dim")
  args = parser.parse_args(argv)
  if args.mode != "tune" and args.directory is None:
    parser.error(f"{args.mode} needs the recordings' directory")
  if args.mode == "all" and not args.out:
    parser.error("all needs --out, where its JSON and traces go")
  try:
    args.plan = parse_plan(args.plan, args.batch_size)
  except ValueError:
    parser.error(f"plan: size@length[:batch], comma-separated; got {args.plan!r}")
  args.dropouts = [None if d == "config" else float(d) for d in args.dropouts.split(",")]
  args.kernels = args.kernels.split(",")
  args.shape = tuple(int(n) for n in args.shape.split(","))
  if len(args.shape) != 4:
    parser.error(f"--shape: batch,length,heads,head_dim; got {args.shape}")
  return args


def main(argv=None) -> None:
  args = parse_args(argv)
  if args.mode == "record":
    record(args.directory, args.plan)
    return
  if args.mode == "tune":
    attention_checks.tune(args.shape)
    return
  take_batches = use_recordings(args.directory).batches
  print(f"jax {jax.__version__}, {jax.devices()}", flush=True)
  if args.mode == "all":
    run_all(args.plan, args.out, args.budget_s, take_batches, not args.skip_torch)
  elif args.mode == "rows":
    rows(args.plan, args.dropouts, args.kernels, not args.skip_torch, take_batches)
  else:
    profile(args.plan, args.dropouts, args.kernels, args.trace_out, take_batches)

"""Where a bench model's train step spends its time on CPU, by XLA op.

    python -m encoderx.tools.speed.op_profile --model=modernbert_tiny [--batch_size=32]
        [--steps=5] [--top=25] [--trace_out=DIR]

Traces `--steps` steps of the bench's encoderx step (bench_models' config and batches,
train_steps' jitted step) with jax.profiler, XLA:CPU's per-op trace events turned on
(`--xla_cpu_enable_xprof_traceme`), and prints per step:
- the op time by kind: an op's name without its number (`ynn_fusion`: matmuls and some
  reductions that XLA hands to YNNPACK; `copy_bitcast_fusion`, `transpose_copy_fusion`:
  copies and transposes; the other `*_fusion`s elementwise work);
- how many ops run at once over the step. XLA:CPU's runtime runs independent ops side by
  side, each on part of the machine's threads, where PyTorch runs one op at a time on all
  of them: the time with one op running is where a single-threaded op leaves cores idle.

Op times are the events' wall times, so two ops that share the cores each count their
whole span. GPU steps: `launch/gpu_bench.py profile` sums the device's kernels instead.
"""
from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import re
import statistics
import tempfile

from absl import app, flags

FLAGS = flags.FLAGS
TRACE_FLAG = "--xla_cpu_enable_xprof_traceme=true"


def trace_events(trace_path: str) -> list[dict]:
  """The events of a jax.profiler perfetto trace (perfetto_trace.json.gz)."""
  with gzip.open(trace_path) as f:
    events = json.load(f)
  return events["traceEvents"] if isinstance(events, dict) else events


def op_events(trace_path: str) -> list[tuple[float, float, str]]:
  """(start, end, HLO op name) in microseconds of each XLA op event of a perfetto trace."""
  return [(e["ts"], e["ts"] + e["dur"], e["args"]["hlo_op"]) for e in trace_events(trace_path)
          if e.get("ph") == "X" and "hlo_op" in e.get("args", {})]


def kind(op_name: str) -> str:
  """`ynn_fusion.12` -> `ynn_fusion`: the op's kind, its numbered instances together."""
  return re.sub(r"(\.\d+)+$", "", op_name)


def time_by_kind(events) -> collections.Counter:
  """Microseconds of op time by kind."""
  totals = collections.Counter()
  for start, end, name in events:
    totals[kind(name)] += end - start
  return totals


def concurrency(events) -> dict[int, float]:
  """Microseconds of the traced span with 0, 1 and 2 or more ops running (key 2)."""
  edges = sorted([(start, 1) for start, _, _ in events] + [(end, -1) for _, end, _ in events])
  spans, running, last = collections.Counter({0: 0.0, 1: 0.0, 2: 0.0}), 0, edges[0][0]
  for time, change in edges:
    spans[min(running, 2)] += time - last
    running, last = running + change, time
  return dict(spans)


def report(events, steps: int, top: int) -> dict:
  """Prints and returns the per-step op time by kind and the concurrency of `events`."""
  totals, spans = time_by_kind(events), concurrency(events)
  busy, span = sum(totals.values()), sum(spans.values())
  print(f"op time {busy / 1e3 / steps:.1f} ms per step over a span of "
        f"{span / 1e3 / steps:.1f} ms; ops running at once: "
        + ", ".join(f"{'2+' if n == 2 else n}: {100 * t / span:.0f}%"
                    for n, t in sorted(spans.items())))
  for name, duration in totals.most_common(top):
    print(f"  {duration / 1e3 / steps:8.2f} ms  {100 * duration / busy:5.1f}%  {name}")
  return {"ms_per_step": {name: d / 1e3 / steps for name, d in totals.most_common()},
          "running_at_once": {n: t / span for n, t in spans.items()}}


def profile(model: str, batch_size: int, steps: int, top: int,
            trace_out: str | None = None) -> dict:
  """Times then traces `steps` steps of the bench model (see the module doc)."""
  if TRACE_FLAG not in os.environ.get("XLA_FLAGS", ""):
    # Read when the CPU client starts: before the first array.
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {TRACE_FLAG}".strip()
  # pylint: disable=g-import-not-at-top
  import jax
  from encoderx.data import pipeline
  from encoderx.tools.speed import bench_models, timing, train_steps
  # pylint: enable=g-import-not-at-top
  config = bench_models.build_config(model, batch_size)
  batches = pipeline.take_batches(bench_models.pretraining_task(config), "train",
                                  config.data.seq_length, batch_size, 2)
  stepper, _, cost = train_steps.encoderx_stepper(config, batches)
  times = timing.time_steps(stepper.run_step, 1, max(steps, 3))
  print(f"{model}, batch {batch_size} x {config.data.seq_length}: compile "
        f"{cost.compile_seconds:.1f} s, step median {1e3 * statistics.median(times):.1f} ms")
  trace_dir = trace_out or tempfile.mkdtemp(prefix="encoderx_trace_")
  with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
    for index in range(steps):
      stepper.run_step(index)
  path = max(glob.glob(f"{trace_dir}/**/perfetto_trace.json.gz", recursive=True),
             key=os.path.getmtime)
  events = op_events(path)
  if not events:
    raise RuntimeError(f"no XLA op events in {path}: XLA_FLAGS must hold {TRACE_FLAG} "
                       "before jax starts its CPU client")
  return {"model": model, "batch_size": batch_size,
          "step_ms": 1e3 * statistics.median(times), **report(events, steps, top)}


def main(argv) -> None:
  del argv
  profile(FLAGS.model, FLAGS.batch_size, FLAGS.steps, FLAGS.top, FLAGS.trace_out)


if __name__ == "__main__":
  flags.DEFINE_string("model", "modernbert_tiny", "a bench model (bench_models.MODELS)")
  flags.DEFINE_integer("batch_size", 32, "sequences a step")
  flags.DEFINE_integer("steps", 5, "steps traced (their op times averaged)")
  flags.DEFINE_integer("top", 25, "op kinds printed")
  flags.DEFINE_string("trace_out", None, "keep the trace here (default: a temporary folder)")
  app.run(main)

"""Training and held-out loss curves of runs, from their TensorBoard logs, overlaid.

    python -m encoderx.tools.figures.plot RUN_DIR [RUN_DIR ...] --output=curves.png \
        [--metric=mlm_loss] [--consecutive]

A run directory is a `python -m encoderx.train --workdir` (its logs are in
RUN_DIR/tensorboard). Each run is drawn in its own colour: the training metric (as
logged every train.log_every steps) as a line, the held-out one (`eval/<metric>`, at
every evaluation) as a dashed line with markers. `--metric` is a metric both write
(mlm_loss by default; `loss` is the training objective, which evaluation does not write).
`--consecutive` draws the runs one after another instead (the phases of a recipe, each
run from the last's checkpoint: docs/guides/recipes.md), each run's steps after the
previous run's last, a dotted line where a phase starts.
Needs matplotlib (`pip install matplotlib`).
"""
from __future__ import annotations

import argparse
import io
import os
import sys

import numpy as np

from encoderx import errors
from encoderx import files as files_lib

EVAL_PREFIX = "eval/"


class PlotError(errors.UserError, ValueError):
  """A run directory without logs, or without the metric asked for."""


def read_scalars(run_dir: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """{tag: (steps, values)} of every scalar in RUN_DIR/tensorboard, by step (a resumed
  run's later writes of a step win)."""
  # pylint: disable=g-import-not-at-top
  from tensorboard.backend.event_processing import event_accumulator
  from tensorboard.util import tensor_util
  directory = str(files_lib.path(run_dir) / "tensorboard")  # TensorBoard reads gs://
  if not files_lib.path(directory).is_dir():
    raise PlotError(f"{run_dir}: no tensorboard/ directory; is it a training run's "
                    "--workdir?")
  accumulator = event_accumulator.EventAccumulator(
      directory, size_guidance={event_accumulator.TENSORS: 0,
                                event_accumulator.SCALARS: 0})
  accumulator.Reload()
  scalars: dict[str, dict[int, float]] = {}
  tags = accumulator.Tags()
  for tag in tags.get(event_accumulator.TENSORS, []):  # clu / tf.summary write tensors
    for event in accumulator.Tensors(tag):
      value = tensor_util.make_ndarray(event.tensor_proto)
      if value.size == 1:
        scalars.setdefault(tag, {})[event.step] = float(value)
  for tag in tags.get(event_accumulator.SCALARS, []):
    for event in accumulator.Scalars(tag):
      scalars.setdefault(tag, {})[event.step] = float(event.value)
  return {tag: (np.array(sorted(by_step)), np.array([by_step[s] for s in sorted(by_step)]))
          for tag, by_step in scalars.items()}


def curves(run_dir: str, metric: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """{'train': (steps, values), 'held-out': ...} of `metric` in a run (either may be
  absent, not both)."""
  scalars = read_scalars(run_dir)
  found = {name: scalars[tag] for name, tag in (("train", metric),
                                                ("held-out", EVAL_PREFIX + metric))
           if tag in scalars}
  if not found:
    known = ", ".join(sorted(scalars)) or "none"
    raise PlotError(f"{run_dir}: no metric {metric!r} in its logs (they have: {known}).")
  return found


def plot(run_dirs: list[str], output: str, metric: str = "mlm_loss",
         labels: list[str] | None = None, title: str | None = None,
         consecutive: bool = False):
  """Draws the runs' curves of `metric` into `output` (PNG, SVG, ... by its extension),
  overlaid or, `consecutive`, one after another; returns the matplotlib figure."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  labels = labels or [os.path.basename(os.path.normpath(d)) for d in run_dirs]
  runs = [curves(run_dir, metric) for run_dir in run_dirs]  # every run read before drawing
  figure, axes = plt.subplots(figsize=(8, 5))
  offset = 0
  for index, (found, label) in enumerate(zip(runs, labels)):
    colour = f"C{index % 10}"
    if consecutive and index:
      axes.axvline(offset, color="grey", linestyle=":", linewidth=1)
    for name, (steps, values) in found.items():
      held_out = name == "held-out"
      axes.plot(steps + offset, values, color=colour, linestyle="--" if held_out else "-",
                marker="o" if held_out else None, label=f"{label} ({name})")
    if consecutive:
      offset += max(int(steps[-1]) for steps, _ in found.values())
  axes.set_xlabel("step (the runs one after another)" if consecutive else "step")
  axes.set_ylabel(metric)
  axes.set_title(title or metric)
  axes.grid(alpha=0.3)
  axes.legend()
  figure.tight_layout()
  image = io.BytesIO()  # written through encoderx.files: the output may be gs://
  figure.savefig(image, format=os.path.splitext(output)[1][1:] or "png", dpi=120)
  files_lib.write_atomically(output, image.getvalue())
  plt.close(figure)
  return figure


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m encoderx.tools.figures.plot",
                                   description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
  parser.add_argument("--output", required=True, help="image file to write (.png, .svg)")
  parser.add_argument("--metric", default="mlm_loss")
  parser.add_argument("--labels", default="",
                      help="comma-separated legend names, one per run (default: the "
                           "directory names)")
  parser.add_argument("--title", default=None)
  parser.add_argument("--consecutive", action="store_true",
                      help="draw the runs one after another (a recipe's phases)")
  args = parser.parse_args(argv)
  labels = args.labels.split(",") if args.labels else None
  if labels and len(labels) != len(args.run_dirs):
    parser.error(f"--labels names {len(labels)} runs, {len(args.run_dirs)} given.")
  try:
    plot(args.run_dirs, args.output, args.metric, labels, args.title, args.consecutive)
  except PlotError as error:
    print(f"error: {error}", file=sys.stderr)
    return 2
  print(f"wrote {args.output}")
  return 0


if __name__ == "__main__":
  sys.exit(main())

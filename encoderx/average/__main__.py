"""The average command: the mean of a run's last checkpoints, or of chosen steps, or of
several runs' latest, written as a run (average/averaging.py).

    python -m encoderx.average --runs=RUN [--last=K | --steps=a,b,c] --output=DIR
    python -m encoderx.average --runs=RUN_A,RUN_B,... --output=DIR   (each run's latest)
"""
from __future__ import annotations

from absl import flags

from encoderx import average, cli

FLAGS = flags.FLAGS


def main(argv) -> None:
  del argv
  steps = tuple(int(s) for s in FLAGS.steps.split(",") if s.strip()) if FLAGS.steps else ()
  written, checkpoints = average.average([r for r in FLAGS.runs.split(",") if r.strip()],
                                         FLAGS.output, FLAGS.last, steps)
  print(f"averaged {len(checkpoints)} checkpoints ("
        + ", ".join(f"{run} step {step}" for run, step in checkpoints)
        + f") into {written}")


def define_flags() -> None:
  flags.DEFINE_string("runs", None, "Work directories of runs, comma-separated.")
  flags.DEFINE_integer("last", 0, "Average each run's newest K checkpoints (default 1).")
  flags.DEFINE_string("steps", "", "Average these steps of each run, comma-separated.")
  flags.DEFINE_string("output", None, "The new run directory to write (must not exist, "
                      "or be empty).")
  flags.mark_flags_as_required(["runs", "output"])


if __name__ == "__main__":
  define_flags()
  cli.run(main)

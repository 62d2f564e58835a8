"""The export command: a run as a Hugging Face model directory, or a numpy .npz of its
parameters (export/writer.py).

    python -m encoderx.export --workdir=RUN --output=DIR [--step=N] [--head=HEAD]
    python -m encoderx.export --workdir=RUN --output=FILE.npz --format=npz [--step=N]

HEAD: a class of the run's family (encoderx/hf/<family>.py), e.g. pretraining, mlm,
sequence_classification or base (the bare encoder); by default the class that holds the
run's method's parameters. See encoderx/export/writer.py.
"""
from __future__ import annotations

from absl import flags

from encoderx import cli
from encoderx.export import writer

FLAGS = flags.FLAGS


def main(argv) -> None:
  del argv
  if FLAGS.format == "npz":
    if FLAGS.head:
      raise writer.ExportError("--head applies to --format=hf only.")
    exported = writer.export_npz(FLAGS.workdir, FLAGS.output, FLAGS.step)
  else:
    exported = writer.export_hf(FLAGS.workdir, FLAGS.output, FLAGS.step, FLAGS.head or None)
  print(exported.summary())


def define_flags() -> None:
  flags.DEFINE_string("workdir", None, "The run's work directory.")
  flags.DEFINE_string("output", None, "The directory (--format=hf) or .npz file to write; "
                      "must not exist yet (or be an empty directory).")
  flags.DEFINE_integer("step", None, "The checkpoint step to export (default: the latest).")
  flags.DEFINE_string("head", "", "The Hugging Face class to write, by head name "
                      "(pretraining, mlm, sequence_classification, base, ...); default: "
                      "the one holding the run's method's parameters.")
  flags.DEFINE_enum("format", "hf", ["hf", "npz"], "hf: a Hugging Face model directory; "
                    "npz: numpy arrays keyed by parameter path.")
  flags.mark_flags_as_required(["workdir", "output"])


if __name__ == "__main__":
  define_flags()
  cli.run(main)

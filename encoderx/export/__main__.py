"""Exports a run: a Hugging Face model directory, or a numpy .npz of its parameters.

    python -m encoderx.export --workdir=RUN --output=DIR [--step=N] [--head=HEAD]
    python -m encoderx.export --workdir=RUN --output=FILE.npz --format=npz [--step=N]

HEAD: a class of the run's family (encoderx/export/hf.py), e.g. pretraining, mlm,
sequence_classification or base (the bare encoder); by default the class that holds the
run's method's parameters. See encoderx/export/writer.py.
"""
from __future__ import annotations

import sys


def main(argv) -> None:
  del argv
  from absl import flags  # pylint: disable=g-import-not-at-top
  from encoderx import train  # pylint: disable=g-import-not-at-top
  from encoderx.export import hf, writer  # pylint: disable=g-import-not-at-top
  flags_ = flags.FLAGS
  try:
    if flags_.format == "npz":
      if flags_.head:
        raise writer.ExportError("--head applies to --format=hf only.")
      exported = writer.export_npz(flags_.workdir, flags_.output, flags_.step)
    else:
      exported = writer.export_hf(flags_.workdir, flags_.output, flags_.step,
                                    flags_.head or None)
  except (writer.ExportError, hf.ConversionError) + train.USER_ERRORS as error:
    print(f"encoderx: error: {error}", file=sys.stderr)
    sys.exit(2)
  print(exported.summary())


def cli() -> None:
  from absl import app, flags  # pylint: disable=g-import-not-at-top
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
  app.run(main)


if __name__ == "__main__":
  cli()

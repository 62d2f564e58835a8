"""The export command: a run as a Hugging Face model directory, or a numpy .npz of its
parameters (export/writer.py).

    python -m encoderx.export --workdir=RUN --output=DIR [--step=N] [--head=HEAD]
    python -m encoderx.export --workdir=RUN --output=FILE.npz --format=npz [--step=N]
    python -m encoderx.export --workdir=RUN --output=DIR --format=sentence-transformers
    python -m encoderx.export --workdir=RUN --output=DIR --format=cross-encoder

HEAD: a class of the run's family (encoderx/hf/<family>.py), e.g. pretraining, mlm,
sequence_classification or base (the bare encoder); by default the class that holds the
run's method's parameters. See encoderx/export/writer.py. sentence-transformers: an
embedding run (simcse, contrastive) as a SentenceTransformer directory; cross-encoder: a
one-score run (similarity) as a CrossEncoder directory (encoderx/export/interchange.py).
"""
from __future__ import annotations

from absl import flags

from encoderx import cli
from encoderx.export import interchange, writer

FLAGS = flags.FLAGS


def main(argv) -> None:
  del argv
  if FLAGS.format != "hf" and FLAGS.head:
    raise writer.ExportError("--head applies to --format=hf only.")
  if FLAGS.format == "npz":
    exported = writer.export_npz(FLAGS.workdir, FLAGS.output, FLAGS.step)
  elif FLAGS.format == "sentence-transformers":
    exported = interchange.export_sentence_transformers(FLAGS.workdir, FLAGS.output,
                                                        FLAGS.step)
  elif FLAGS.format == "cross-encoder":
    exported = interchange.export_cross_encoder(FLAGS.workdir, FLAGS.output, FLAGS.step)
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
  flags.DEFINE_enum("format", "hf", ["hf", "npz", "sentence-transformers", "cross-encoder"],
                    "hf: a Hugging Face model directory; npz: numpy arrays keyed by "
                    "parameter path; sentence-transformers: an embedding run's "
                    "SentenceTransformer directory; cross-encoder: a one-score run's "
                    "CrossEncoder directory.")
  flags.mark_flags_as_required(["workdir", "output"])


if __name__ == "__main__":
  define_flags()
  cli.run(main)

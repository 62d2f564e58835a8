"""The preprocess command: a config's pretraining examples written to files once, then
streamed by runs (`--config.data.preprocessed=DIR`; preprocess/writer.py).

    python -m encoderx.preprocess --config=configs/bert.py:base --output=DIR \
        [--config.data.files='corpus/*.txt' | --config.data.tfds_name=NAME:VERSION] \
        [--copies=1] [--workers=<CPU cores>] [--processes=1]

An interrupted run is continued by the same command.
"""
from __future__ import annotations

import time

from absl import flags

from encoderx import cli, preprocess

FLAGS = flags.FLAGS


def main(argv) -> None:
  del argv
  started = time.perf_counter()
  manifest = preprocess.run(cli.config_from_flags(FLAGS), FLAGS.output,
                            copies=FLAGS.copies, workers=FLAGS.workers,
                            processes=FLAGS.processes)
  print(summary(manifest, FLAGS.output, time.perf_counter() - started))


def summary(manifest: dict, output: str, seconds: float) -> str:
  lines = [f"wrote {output} in {seconds:.0f} s:"]
  for seq_length, length in manifest["lengths"].items():
    for name, split in length["splits"].items():
      files = sum(len(copy) for copy in split["copies"])
      lines.append(f"  {name} at length {seq_length}: {split['examples']:,} examples in "
                   f"{files} file(s), {len(split['copies'])} cop"
                   f"{'y' if len(split['copies']) == 1 else 'ies'}")
  lines.append(f"train on it with --config.data.preprocessed={output}")
  return "\n".join(lines)


def define_flags() -> None:
  cli.define_config_flags()
  flags.DEFINE_string("output", None, "Directory to write the examples and manifest to.")
  flags.DEFINE_integer("copies", 1, "Copies of the training examples, each built with "
                       "its own seeds (epoch e reads copy e % copies).")
  flags.DEFINE_integer("workers", None, "Processes writing files in parallel (default: "
                       "one per CPU core).")
  flags.DEFINE_integer("processes", 1, "XLNet (method xlnet): the processes of the run "
                       "that will train on the examples; each reads train.batch_size / "
                       "processes rows.")
  flags.mark_flags_as_required(["output"])


if __name__ == "__main__":
  define_flags()
  cli.run(main)

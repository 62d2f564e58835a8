"""Tokens a fine-tuning run computes, with and without length buckets: counted from the
pipeline's training batches, nothing timed.

    python -m encoderx.tools.data.finetune_padding --init_from=hf:MODEL_DIR \
        --data=../shared/corpora/rotten_tomatoes [--variant=classify] [--batches=100] \
        [--buckets=16,24,32,40,48,56]

The first --batches training batches of configs/finetune.py:VARIANT,data=DIR (its length
and batch size, --init_from's vocabulary) are counted four ways: every row at
data.seq_length; cut to --buckets (finetune.length_buckets); padded to each batch's longest
(Hugging Face's DataCollatorWithPadding); and drawn grouped by length
(finetune.group_by_length) and cut. Printed: the tokens computed and the share of padding.
"""
from __future__ import annotations

from absl import app, flags

from encoderx import configs, initialize
from encoderx.data import buckets, pipeline
from encoderx.methods import registry

FLAGS = flags.FLAGS


def _batches(task, config, count: int, group_lengths=()) -> list:
  iterator = pipeline.batch_iterator(task, "train", config.data.seq_length,
                                     config.train.batch_size, seed=config.train.seed,
                                     group_lengths=group_lengths)
  try:
    return [next(iterator) for _ in range(count)]
  finally:
    iterator.close()


def main(argv) -> None:
  del argv
  config = configs.get(f"finetune:{FLAGS.variant},data={FLAGS.data}")
  config.init_from = FLAGS.init_from
  config = initialize.resolve_config(config)
  task, seq_length = registry.build(config).task(), config.data.seq_length
  lengths = tuple(int(b) for b in FLAGS.buckets.split(","))
  plain = _batches(task, config, FLAGS.batches)
  grouped = _batches(task, config, FLAGS.batches, lengths)
  rows = len(plain[0]["input_ids"])
  ways = (("every row at data.seq_length", plain, lambda b: seq_length),
          (f"cut to length_buckets={lengths}", plain,
           lambda b: buckets.bucket_length(b, lengths, seq_length)),
          ("each batch padded to its longest (Hugging Face)", plain, buckets.real_length),
          ("grouped by length and cut", grouped,
           lambda b: buckets.bucket_length(b, lengths, seq_length)))
  print(f"{FLAGS.batches} batches of {rows} at length {seq_length}, "
        f"finetune:{FLAGS.variant} on {FLAGS.data}")
  for name, chosen, length in ways:
    real = sum(int((b["segment_ids"] > 0).sum()) for b in chosen)
    computed = sum(rows * length(b) for b in chosen)
    print(f"{name}: {computed:,} tokens computed, {real:,} real, padding "
          f"{1 - real / computed:.1%}")


if __name__ == "__main__":
  flags.DEFINE_string("init_from", None, "hf:DIR or a run: the vocabulary.")
  flags.DEFINE_string("data", None, "The variant's data directory (train.tsv, dev.tsv).")
  flags.DEFINE_string("variant", "classify", "A variant of configs/finetune.py.")
  flags.DEFINE_integer("batches", 100, "Training batches counted.")
  flags.DEFINE_string("buckets", "16,24,32,40,48,56", "finetune.length_buckets.")
  flags.mark_flags_as_required(["init_from", "data"])
  app.run(main)

"""The padding of a config's rows over one whole epoch of its training documents, with
each packing of builder 'full_sentences' (data.packing: greedy, best_fit), at several
lengths. The default config reads the bundled corpus.

    python -m encoderx.tools.data.padding [--config=modernbert:tiny] [--lengths=128,512,1024]
"""
from __future__ import annotations

import argparse

import numpy as np

from encoderx import configs
from encoderx.data import packing, pipeline, tasks


def epoch_padding(config) -> tuple[float, int]:
  """(share of padding positions, rows) of one unshuffled epoch of the train split."""
  task = tasks.register_pretraining_task(config)
  dataset = pipeline.build_dataset(task, "train", config.data.seq_length, shuffle=False,
                                   seed=0, shard_info=None)
  rows = [{"segment_ids": np.asarray(example["segment_ids"])}
          for example in dataset.as_numpy_iterator()]
  return packing.padding_fraction(rows), len(rows)


def padding_table(spec: str, lengths) -> list[dict]:
  """{"packing", "padding_at_<length>", "rows_at_<length>"} per packing of `spec`'s
  config (builder full_sentences)."""
  table = []
  for method in packing.PACKINGS:
    row = {"packing": method}
    for length in lengths:
      config = configs.get(spec)
      config.data.builder, config.data.packing = "full_sentences", method
      config.data.seq_length = length
      row[f"padding_at_{length}"], row[f"rows_at_{length}"] = epoch_padding(config)
    table.append(row)
  return table


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--config", default="modernbert:tiny",
                      help="family:variant of configs/ (its data and vocabulary)")
  parser.add_argument("--lengths", default="128,512,1024")
  args = parser.parse_args(argv)
  lengths = [int(length) for length in args.lengths.split(",")]
  print(f"padding of {args.config}'s rows over one epoch of its training documents:")
  for row in padding_table(args.config, lengths):
    print(f"  {row['packing']:9s}" + "".join(
        f"  at {length}: {row[f'padding_at_{length}']:6.2%} of {row[f'rows_at_{length}']} rows"
        for length in lengths))


if __name__ == "__main__":
  main()

"""Fine-tuning batches cut to a few bucket lengths (finetune.length_buckets).

    length = buckets.bucket_length(batch, (16, 32, 64), seq_length=128)
    batch = buckets.trim(batch, length, seq_length=128)

A fine-tuning example is padded to data.seq_length, though most sentences are far
shorter. A batch is cut to the shortest bucket that holds its longest example (its real
tokens: `segment_ids` > 0, and the `*segment_ids` of SimCSE's other views), data.seq_length
when none does: padding that every position's attention mask already hides, so the loss
and the metrics are those of the uncut batch, with fewer padded tokens computed. Each
bucket is one compilation of the train step, as encoderx.embed's batches (embed.BUCKETS)
and Hugging Face's padding of each batch to its longest (DataCollatorWithPadding,
`pad_to_multiple_of`) do. The examples of a batch stay those the pipeline drew: resume and
the order are untouched.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def real_length(batch: dict[str, np.ndarray]) -> int:
  """The longest example's real tokens: the last position any `*segment_ids` [batch,
  length] marks, plus one (0 for a batch of padding rows)."""
  longest = 0
  for name, value in batch.items():
    if name.endswith("segment_ids"):
      columns = np.flatnonzero(np.any(np.asarray(value) > 0, axis=0))
      longest = max(longest, int(columns[-1]) + 1 if columns.size else 0)
  return longest


def bucket_length(batch: dict[str, np.ndarray], lengths: Sequence[int],
                  seq_length: int) -> int:
  """The shortest of `lengths` that holds the batch's longest example; `seq_length`
  if none does."""
  longest = real_length(batch)
  return next((length for length in sorted(lengths) if length >= longest), seq_length)


def trim(batch: dict[str, np.ndarray], length: int, seq_length: int) -> dict[str, np.ndarray]:
  """Every feature with a length axis ([batch, seq_length, ...]) cut to `length`; the
  others ([batch]: labels, weights, answer positions) as they are."""
  return {name: value[:, :length] if np.ndim(value) >= 2 and value.shape[1] == seq_length
          else value for name, value in batch.items()}


def cut(batch: dict[str, np.ndarray], lengths: Sequence[int],
        seq_length: int) -> dict[str, np.ndarray]:
  """`batch` trimmed to its bucket (unchanged when `lengths` is empty)."""
  if not lengths:
    return batch
  return trim(batch, bucket_length(batch, lengths, seq_length), seq_length)


def shapes(batch: dict[str, np.ndarray]) -> tuple:
  """The batch's features and their shapes: a batch of other shapes (another bucket)
  needs a train step compiled for it."""
  return tuple((name, np.shape(value)) for name, value in sorted(batch.items()))

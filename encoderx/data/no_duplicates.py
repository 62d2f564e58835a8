"""An epoch's order of training rows in which no batch holds a text twice, as
sentence-transformers' NoDuplicatesBatchSampler draws its batches
(sentence_transformers/base/sampler.py, NoDuplicatesBatchSampler._iter_one_pass).

With in-batch negatives a text that is twice in a batch (one sentence the positive of
two anchors, or one row's negative another's positive) is a false negative. The rows
are permuted by the epoch's seed and batches filled in that order; a row whose anchor,
positive or negative is already in the batch is deferred to a later batch, ahead of the
rows not yet read. Unlike sentence-transformers (whose pass drops the rows that no batch
took, then redraws rows already used), every row is in the order once: where the rows
left at the end of an epoch conflict with each other, a left row takes the place of a
row of a recent batch that the open batch can take (a swap), and the rows that still
fit in no batch (too few distinct texts) close the epoch, where the pipeline's batching
(drop_remainder) trains the full batches among them and drops the rest.
"""
from __future__ import annotations

import collections
from typing import Sequence

import numpy as np


# How many of the latest batches a row left at an epoch's end may be swapped into.
SWAP_SEARCH = 64


def batch_order(texts: Sequence[Sequence[str]], batch_size: int, seed: int) -> list[int]:
  """A permutation of range(len(texts)) whose consecutive blocks of batch_size rows
  hold no text twice where the rows allow it; texts[i]: row i's texts."""
  waiting = collections.deque(int(i) for i in np.random.default_rng(seed).permutation(
      len(texts)))
  batches: list[list[int]] = []
  while len(waiting) >= batch_size:
    batch, seen, deferred = [], set(), []
    while waiting and len(batch) < batch_size:
      row = waiting.popleft()
      if seen.isdisjoint(texts[row]):
        batch.append(row)
        seen.update(texts[row])
      else:
        deferred.append(row)
    for row in list(deferred):  # the epoch's last rows conflict: swap them earlier
      if len(batch) == batch_size:
        break
      freed = _swap_into_earlier(batches, row, seen, texts)
      if freed is not None:
        batch.append(freed)
        seen.update(texts[freed])
        deferred.remove(row)
    waiting.extendleft(reversed(deferred))  # deferred rows go first into the next batch
    if len(batch) < batch_size:  # no full batch without a duplicate is left
      waiting.extendleft(reversed(batch))
      break
    batches.append(batch)
  return [row for batch in batches for row in batch] + list(waiting)


def _swap_into_earlier(batches: list[list[int]], row: int, seen: set,
                       texts: Sequence[Sequence[str]]) -> int | None:
  """Puts `row` into one of the latest earlier batches in place of a row whose texts
  are not in `seen` (the open batch's) and returns that row; None where none is."""
  for batch in reversed(batches[-SWAP_SEARCH:]):
    for place, other in enumerate(batch):
      if not seen.isdisjoint(texts[other]):
        continue
      rest = {text for kept in batch if kept != other for text in texts[kept]}
      if rest.isdisjoint(texts[row]):
        batch[place] = row
        return other
  return None


def duplicated_batches(texts: Sequence[Sequence[str]], order: Sequence[int],
                       batch_size: int) -> int:
  """How many full batches of `order` hold a text twice."""
  count = 0
  for start in range(0, len(order) - batch_size + 1, batch_size):
    batch = [text for row in order[start:start + batch_size] for text in set(texts[row])]
    count += len(batch) != len(set(batch))
  return count

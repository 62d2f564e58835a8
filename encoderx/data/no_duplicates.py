"""An epoch's order of training rows in which no batch holds a text twice, as
sentence-transformers' NoDuplicatesBatchSampler draws its batches
(sentence_transformers/base/sampler.py, NoDuplicatesBatchSampler._iter_one_pass).

With in-batch negatives a text that is twice in a batch (one sentence the positive of
two anchors, or one row's negative another's positive) is a false negative. The rows
are permuted by the epoch's seed and batches filled in that order; a row whose anchor,
positive or negative is already in the batch is deferred to a later batch, ahead of the
rows not yet read. Unlike sentence-transformers (whose last, incomplete pass drops what
is left), every row is in the order once: the rows that no full batch could take without
a duplicate (too few distinct texts at the end of the epoch) close it, in their
permuted order, where the pipeline's batching (drop_remainder) trains the full batches
among them and drops the rest.
"""
from __future__ import annotations

import collections
from typing import Sequence

import numpy as np


def batch_order(texts: Sequence[Sequence[str]], batch_size: int, seed: int) -> list[int]:
  """A permutation of range(len(texts)) whose consecutive blocks of batch_size rows
  hold no text twice where the rows allow it; texts[i]: row i's texts."""
  waiting = collections.deque(int(i) for i in np.random.default_rng(seed).permutation(
      len(texts)))
  order: list[int] = []
  while len(waiting) >= batch_size:
    batch, seen, deferred = [], set(), []
    while waiting and len(batch) < batch_size:
      row = waiting.popleft()
      if seen.isdisjoint(texts[row]):
        batch.append(row)
        seen.update(texts[row])
      else:
        deferred.append(row)
    waiting.extendleft(reversed(deferred))  # deferred rows go first into the next batch
    if len(batch) < batch_size:  # no full batch without a duplicate is left
      waiting.extendleft(reversed(batch))
      break
    order += batch
  return order + list(waiting)


def duplicated_batches(texts: Sequence[Sequence[str]], order: Sequence[int],
                       batch_size: int) -> int:
  """How many full batches of `order` hold a text twice."""
  count = 0
  for start in range(0, len(order) - batch_size + 1, batch_size):
    batch = [text for row in order[start:start + batch_size] for text in set(texts[row])]
    count += len(batch) != len(set(batch))
  return count

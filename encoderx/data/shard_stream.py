"""Streaming a sharded split: each process reads its own shards, never the whole corpus,
with a position (Grain's iterator state) that restores the next batch in constant time.

    epoch e   the split's shards in an order drawn from (seed, e) (canonical order when
              unshuffled); process p of n takes every n-th shard from the p-th
    examples  OPEN_SHARDS shards open at once, one example from each in turn; when one
              ends the next in the order opens, and when all have ended epoch e + 1
              begins (a new shard order: epochs reshuffle by seed)
    shuffle   grain's WindowShuffleIterDataset: windows of `window` consecutive examples,
              each permuted with its own seed (the bounded buffer)
    batches   grain's batch, then a prefetch thread (ThreadPrefetchIterDataset)
    ordered   one open shard and no window (Tasks whose examples must stay in their
              order, XLNet's row streams: batch t holds every row's step t): a batch is
              consecutive examples of one shard, shards follow one another

A `Shard` opens its examples of one epoch from any example on: a file of preprocessed
examples seeks there (encoderx/data/example_files.py); a text file or a TFDS file run
through the Task's preprocessors re-reads that one file up to there
(encoderx/data/pipeline.py). The position is the epoch, the open shards with the examples
taken from each, and the window's start and offset, so restoring it costs one window and
at most OPEN_SHARDS shard openings, whatever the size of the corpus.
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Callable, Iterator

import grain
import numpy as np

from encoderx import errors

# Shards read at once: examples of consecutive batches come from several documents'
# files, as with BERT's run_pretraining.py (interleaving 4 input files per host).
OPEN_SHARDS = 4
PREFETCH_BATCHES = 2  # batches a background thread prepares ahead of the train step


class StreamError(errors.UserError, ValueError):
  """A sharded split that cannot be streamed as asked (e.g. fewer shards than processes)."""


@dataclasses.dataclass(frozen=True)
class Shard:
  """One shard of a split. `open(epoch, start)` -> its examples of that epoch from the
  `start`-th on, each {feature: array}."""
  name: str
  open: Callable[[int, int], Iterator[dict[str, np.ndarray]]]


class ShardedSource:
  """Mixin of seqio DataSources whose splits are streamed shard by shard (see
  encoderx/data/pipeline.py: stream_shards) instead of read as whole epochs."""


def shard_order(num_shards: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
  """The shards of `epoch` in reading order: a permutation drawn from (seed, epoch)."""
  if not shuffle:
    return np.arange(num_shards)
  return np.random.default_rng([seed, epoch]).permutation(num_shards)


def check_shard_count(num_shards: int, process_count: int) -> None:
  """Every process needs at least one shard of a split."""
  if num_shards < process_count:
    raise StreamError(
        f"the split has {num_shards} shard(s), fewer than the {process_count} processes "
        "reading it (each reads its own shards). Split the corpus into at least as many "
        "files as processes, or set data.process_split=rows (every process reads the "
        "whole stream and keeps its devices' rows of each batch).")


class _ShardStreamIterator(grain.DatasetIterator):
  """Endless examples of this process's shards, epoch after epoch (see module doc)."""

  def __init__(self, shards: list[Shard], seed: int, shuffle: bool, process_index: int,
               process_count: int, open_shards: int):
    super().__init__()
    check_shard_count(len(shards), process_count)
    self._shards, self._seed, self._shuffle = shards, seed, shuffle
    self._process_index, self._process_count = process_index, process_count
    self._open_shards = open_shards
    self._order_epoch, self._order = None, None
    self._epoch, self._next = 0, 0  # the next shard to open: its place in the order
    self._open = []  # [place in the order, examples taken] per open shard
    self._readers = {}  # place in the order -> iterator of the rest of its examples
    self._turn = 0  # which open shard gives the next example
    self._empty_epoch = True

  def _mine(self) -> np.ndarray:
    if self._order_epoch != self._epoch:
      order = shard_order(len(self._shards), self._seed, self._epoch, self._shuffle)
      self._order = order[self._process_index::self._process_count]
      self._order_epoch = self._epoch
    return self._order

  def _reader(self, place: int, taken: int):
    if place not in self._readers:
      shard = self._shards[int(self._mine()[place])]
      self._readers[place] = iter(shard.open(self._epoch, taken))
    return self._readers[place]

  def __next__(self) -> dict[str, np.ndarray]:
    while True:
      mine = self._mine()
      while len(self._open) < self._open_shards and self._next < len(mine):
        self._open.append([self._next, 0])
        self._next += 1
      if not self._open:  # the epoch is over
        if self._empty_epoch:
          raise StreamError(f"no shard of the split yields an example: "
                            f"{', '.join(s.name for s in self._shards[:3])} ...")
        self._epoch, self._next, self._turn, self._empty_epoch = self._epoch + 1, 0, 0, True
        continue
      self._turn %= len(self._open)
      place, taken = self._open[self._turn]
      example = next(self._reader(place, taken), None)
      if example is None:  # this shard is done; the next one takes its turn
        del self._open[self._turn]
        del self._readers[place]
        continue
      self._open[self._turn][1] += 1
      self._turn += 1
      self._empty_epoch = False
      return example

  def get_state(self) -> dict:
    return {"epoch": self._epoch, "next": self._next, "open": copy.deepcopy(self._open),
            "turn": self._turn, "empty_epoch": int(self._empty_epoch)}

  def set_state(self, state: dict) -> None:
    self._epoch, self._next = int(state["epoch"]), int(state["next"])
    self._open = [[int(place), int(taken)] for place, taken in state["open"]]
    self._turn, self._empty_epoch = int(state["turn"]), bool(state["empty_epoch"])
    self._readers = {}  # reopened at their positions when read


class ShardStream(grain.IterDataset):
  """The examples of a process's shards as a grain IterDataset (see module doc)."""

  def __init__(self, shards: list[Shard], seed: int, shuffle: bool = True,
               process_index: int = 0, process_count: int = 1,
               open_shards: int = OPEN_SHARDS):
    super().__init__()
    self._arguments = (shards, seed, shuffle, process_index, process_count, open_shards)

  def __iter__(self) -> _ShardStreamIterator:
    return _ShardStreamIterator(*self._arguments)


@dataclasses.dataclass
class StreamPosition:
  """A stream's position: grain's iterator state (JSON-able)."""
  state: dict

  def to_dict(self) -> dict:
    return {"stream": self.state}


class StreamBatchIterator:
  """Endless numpy batches {feature: [batch, ...]} of a process's shards.

  `position` (a dict from `position.to_dict()`) continues a stream exactly where it was:
  the next batch is the one an unbroken stream would give.
  """

  def __init__(self, shards: list[Shard], batch_size: int, seed: int, window: int,
               shuffle: bool = True, process_index: int = 0, process_count: int = 1,
               position: dict | None = None, open_shards: int = OPEN_SHARDS):
    dataset = ShardStream(shards, seed, shuffle, process_index, process_count, open_shards)
    if shuffle and window > 1:
      dataset = grain.experimental.WindowShuffleIterDataset(dataset, window_size=window,
                                                           seed=seed % 2**31)
    dataset = dataset.batch(batch_size, drop_remainder=True)
    dataset = grain.experimental.ThreadPrefetchIterDataset(
        dataset, prefetch_buffer_size=PREFETCH_BATCHES)
    self._iterator = iter(dataset)
    if position:
      self._iterator.set_state(position["stream"])
    self._final_state = None

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    return next(self._iterator)

  @property
  def position(self) -> StreamPosition:
    if self._iterator is None:
      return StreamPosition(self._final_state)
    return StreamPosition(self._iterator.get_state())

  def close(self, wait: bool = False) -> None:
    """Stops the prefetch thread and lets go of the shards (`wait` is BatchIterator's
    argument: here the thread has always stopped when this returns)."""
    del wait
    if self._iterator is not None:
      self._final_state = self._iterator.get_state()
      iterator, self._iterator = self._iterator, None
      iterator.close()  # and dropped now, not at interpreter exit (grain's __del__ fails then)


def all_examples(shards: list[Shard], process_index: int = 0, process_count: int = 1
                 ) -> Iterator[dict[str, np.ndarray]]:
  """Every example of this process's shards once, in canonical order (epoch 0)."""
  check_shard_count(len(shards), process_count)
  for shard in shards[process_index::process_count]:
    yield from shard.open(0, 0)

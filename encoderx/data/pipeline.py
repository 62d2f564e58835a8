"""Batches of a seqio Task's examples, with a position that checkpoints can save.

Two ways to read a Task (`batch_iterator` picks by its source):
- whole epochs (`BatchIterator`; text files read on the fly, small corpora): each epoch
  is a fresh pass of the seqio Task with its own seed, so documents, pairs and shuffling
  change from epoch to epoch while every epoch is reproducible. The position is (epoch,
  batches taken in that epoch); restoring it rebuilds that epoch and skips the batches
  already taken (re-reading at most one epoch of data).
- shard by shard (`shard_stream.StreamBatchIterator`; sources that are
  `shard_stream.ShardedSource`s: text files with data.streaming, TFDS datasets,
  preprocessed examples): each process streams its own shards with a position that
  restores the next batch in constant time (see encoderx/data/shard_stream.py).
Either way a resumed run sees exactly the batches an unbroken run would.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import logging
import threading
from typing import Iterator

import numpy as np
import seqio
import tensorflow as tf

from encoderx import errors
from encoderx.data import shard_stream


@dataclasses.dataclass
class DataPosition:
  epoch: int = 0
  batch: int = 0

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, state: dict) -> "DataPosition":
    return cls(int(state["epoch"]), int(state["batch"]))


class _SeqioCacheAdvice(logging.Filter):
  """Drops seqio's advice, logged at every epoch, to cache function sources for better
  shuffling: the document sources here reshuffle with a fresh seed every epoch."""

  def filter(self, record):
    return "uncached FunctionDataset" not in record.getMessage()


logging.getLogger("absl").addFilter(_SeqioCacheAdvice())


# seqio hands seeds to random preprocessors from a module-global counter that
# `get_dataset` sets from its `seed` and advances as it builds the pipeline; two datasets
# built at once (the next epoch opening in the background while another is built) take
# each other's seeds and the data stops being a function of the seed. Builds take turns.
_DATASET_BUILD_LOCK = threading.Lock()


def epoch_seed(seed: int, epoch: int, *more: int) -> int:
  """A seed of (seed, epoch[, shard ...]), for seqio (a positive int32)."""
  return int(np.random.SeedSequence([seed, epoch, *more]).generate_state(1)[0]
             % (2**31 - 1))


def _release(iterator):
  del iterator


def feature_lengths(task: seqio.Task, seq_length: int) -> dict[str, int]:
  """seqio's `sequence_length` argument: every output feature of `task` at `seq_length`."""
  return {name: seq_length for name in task.output_features}


def build_dataset(task: seqio.Task, split: str, seq_length: int, shuffle: bool, seed: int,
                   shard_info: seqio.ShardInfo | None) -> tf.data.Dataset:
  """One pass of `split`, built under the lock (see _DATASET_BUILD_LOCK)."""
  with _DATASET_BUILD_LOCK:
    return task.get_dataset(
        sequence_length=feature_lengths(task, seq_length), split=split, shuffle=shuffle,
        seed=seed, shard_info=shard_info, num_epochs=1)


def _deterministic(dataset: tf.data.Dataset) -> tf.data.Dataset:
  options = tf.data.Options()
  options.deterministic = True
  return dataset.with_options(options).prefetch(tf.data.AUTOTUNE)


class BatchIterator:
  """Endless numpy batches of `task`'s `split`: {feature: [batch, ...]}.

  `shard_info` picks this process's part of the examples on multi-host runs, where each
  process loads `batch_size` = global batch / process count. `group_lengths` (fine-tuning's
  finetune.length_buckets with finetune.group_by_length): each batch drawn from examples of one
  bucket (tf.data's bucket_by_sequence_length: a window per bucket, a batch leaving when
  its bucket has `batch_size` examples; the bucket of an example is the shortest that
  holds its `segment_ids` > 0, the last one everything longer), so that cutting it
  (encoderx/data/buckets.py) drops most of its padding. An epoch's examples left in
  partly filled buckets at its end are not trained on in that epoch.
  """

  def __init__(self, task: seqio.Task, split: str, seq_length: int, batch_size: int,
               seed: int, shuffle: bool = True, shard_info: seqio.ShardInfo | None = None,
               position: DataPosition | None = None, group_lengths: tuple[int, ...] = ()):
    self.task, self.split, self.group_lengths = task, split, tuple(sorted(group_lengths))
    self.seq_length, self.batch_size = seq_length, batch_size
    self.seed, self.shuffle, self.shard_info = seed, shuffle, shard_info
    self.position = position or DataPosition()
    self._iterator = self._pending = self._next_epoch = None
    self._prepare_after = 16  # batches into the first epoch: short runs never pay
    # One worker opens the next epoch, one releases finished ones.
    self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=2)

  def _epoch_dataset(self, epoch: int) -> tf.data.Dataset:
    dataset = build_dataset(self.task, self.split, self.seq_length, self.shuffle,
                             epoch_seed(self.seed, epoch), self.shard_info)
    if self.group_lengths:
      boundaries = [length + 1 for length in self.group_lengths]  # length <= bucket
      return _deterministic(dataset.bucket_by_sequence_length(
          lambda example: tf.reduce_sum(tf.cast(example["segment_ids"] > 0, tf.int32)),
          boundaries, [self.batch_size] * (len(boundaries) + 1), drop_remainder=True))
    return _deterministic(dataset.batch(self.batch_size, drop_remainder=True))

  def _open_epoch(self, epoch: int, skip: int = 0):
    """The epoch's iterator and its first batch (None if the epoch has no batch)."""
    iterator = self._epoch_dataset(epoch).skip(skip).as_numpy_iterator()
    return iterator, next(iterator, None)

  def _maybe_prepare_next_epoch(self):
    # Opening an epoch fills the shuffle buffer (seconds on a small corpus); doing it in
    # the background while this epoch is consumed keeps the train step fed.
    if self._next_epoch is None and self.position.batch >= self._prepare_after:
      self._next_epoch = self._executor.submit(self._open_epoch, self.position.epoch + 1)

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    if self._iterator is None:
      self._iterator, self._pending = self._open_epoch(self.position.epoch,
                                                       self.position.batch)
    batch, self._pending = self._pending, None
    if batch is None:
      batch = next(self._iterator, None)
    if batch is None:  # the epoch is over
      if self._next_epoch is None:
        self._prepare_after = 0
        self._maybe_prepare_next_epoch()
      finished = self._iterator
      self._iterator, batch = self._next_epoch.result()
      # Deleting a tf.data iterator waits for its worker threads; on a busy CPU that took
      # up to half a minute, so the last reference goes in the background.
      self._executor.submit(_release, finished)
      del finished
      if batch is None:
        raise ValueError(
            f"the {self.split} split yields fewer than {self.batch_size} examples per "
            "epoch, so not a single full batch; use a smaller batch size or more text.")
      # Runs that finish an epoch go on to others: open the next one as soon as this one
      # has started, so it has a whole epoch to fill its buffers (on a CPU busy with the
      # train step that took up to half a minute).
      self._prepare_after = 1
      self._next_epoch = None
      self.position = DataPosition(self.position.epoch + 1, 0)
    self.position = DataPosition(self.position.epoch, self.position.batch + 1)
    self._maybe_prepare_next_epoch()
    return batch

  def close(self, wait: bool = False):
    """Stops the background work. Work already running (opening the next epoch,
    releasing the last) is no longer needed and by default finishes in the background
    instead of holding up the caller (15 s at the end of the main job when it waited);
    `wait=True` returns once it is done, e.g. before timing something else."""
    self._executor.shutdown(wait=wait, cancel_futures=True)


class OrderedTask(seqio.Task):
  """A Task whose examples must be read in the order they are built (XLNet's row
  streams: batch t holds every row's step t). Read whole, its shuffle buffer of one
  keeps them in order; streamed, one shard is open at a time and no window shuffles
  them, so a batch is consecutive examples of one shard (shard_stream.py: ordered)."""


def is_streamed(task: seqio.Task) -> bool:
  """Whether `task` is read shard by shard (stream) rather than as whole epochs."""
  return isinstance(task.source, shard_stream.ShardedSource)


@functools.cache
def _tokenized_shard(task: seqio.Task, split: str):
  """int64 scalar tensor `index` -> shard `index`'s documents through the Task's
  pre-cache preprocessors (tokenization), as a tf.function traced on its first call.

  Tracing them (autograph, the sentence breaker and tokenizer ops) took about 3 s per
  shard when every shard built its own pipeline; traced once, opening a shard costs the
  post-cache part only. They take no seed: seqio caches their output once for every seed.
  """
  @tf.function(input_signature=[tf.TensorSpec([], tf.int64)], autograph=False)
  def tokenized(index):
    return task.preprocess_precache(task.source.shard_documents(split, index))
  return tokenized


def _shard_dataset(task: seqio.Task, split: str, seq_length: int, index: int, seed: int
                   ) -> tf.data.Dataset:
  """What `build_dataset(task, split, seq_length, False, seed, ShardInfo(index, n))` gives
  (bit for bit, tested) for a source with `shard_documents`, without re-tracing the
  pre-cache preprocessors: seqio's get_dataset, unshuffled, on one shard."""
  lengths = feature_lengths(task, seq_length)
  with _DATASET_BUILD_LOCK:
    documents = _tokenized_shard(task, split)(tf.constant(index, tf.int64))
    dataset = task.preprocess_postcache(documents, sequence_length=lengths, seed=seed)
  return seqio.utils.trim_dataset(dataset, lengths, task.output_features)


def _open_task_shard(task: seqio.Task, split: str, seq_length: int, seed: int, index: int,
                     count: int, epoch: int, start: int):
  """The examples of shard `index` of `count` (one text file, one TFDS file) in `epoch`:
  the Task's preprocessors run on that shard alone, seeded by (seed, epoch, shard), from
  its `start`-th example on (the ones before are built and skipped: one shard's work)."""
  shard_seed = epoch_seed(seed, epoch, index)
  if hasattr(task.source, "shard_documents"):  # text files
    dataset = _shard_dataset(task, split, seq_length, index, shard_seed)
  else:  # TFDS: its source picks the shard's files in Python, so a pipeline per shard
    dataset = build_dataset(task, split, seq_length, False, shard_seed,
                             seqio.ShardInfo(index=index, num_shards=count))
  return _deterministic(dataset.skip(start)).as_numpy_iterator()


def stream_shards(task: seqio.Task, split: str, seq_length: int, seed: int
                  ) -> list[shard_stream.Shard]:
  """The shards of a streamed Task's split at `seq_length`: the source's own files of
  examples (preprocessed), else each of its input shards run through the Task."""
  source = task.source
  if hasattr(source, "example_shards"):
    return source.example_shards(split, seq_length)
  names = source.list_shards(split)
  return [shard_stream.Shard(str(name), functools.partial(
      _open_task_shard, task, split, seq_length, seed, index, len(names)))
          for index, name in enumerate(names)]


def _process(shard_info: seqio.ShardInfo | None) -> tuple[int, int]:
  return (shard_info.index, shard_info.num_shards) if shard_info else (0, 1)


def batch_iterator(task: seqio.Task, split: str, seq_length: int, batch_size: int,
                   seed: int, shuffle: bool = True,
                   shard_info: seqio.ShardInfo | None = None,
                   position: dict | None = None, group_lengths: tuple[int, ...] = ()):
  """Endless batches of `split` ({feature: [batch, ...]}), continuing from `position` (a
  dict from an iterator's `position.to_dict()`): a StreamBatchIterator for streamed
  Tasks, a BatchIterator otherwise. Both have `position`, `close()` and are iterators.
  `group_lengths`: batches of examples of one length bucket (BatchIterator)."""
  if group_lengths and is_streamed(task):
    raise errors.ConfigError("finetune.group_by_length: streamed examples are batched in "
                             "their stream's order; set it to False.")
  if is_streamed(task):
    process_index, process_count = _process(shard_info)
    ordered = isinstance(task, OrderedTask)
    return shard_stream.StreamBatchIterator(
        stream_shards(task, split, seq_length, seed), batch_size, seed,
        window=1 if ordered else task.shuffle_buffer_size or 1, shuffle=shuffle,
        process_index=process_index, process_count=process_count, position=position,
        open_shards=1 if ordered else shard_stream.OPEN_SHARDS)
  return BatchIterator(task, split, seq_length, batch_size, seed, shuffle, shard_info,
                       DataPosition.from_dict(position) if position else None,
                       group_lengths)


def take_batches(task: seqio.Task, split: str, seq_length: int, batch_size: int,
                 count: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
  """The first `count` batches of `split` (to look at, measure or test with)."""
  iterator = batch_iterator(task, split, seq_length, batch_size, seed=seed)
  try:
    return [next(iterator) for _ in range(count)]
  finally:
    iterator.close()


def _padded_batches(examples: Iterator[dict[str, np.ndarray]], batch_size: int
                    ) -> Iterator[dict[str, np.ndarray]]:
  """Examples in full batches, the last padded with rows of zeros; `example_weight`
  [batch] is 1.0 on examples, 0.0 on padding rows."""
  rows = []
  for example in examples:
    rows.append({**example, "example_weight": np.float32(1.0)})
    if len(rows) == batch_size:
      yield {name: np.stack([row[name] for row in rows]) for name in rows[0]}
      rows = []
  if rows:
    missing = batch_size - len(rows)
    yield {name: np.pad(np.stack([row[name] for row in rows]),
                        [(0, missing)] + [(0, 0)] * np.ndim(rows[0][name]))
           for name in rows[0]}


def whole_split(task: seqio.Task, split: str, seq_length: int, batch_size: int,
                seed: int = 0, shard_info: seqio.ShardInfo | None = None
                ) -> Iterator[dict[str, np.ndarray]]:
  """Every example of `split` once, in order, in full batches: the last is padded with
  rows of zeros. Each batch has `example_weight` [batch]: 1.0 on examples, 0.0 on
  padding rows (what evaluations of a whole split weight their metrics by)."""
  if is_streamed(task):
    yield from _padded_batches(shard_stream.all_examples(
        stream_shards(task, split, seq_length, seed), *_process(shard_info)), batch_size)
    return
  dataset = build_dataset(task, split, seq_length, False, seed, shard_info)
  yield from _padded_batches(_deterministic(dataset).as_numpy_iterator(), batch_size)


def evaluation_batches(task: seqio.Task, split: str, seq_length: int, batch_size: int,
                       count: int, seed: int, shard_info: seqio.ShardInfo | None = None
                       ) -> Iterator[dict[str, np.ndarray]]:
  """What an evaluation reads: the first `count` batches of `split`, unshuffled (the
  same at every evaluation), or, with count 0, the whole split (see whole_split). Every
  batch has `example_weight` (all 1.0 here: the first batches are full)."""
  if not count:
    yield from whole_split(task, split, seq_length, batch_size, seed, shard_info)
    return
  iterator = batch_iterator(task, split, seq_length, batch_size, seed=seed, shuffle=False,
                            shard_info=shard_info)
  try:
    for _ in range(count):
      yield {**next(iterator), "example_weight": np.ones([batch_size], np.float32)}
  finally:
    iterator.close()

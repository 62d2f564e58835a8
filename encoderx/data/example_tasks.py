"""seqio Tasks over examples read on the host (fine-tuning files, a TFDS split read once).

Fine-tuning data is small enough to hold in memory: each method reads its files into
columns ({feature: list or array}, one entry per example) and registers a Task whose
source slices them and whose preprocessors turn them into the model's features. One
Task is registered per distinct description (files, fields, vocabulary), named after
its hash, so that equal configs share it.
"""
from __future__ import annotations

import hashlib
import json
from typing import Callable, Mapping, Sequence

import seqio
import tensorflow as tf

# The model's input features (int32 [length]); the encoder reads these four.
MODEL_FEATURES = ("input_ids", "token_type_ids", "segment_ids", "positions")


def register(prefix: str, description, columns: Mapping[str, Callable[[], dict]],
             vocabulary: seqio.Vocabulary, preprocessors: Sequence = (),
             shuffle_buffer: int = 10_000,
             train_order: Callable[[dict, int], Sequence[int]] | None = None,
             train_rows: Callable[[dict, int], dict] | None = None) -> seqio.Task:
  """Registers (once) and returns the Task `encoderx_<prefix>_<hash of description>`
  whose split `s` slices `columns[s]()` (read when a dataset is built). With
  `train_order`, an epoch of the train split is its rows in the order
  `train_order(columns, the epoch's seed)` gives, unshuffled: the order batched (the
  description must then hold what the order depends on, e.g. the batch size). With
  `train_rows`, an epoch's rows are first `train_rows(columns, the epoch's seed)` (rows
  made anew each epoch, e.g. pairs cropped from documents)."""
  blob = json.dumps(description, sort_keys=True, default=str)
  name = f"encoderx_{prefix}_{hashlib.sha1(blob.encode()).hexdigest()[:12]}"
  if name in seqio.TaskRegistry.names():
    return seqio.get_mixture_or_task(name)

  def dataset_fn(split, shuffle_files, seed=None):
    del shuffle_files  # the Task's shuffle buffer holds a whole fine-tuning file
    read = dict(columns[split]())
    if train_rows is not None and split == "train":
      read = train_rows(read, 0 if seed is None else seed)
    if train_order is not None and split == "train":
      order = train_order(read, 0 if seed is None else seed)
      read = {name: [column[i] for i in order] for name, column in read.items()}
    return tf.data.Dataset.from_tensor_slices(read)

  plain = seqio.PassThroughVocabulary(size=0)
  features = {"input_ids": seqio.Feature(vocabulary, add_eos=False, dtype=tf.int32)}
  features.update({feature: seqio.Feature(plain, add_eos=False, dtype=tf.int32)
                   for feature in MODEL_FEATURES[1:]})
  return seqio.TaskRegistry.add(
      name, source=seqio.FunctionDataSource(dataset_fn, splits=tuple(columns)),
      preprocessors=list(preprocessors), output_features=features,
      shuffle_buffer_size=1 if train_order is not None else shuffle_buffer)


def pad_to(features: Mapping[str, tf.Tensor], length: int, names: Sequence[str],
           value: int = 0) -> dict[str, tf.Tensor]:
  """The [n] features `names` padded with `value` to [length] (seqio trims but pads
  nothing)."""
  return {name: tf.ensure_shape(
      tf.pad(features[name], [[0, length - tf.shape(features[name])[0]]],
             constant_values=value), [length]) for name in names}


def single_sequence(ids: tf.Tensor) -> dict[str, tf.Tensor]:
  """The model features of one sequence of token ids [n] (token type 0 throughout)."""
  length = tf.shape(ids)[0]
  return {"input_ids": ids, "token_type_ids": tf.zeros([length], tf.int32),
          "segment_ids": tf.ones([length], tf.int32),
          "positions": tf.range(length, dtype=tf.int32)}

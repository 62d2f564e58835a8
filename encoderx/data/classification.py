"""seqio Tasks of labelled text for classification fine-tuning.

    rows of a TSV / CSV / JSONL file (encoderx/data/labelled.py)
      -> {'text', ['text_pair'], 'label'}
      -> [CLS] text [SEP] (pair [SEP])     token ids of the config's vocabulary

The two texts are cut to fit, a token at a time from the longer one (Hugging Face's
'longest_first'); byte-level BPE vocabularies separate a pair with two separators, as
RoBERTa does (<s> A </s></s> B </s>). Examples have `input_ids`, `token_type_ids`
(A=0, B=1; all 0 when the model has one token type), `segment_ids` (1 on tokens, 0 on
padding), `positions` and the `label` id.
"""
from __future__ import annotations

import functools
import hashlib
import json
from typing import Mapping

import seqio
import tensorflow as tf

from encoderx.data import labelled

FEATURES = ("input_ids", "token_type_ids", "segment_ids", "positions")


def longest_first_lengths(first: tf.Tensor, second: tf.Tensor, budget: int):
  """Lengths of two texts cut to `budget` tokens in all, a token at a time from the
  longer (ties: from the second). Hugging Face's 'longest_first' truncation, in its
  closed form (transformers tokenization_utils_base.truncate_sequences)."""
  excess = tf.maximum(first + second - budget, 0)
  first_remove = tf.minimum(tf.abs(first - second), excess)
  rest = excess - first_remove
  from_first = tf.where(first > second, first_remove + rest // 2, rest // 2)
  return first - from_first, second - (excess - from_first)


def encode_texts(dataset: tf.data.Dataset, sequence_length: Mapping[str, int],
                 output_features: Mapping[str, seqio.Feature], pair: bool,
                 token_types: bool) -> tf.data.Dataset:
  """{'text', ['text_pair'], 'label'} -> the model's features and 'label'."""
  vocabulary = output_features["input_ids"].vocabulary
  seq_length = sequence_length["input_ids"]
  separators = getattr(vocabulary, "pair_separators", 1)
  cls, sep = [vocabulary.cls_id], [vocabulary.sep_id]

  def tokens(text):
    return tf.cast(vocabulary.tokenize_words_tf(text).flat_values, tf.int32)

  def encode(example):
    first = tokens(example["text"])
    if pair:
      second = tokens(example["text_pair"])
      keep_first, keep_second = longest_first_lengths(
          tf.size(first), tf.size(second), seq_length - 2 - separators)
      parts = [cls, first[:keep_first], sep * separators, second[:keep_second], sep]
      types = tf.concat([tf.zeros([keep_first + 1 + separators], tf.int32),
                         tf.ones([keep_second + 1], tf.int32)], axis=0)
    else:
      parts = [cls, first[:seq_length - 2], sep]
    ids = tf.concat(parts, axis=0)
    length = tf.shape(ids)[0]
    features = {
        "input_ids": ids,
        "token_type_ids": (types if pair and token_types else tf.zeros([length], tf.int32)),
        "segment_ids": tf.ones([length], tf.int32),
        "positions": tf.range(length, dtype=tf.int32),
    }
    # Padded here: seqio's get_dataset trims features to their length but pads none.
    padded = {name: tf.ensure_shape(tf.pad(value, [[0, seq_length - length]]), [seq_length])
              for name, value in features.items()}
    return {**padded, "label": tf.cast(example["label"], tf.int32)}

  return dataset.map(encode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def read_examples(path: str, finetune, labels: tuple[str, ...], with_labels: bool = True):
  """(rows, {'text', ['text_pair'], 'label'} columns) of a labelled file; without
  labels (`with_labels=False`, files to predict) a missing label column reads as -1."""
  columns = [finetune.text_column] + ([finetune.text_pair_column]
                                      if finetune.text_pair_column else [])
  optional = () if with_labels else (finetune.label_column,)
  rows = labelled.read_rows(path, columns + [finetune.label_column], finetune.format,
                            optional=optional)
  examples = {"text": [row[finetune.text_column] for _, row in rows]}
  if finetune.text_pair_column:
    examples["text_pair"] = [row[finetune.text_pair_column] for _, row in rows]
  if with_labels or all(row[finetune.label_column] for _, row in rows):
    examples["label"] = labelled.label_ids(rows, finetune.label_column, labels, path)
  else:
    examples["label"] = [-1] * len(rows)
  return rows, examples


def register_task(files: Mapping[str, str], finetune, labels: tuple[str, ...],
                  vocabulary: seqio.Vocabulary, vocab_description: dict,
                  token_types: bool, shuffle_buffer: int,
                  with_labels: bool = True) -> seqio.Task:
  """Registers (once) and returns the Task whose splits read `files` ({split: path})."""
  description = json.dumps([dict(files), finetune.to_dict(), labels, vocab_description,
                            token_types, with_labels], sort_keys=True, default=str)
  name = f"encoderx_classify_{hashlib.sha1(description.encode()).hexdigest()[:12]}"
  if name in seqio.TaskRegistry.names():
    return seqio.get_mixture_or_task(name)
  pair = bool(finetune.text_pair_column)

  def dataset_fn(split, shuffle_files, seed=None):
    del shuffle_files, seed  # the Task's shuffle buffer holds a whole labelled file
    _, examples = read_examples(files[split], finetune, labels, with_labels)
    return tf.data.Dataset.from_tensor_slices(examples)

  plain = seqio.PassThroughVocabulary(size=0)
  features = {"input_ids": seqio.Feature(vocabulary, add_eos=False, dtype=tf.int32)}
  features.update({name: seqio.Feature(plain, add_eos=False, dtype=tf.int32)
                   for name in FEATURES[1:]})
  return seqio.TaskRegistry.add(
      name,
      source=seqio.FunctionDataSource(dataset_fn, splits=tuple(files)),
      preprocessors=[functools.partial(encode_texts, pair=pair, token_types=token_types)],
      output_features=features,
      shuffle_buffer_size=shuffle_buffer)

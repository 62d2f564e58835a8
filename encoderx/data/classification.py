"""seqio Tasks of labelled text for classification fine-tuning.

    rows of a TSV / CSV / JSONL file (encoderx/data/labelled.py)
      -> {'text', ['text_pair'], 'label'}
      -> [CLS] text [SEP] (pair [SEP])     token ids of the config's vocabulary

The two texts are cut to fit, a token at a time from the longer one (Hugging Face's
'longest_first'); byte-level BPE vocabularies separate a pair with two separators, as
RoBERTa does (<s> A </s></s> B </s>). Examples have `input_ids`, `token_type_ids`
(A=0, B=1; all 0 when the model has one token type), `segment_ids` (1 on tokens, 0 on
padding), `positions` and the `label`: an id in the label list, or for regression
(no label list) the score as a float.
"""
from __future__ import annotations

import functools
from typing import Mapping

import numpy as np
import seqio
import tensorflow as tf

from encoderx.data import example_tasks, labelled


def longest_first_lengths(first: tf.Tensor, second: tf.Tensor, budget: int):
  """Lengths of two texts cut to `budget` tokens in all, a token at a time from the
  longer (ties: from the second). Hugging Face's 'longest_first' truncation, in its
  closed form (transformers tokenization_utils_base.truncate_sequences)."""
  excess = tf.maximum(first + second - budget, 0)
  first_remove = tf.minimum(tf.abs(first - second), excess)
  rest = excess - first_remove
  from_first = tf.where(first > second, first_remove + rest // 2, rest // 2)
  return first - from_first, second - (excess - from_first)


def pair_features(vocabulary, seq_length: int, first: tf.Tensor, second: tf.Tensor,
                  token_types: bool) -> dict[str, tf.Tensor]:
  """The model's features of [CLS] first [SEP] second [SEP] (two separators between
  them for byte-level BPE), the texts cut longest-first to fit `seq_length`, padded."""
  separators = getattr(vocabulary, "pair_separators", 1)
  keep_first, keep_second = longest_first_lengths(tf.size(first), tf.size(second),
                                                  seq_length - 2 - separators)
  parts = [[vocabulary.cls_id], first[:keep_first], [vocabulary.sep_id] * separators,
           second[:keep_second], [vocabulary.sep_id]]
  features = example_tasks.single_sequence(tf.concat(parts, axis=0))
  if token_types:
    features["token_type_ids"] = tf.concat([tf.zeros([keep_first + 1 + separators], tf.int32),
                                            tf.ones([keep_second + 1], tf.int32)], axis=0)
  return example_tasks.pad_to(features, seq_length, example_tasks.MODEL_FEATURES)


def text_tokens(vocabulary, text: tf.Tensor) -> tf.Tensor:
  """int32 [n]: the word pieces of one text."""
  return tf.cast(vocabulary.tokenize_words_tf(text).flat_values, tf.int32)


def encode_texts(dataset: tf.data.Dataset, sequence_length: Mapping[str, int],
                 output_features: Mapping[str, seqio.Feature], pair: bool,
                 token_types: bool) -> tf.data.Dataset:
  """{'text', ['text_pair'], 'label'} -> the model's features and 'label'."""
  vocabulary = output_features["input_ids"].vocabulary
  seq_length = sequence_length["input_ids"]

  def encode(example):
    first = text_tokens(vocabulary, example["text"])
    if pair:
      features = pair_features(vocabulary, seq_length, first,
                               text_tokens(vocabulary, example["text_pair"]), token_types)
    else:
      features = example_tasks.pad_to(example_tasks.single_sequence(tf.concat(
          [[vocabulary.cls_id], first[:seq_length - 2], [vocabulary.sep_id]], axis=0)),
          seq_length, example_tasks.MODEL_FEATURES)
    label = example["label"]
    return {**features,
            "label": label if label.dtype.is_floating else tf.cast(label, tf.int32)}

  return dataset.map(encode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def read_examples(path: str, finetune, labels: tuple[str, ...] | None,
                  with_labels: bool = True):
  """(rows, {'text', ['text_pair'], 'label'} columns) of a labelled file: label ids in
  `labels`, or scores (float32) when `labels` is None (regression). Without labels
  (`with_labels=False`, files to predict) a missing label column reads as -1."""
  columns = [finetune.text_column] + ([finetune.text_pair_column]
                                      if finetune.text_pair_column else [])
  optional = () if with_labels else (finetune.label_column,)
  rows = labelled.read_rows(path, columns + [finetune.label_column], finetune.format,
                            optional=optional)
  examples = {"text": [row[finetune.text_column] for _, row in rows]}
  if finetune.text_pair_column:
    examples["text_pair"] = [row[finetune.text_pair_column] for _, row in rows]
  if with_labels or all(row[finetune.label_column] for _, row in rows):
    examples["label"] = (labelled.label_scores(rows, finetune.label_column, path)
                         if labels is None else
                         labelled.label_ids(rows, finetune.label_column, labels, path))
  else:
    examples["label"] = [-1.0 if labels is None else -1] * len(rows)
  if labels is None:
    examples["label"] = np.asarray(examples["label"], np.float32)
  return rows, examples


def register_task(files: Mapping[str, str], finetune, labels: tuple[str, ...] | None,
                  vocabulary: seqio.Vocabulary, vocab_description: dict,
                  token_types: bool, shuffle_buffer: int,
                  with_labels: bool = True) -> seqio.Task:
  """Registers (once) and returns the Task whose splits read `files` ({split: path})."""
  description = [dict(files), finetune.to_dict(), labels, vocab_description, token_types,
                 with_labels]
  columns = {split: (lambda path=path: read_examples(path, finetune, labels,
                                                     with_labels)[1])
             for split, path in files.items()}
  encode = functools.partial(encode_texts, pair=bool(finetune.text_pair_column),
                             token_types=token_types)
  return example_tasks.register("classify", description, columns, vocabulary, [encode],
                                shuffle_buffer)


def encode_each(dataset: tf.data.Dataset, sequence_length: Mapping[str, int],
                output_features: Mapping[str, seqio.Feature],
                prefixes: Mapping[str, str]) -> tf.data.Dataset:
  """Each text field encoded alone, [CLS] text [SEP]: {text field: feature prefix}, e.g.
  {'text': '', 'text_pair': 'pair_'} gives input_ids ... and pair_input_ids ...; other
  fields (a label) are kept."""
  vocabulary = output_features["input_ids"].vocabulary
  seq_length = sequence_length["input_ids"]

  def encode(example):
    encoded = {k: v for k, v in example.items() if k not in prefixes}
    for field, prefix in prefixes.items():
      ids = tf.cast(vocabulary.tokenize_words_tf(example[field]).flat_values, tf.int32)
      features = example_tasks.single_sequence(
          tf.concat([[vocabulary.cls_id], ids[:seq_length - 2], [vocabulary.sep_id]], 0))
      padded = example_tasks.pad_to(features, seq_length, example_tasks.MODEL_FEATURES)
      encoded.update({prefix + name: value for name, value in padded.items()})
    return encoded

  return dataset.map(encode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)

"""seqio preprocessors: documents -> tokenized sentences -> fixed-length examples.

Tokenization runs in the tf.data graph (tensorflow-text); example building, which needs
random access to other documents, runs as numpy code over groups of tokenized documents,
with one seed per group drawn by seqio's seed manager (so a Task's output is a
deterministic function of the `seed` given to `get_dataset`).
"""
from __future__ import annotations

from typing import Callable, Iterator, Mapping

import numpy as np
import seqio
import tensorflow as tf
import tensorflow_text as tf_text

from encoderx.data import packing, row_streams, segment_pairs


def tokenize_documents(dataset: tf.data.Dataset, output_features: Mapping[str, seqio.Feature],
                       sentence_per_line: bool) -> tf.data.Dataset:
  """{'text': blocks joined by newlines} -> flat token ids, word starts, sentence lengths.

  Blocks are paragraphs that a rule-based sentence breaker splits, or, with
  `sentence_per_line`, sentences already. A vocabulary whose tokens carry the space
  before a word (`tokens_carry_leading_space`: byte-level BPE's 'Ġword') gets each
  sentence with the whitespace that precedes it in its block, so that sentences are
  tokenized as in running text (RoBERTa encodes whole lines); a block's first sentence
  has none.
  """
  vocabulary = output_features["input_ids"].vocabulary
  leading_space = getattr(vocabulary, "tokens_carry_leading_space", False)
  breaker = tf_text.StateBasedSentenceBreaker()

  def tokenize(example):
    blocks = tf.strings.split(example["text"], "\n")
    blocks = tf.boolean_mask(blocks, tf.strings.length(blocks) > 0)
    if sentence_per_line:
      sentences = blocks
    elif leading_space:
      sentences = sentences_with_leading_space(breaker, blocks)
    else:
      sentences = breaker.break_sentences(blocks).merge_dims(0, 1)
    pieces = vocabulary.tokenize_words_tf(sentences)  # [sentences, words, pieces]
    tokens = pieces.merge_dims(1, 2)
    num_tokens = tf.shape(tokens.flat_values, out_type=tf.int64)
    first_pieces = tf.expand_dims(pieces.values.row_starts(), 1)
    word_starts = tf.scatter_nd(first_pieces, tf.ones_like(first_pieces[:, 0], tf.int32),
                                num_tokens)
    return {
        "document_id": example["document_id"],
        "token_ids": tf.cast(tokens.flat_values, tf.int32),
        "word_starts": word_starts,
        "sentence_lengths": tf.cast(tokens.row_lengths(), tf.int32),
    }

  return dataset.map(tokenize, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def sentences_with_leading_space(breaker: tf_text.StateBasedSentenceBreaker,
                                  blocks: tf.Tensor) -> tf.Tensor:
  """Blocks [blocks] -> their sentences [sentences], each but a block's first starting
  where the previous one ended (so with the whitespace between them)."""
  _, starts, ends = breaker.break_sentences_with_offsets(blocks)  # byte offsets
  first = tf.ragged.range(ends.row_lengths()).values == 0
  previous_ends = tf.concat([tf.zeros([1], ends.dtype), ends.values[:-1]], axis=0)
  begin = tf.where(first, starts.values, previous_ends)
  return tf.strings.substr(tf.repeat(blocks, ends.row_lengths()), begin,
                           ends.values - begin)


def documents_to_examples(dataset: tf.data.Dataset,
                          build: Callable[[list, np.random.Generator], Iterator[dict]],
                          seq_length: int, group_size: int) -> tf.data.Dataset:
  """Runs `build(documents, rng)` on groups of `group_size` tokenized documents.

  `build.feature_names` are the example's features: [seq_length] int32 arrays, but for
  those in `build.scalar_features` (e.g. `sentence_label`), scalars.
  Builders that need other documents (random next segments) draw them from the group.
  Each group gets its own seed from seqio's seed manager, so the output is a
  deterministic function of the Task's seed. The builder runs as one numpy function
  per group, not as a generator over an inner iterator, which can deadlock tf.data.
  """
  dataset = dataset.ragged_batch(group_size)
  names = build.feature_names
  scalars = getattr(build, "scalar_features", ())

  def build_group(seed, document_ids, token_ids, token_rows, word_starts,
                  sentence_lengths, sentence_rows):
    tokens = np.split(token_ids, np.cumsum(token_rows)[:-1])
    starts = np.split(word_starts, np.cumsum(token_rows)[:-1])
    lengths = np.split(sentence_lengths, np.cumsum(sentence_rows)[:-1])
    documents = [segment_pairs.Document.from_flat(*fields)
                 for fields in zip(document_ids, tokens, starts, lengths)]
    # seqio's seed is a pair of (possibly negative) int32s.
    rng = np.random.default_rng([int(part) % 2**32 for part in np.ravel(seed)])
    examples = list(build(documents, rng))
    return tuple(
        np.stack([example[name] for example in examples]) if examples
        else np.zeros([0] if name in scalars else [0, seq_length], np.int32)
        for name in names)

  @seqio.map_over_dataset(num_seeds=1)
  def build_examples(group, seed):
    outputs = tf.numpy_function(build_group, [
        seed, group["document_id"],
        group["token_ids"].flat_values, group["token_ids"].row_lengths(),
        group["word_starts"].flat_values,
        group["sentence_lengths"].flat_values, group["sentence_lengths"].row_lengths(),
    ], [tf.int32] * len(names), stateful=False)
    for output, name in zip(outputs, names):
      output.set_shape([None] if name in scalars else [None, seq_length])
    return dict(zip(names, outputs))

  return build_examples(dataset).unbatch()


def _special_ids(output_features: Mapping[str, seqio.Feature]) -> segment_pairs.SpecialIds:
  vocabulary = output_features["input_ids"].vocabulary
  return segment_pairs.SpecialIds(vocabulary.pad_id, vocabulary.cls_id, vocabulary.sep_id)


def build_sentence_pairs(dataset: tf.data.Dataset, sequence_length: Mapping[str, int],
                         output_features: Mapping[str, seqio.Feature],
                         short_seq_prob: float, document_pool: int,
                         label_mode: str = "nsp") -> tf.data.Dataset:
  """Tokenized documents -> NSP or SOP (`label_mode`) examples `[CLS] A [SEP] B [SEP]`
  (see segment_pairs)."""
  seq_length = sequence_length["input_ids"]
  builder = segment_pairs.SentencePairBuilder(
      seq_length, short_seq_prob, _special_ids(output_features), label_mode=label_mode)
  return documents_to_examples(dataset, builder, seq_length, document_pool)


def build_packed_sentences(dataset: tf.data.Dataset, sequence_length: Mapping[str, int],
                           output_features: Mapping[str, seqio.Feature],
                           cross_documents: bool, document_pool: int,
                           packing_method: str = "greedy") -> tf.data.Dataset:
  """Tokenized documents -> rows packed with whole sentences (see encoderx.data.packing;
  `packing_method`: data.packing)."""
  seq_length = sequence_length["input_ids"]
  packer = packing.SentencePacker(seq_length, _special_ids(output_features),
                                  cross_documents=cross_documents, packing=packing_method)
  return documents_to_examples(dataset, packer, seq_length, document_pool)


def build_streams(dataset: tf.data.Dataset, sequence_length: Mapping[str, int],
                  output_features: Mapping[str, seqio.Feature], reuse_len: int, rows: int,
                  bi_data: bool, document_pool: int) -> tf.data.Dataset:
  """Tokenized documents -> XLNet's rows: `rows` streams of consecutive chunks, the
  examples of a step together (see encoderx.data.row_streams)."""
  seq_length = sequence_length["input_ids"]
  builder = row_streams.StreamBuilder(seq_length, reuse_len, rows, _special_ids(output_features),
                                  bi_data=bi_data)
  return documents_to_examples(dataset, builder, seq_length, document_pool)

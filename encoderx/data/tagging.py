"""Tagged sentences (CoNLL column files, or a TFDS dataset) -> a seqio Task for token
classification.

    CoNLL file: a token per line, whitespace-separated columns (the token first, the tag
    in column `tag_column`, default the last), a blank line between sentences,
    -DOCSTART- lines skipped
      -> Sentence(line, words, tags)
      -> [CLS] the words' pieces [SEP], cut to the sequence length

Only the first piece of a word is labelled (its tag id in `tags`, -1 on the other pieces
and the special tokens: no loss there), as BERT tags CoNLL-2003 (Devlin et al. 2019,
section 5.3) and Hugging Face's run_ner does (label_all_tokens=False). `word_ids` holds
the word index on first pieces (-1 elsewhere), so that predictions map back to words
whatever pieces the vocabulary makes (a word may make none: every character dropped).
Byte-level BPE words after the first are tokenized with the space before them, as in
running text.

Sentences to score or tag (`windows`) are split into windows of whole words whose
pieces fit in the sequence, so that every word of a long sentence gets a prediction
(cut at the length, its last words would have none); their predictions join back into
the sentence's.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping

import numpy as np
import seqio
import tensorflow as tf

from encoderx import files as files_lib
from encoderx.data import example_tasks, labelled

DOCUMENT_START = "-DOCSTART-"


@dataclasses.dataclass
class Sentence:
  line: int  # the line of its first token, from 1 (0 for TFDS examples)
  words: list[str]
  tags: list[str]  # one per word; [] when the source has no tags


def read_conll(path: str, tag_column: int = -1, with_tags: bool = True) -> list[Sentence]:
  """The sentences of a CoNLL file. Every token line must have as many columns as the
  file's first; with `with_tags` (training and dev files) there must be a tag column.
  A file to predict may have the token column only (then its sentences have no tags)."""
  sentences, columns, first_line = [], None, 0
  words, tags, start = [], [], 0

  def finish():
    if words:
      sentences.append(Sentence(start, list(words), list(tags)))
    words.clear()
    tags.clear()

  for number, line in labelled.numbered_lines(path):
    fields = line.split()
    if not fields or fields[0] == DOCUMENT_START:
      finish()
      continue
    if columns is None:
      columns, first_line = len(fields), number
      if with_tags and columns < 2:
        raise labelled.LabelledDataError(
            f"'{path}' line {number} has one column; a CoNLL training or dev file has "
            "the token and its tag on each line (whitespace-separated).")
      if columns > 1 and not -columns <= tag_column < columns:
        raise labelled.LabelledDataError(
            f"'{path}': tag.column={tag_column}, but line {number} has {columns} "
            "columns.")
      if tag_column in (0, -columns) and columns > 1:
        raise labelled.LabelledDataError(
            f"'{path}': tag.column={tag_column} is the token column.")
    if len(fields) != columns:
      raise labelled.LabelledDataError(
          f"'{path}' line {number} has {len(fields)} columns; line {first_line} has "
          f"{columns} (every token line has the same columns, the token first).")
    if not words:
      start = number
    words.append(fields[0])
    if columns > 1:
      tags.append(fields[tag_column])
  finish()
  if not sentences:
    raise labelled.LabelledDataError(f"'{path}' holds no sentences.")
  return sentences


def read_tfds(data_config, split: str, tokens_feature: str, tags_feature: str
              ) -> tuple[list[Sentence], tuple[str, ...]]:
  """(sentences, tag names in id order) of a TFDS split whose examples hold a sequence of
  tokens and a sequence of ClassLabel tags (e.g. conll2003: 'tokens', 'ner')."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  name = data_config.tfds_name
  builder = tfds.builder(name, data_dir=files_lib.optional(data_config.tfds_data_dir))
  features = builder.info.features
  for feature in (tokens_feature, tags_feature):
    if feature not in features:
      raise labelled.LabelledDataError(
          f"TFDS dataset {name} has no feature '{feature}' (it has "
          f"{', '.join(features.keys())}); set finetune.text_column (tokens) and "
          "finetune.label_column (tags).")
  names = tuple(features[tags_feature].feature.names)
  sentences = []
  for example in tfds.as_numpy(builder.as_dataset(split=split, shuffle_files=False)):
    words = [w.decode("utf-8", errors="replace") for w in example[tokens_feature]]
    if words:
      sentences.append(Sentence(0, words, [names[i] for i in example[tags_feature]]))
  return sentences, names


def columns(sentences: list[Sentence], labels: tuple[str, ...], path: str
            ) -> dict[str, object]:
  """The Task's source columns: words and tag ids (ragged, a row per sentence) and the
  sentence's index. A tag outside `labels` names its line; sentences without tags get
  -1 tags."""
  index = {label: i for i, label in enumerate(labels)}
  tag_ids = []
  for sentence in sentences:
    for offset, tag in enumerate(sentence.tags):
      if tag not in index:
        raise labelled.LabelledDataError(
            f"'{path}' line {sentence.line + offset}: tag {tag!r} is not one of "
            f"{', '.join(map(repr, labels))} (finetune.labels, or the training file's "
            "tags).")
      tag_ids.append(index[tag])
    if not sentence.tags:
      tag_ids.extend([-1] * len(sentence.words))
  lengths = [len(s.words) for s in sentences]
  return {
      "words": tf.RaggedTensor.from_row_lengths(
          tf.constant([w for s in sentences for w in s.words], tf.string), lengths),
      "tags": tf.RaggedTensor.from_row_lengths(np.asarray(tag_ids, np.int32), lengths),
      "example_index": np.arange(len(sentences), dtype=np.int32)}


@dataclasses.dataclass(frozen=True)
class Window:
  sentence: int  # the index of its sentence
  start: int  # the index of its first word in that sentence


def piece_counts(vocabulary, sentences: list[Sentence]) -> list[np.ndarray]:
  """The pieces of each word of each sentence, as encode_sentences makes them."""
  leading_space = getattr(vocabulary, "tokens_carry_leading_space", False)
  words = [" " + word if leading_space and index else word
           for sentence in sentences for index, word in enumerate(sentence.words)]
  pieces = vocabulary.tokenize_words_tf(tf.constant(words, tf.string)).merge_dims(1, 2)
  counts = pieces.row_lengths().numpy()
  return np.split(counts, np.cumsum([len(s.words) for s in sentences])[:-1])


def windows(sentences: list[Sentence], counts: list[np.ndarray], max_pieces: int
            ) -> tuple[list[Sentence], list[Window]]:
  """The sentences split into runs of whole words of at most `max_pieces` pieces (a
  sentence that fits stays whole; a word longer than that alone is cut as before), and
  where each run starts. A window after a sentence's first holds one piece less: its
  first word, without the space before it, may take one more (byte-level BPE)."""
  parts, places = [], []

  def add(index: int, sentence: Sentence, start: int, end: int):
    parts.append(Sentence(sentence.line + start, sentence.words[start:end],
                          sentence.tags[start:end]))
    places.append(Window(index, start))

  for index, (sentence, count) in enumerate(zip(sentences, counts)):
    start, used = 0, 0
    for word, pieces in enumerate(count):
      if word > start and used + pieces > max_pieces - (start > 0):
        add(index, sentence, start, word)
        start, used = word, 0
      used += pieces
    add(index, sentence, start, len(sentence.words))
  return parts, places


def encode_sentences(dataset: tf.data.Dataset, sequence_length: Mapping[str, int],
                     output_features: Mapping[str, seqio.Feature]) -> tf.data.Dataset:
  """{'words', 'tags', 'example_index'} -> the model's features, `tags` and `word_ids`
  ([length] each, -1 where no word starts) and `example_index`."""
  vocabulary = output_features["input_ids"].vocabulary
  seq_length = sequence_length["input_ids"]
  leading_space = getattr(vocabulary, "tokens_carry_leading_space", False)

  def encode(example):
    words = example["words"]
    if leading_space:  # ' word', as in running text (the first word has no space before)
      rest = words[1:]
      words = tf.concat([words[:1], tf.strings.join([tf.fill(tf.shape(rest), " "), rest])],
                        axis=0)
    pieces = vocabulary.tokenize_words_tf(words).merge_dims(1, 2)  # [words, pieces]
    ids = pieces.flat_values[:seq_length - 2]
    word_of_piece = pieces.value_rowids()[:seq_length - 2]
    first = tf.range(tf.size(ids, out_type=tf.int64)) == tf.gather(pieces.row_starts(),
                                                                  word_of_piece)
    word_of_piece = tf.cast(word_of_piece, tf.int32)
    word_ids = tf.where(first, word_of_piece, -1)
    tags = tf.where(first, tf.gather(example["tags"], word_of_piece), -1)
    features = example_tasks.single_sequence(
        tf.concat([[vocabulary.cls_id], ids, [vocabulary.sep_id]], axis=0))
    features["tags"] = tf.concat([[-1], tags, [-1]], axis=0)
    features["word_ids"] = tf.concat([[-1], word_ids, [-1]], axis=0)
    return {**example_tasks.pad_to(features, seq_length, example_tasks.MODEL_FEATURES),
            **example_tasks.pad_to(features, seq_length, ("tags", "word_ids"), value=-1),
            "example_index": example["example_index"]}

  return dataset.map(encode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def register_task(sentences: Mapping[str, callable], labels: tuple[str, ...],
                  sources: Mapping[str, str], vocabulary: seqio.Vocabulary,
                  vocab_description: dict, shuffle_buffer: int,
                  window_pieces: int = 0) -> seqio.Task:
  """The Task whose split `s` holds `sentences[s]()` (a list of Sentence read from
  `sources[s]`, a path or TFDS split, which names the Task with `window_pieces`, the
  length of the windows the sentences were cut into, if they were)."""
  cols = {split: (lambda split=split: columns(sentences[split](), labels, sources[split]))
          for split in sentences}
  description = [dict(sources), labels, vocab_description] + (
      [window_pieces] if window_pieces else [])
  return example_tasks.register("tag", description, cols, vocabulary, [encode_sentences],
                                shuffle_buffer)

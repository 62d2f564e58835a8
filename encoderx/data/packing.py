"""Rows packed full of whole sentences: RoBERTa's FULL-SENTENCES and DOC-SENTENCES.

A row holds one or more sequences `[CLS] sentences... [SEP]` (RoBERTa: `<s> ... </s>`),
each made of contiguous whole sentences of one document:

- full_sentences: sentences are taken in order until the row is full; when a document
  ends, the next document starts a new sequence in the same row. Rows are full but for
  the last one of a group of documents.
- doc_sentences: a row never holds two documents; a row ends with its document (and is
  padded), so documents' last rows are shorter. Also SpanBERT's input: single contiguous
  segments of up to the max length.

RoBERTa lets packed documents attend to each other, separated by an extra `</s>`; here each
sequence has its own segment id (attention stays inside it) and positions restarting at
0, so a packed row computes exactly what its sequences would compute in rows of their own
(tested), and packing only removes padding.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np

from encoderx.data import segment_pairs


def packed_features(sequences: list[list[tuple[np.ndarray, np.ndarray]]], seq_length: int,
                    special: segment_pairs.SpecialIds) -> dict:
  """Fixed-length features of a row; sequences are lists of (ids, word starts) sentences."""
  features = {name: np.zeros([seq_length], np.int32)
              for name in segment_pairs.TOKEN_FEATURES}
  features["input_ids"][:] = special.pad
  start = 0
  for segment, sentences in enumerate(sequences, start=1):
    ids = np.concatenate([[special.cls]] + [s for s, _ in sentences] + [[special.sep]])
    starts = np.concatenate([[1]] + [w for _, w in sentences] + [[1]])
    end = start + len(ids)
    features["input_ids"][start:end] = ids
    features["word_starts"][start:end] = starts
    features["segment_ids"][start:end] = segment
    features["positions"][start:end] = np.arange(len(ids))
    start = end
  return features


class SentencePacker:
  """Packs a group of documents into rows of whole sentences (see the module docstring)."""
  feature_names = segment_pairs.TOKEN_FEATURES

  def __init__(self, seq_length: int, special: segment_pairs.SpecialIds,
               cross_documents: bool):
    self.seq_length = seq_length
    self.special = special
    self.cross_documents = cross_documents

  def __call__(self, documents: list[segment_pairs.Document],
               rng: np.random.Generator) -> Iterator[dict]:
    del rng  # packing is deterministic; the document order is already shuffled
    row, sequence, used = [], [], 0
    for document in documents:
      # A sequence costs 2 tokens ([CLS], [SEP]) more than its sentences.
      document = segment_pairs.split_long_sentences(document, self.seq_length - 2)
      for sentence in zip(document.sentences, document.word_starts):
        cost = len(sentence[0]) + (0 if sequence else 2)
        if used + cost > self.seq_length:
          if sequence:
            row.append(sequence)
          yield packed_features(row, self.seq_length, self.special)
          row, sequence, used = [], [], 0
          cost = len(sentence[0]) + 2
        sequence.append(sentence)
        used += cost
      if sequence:
        row.append(sequence)
        sequence = []
      if row and not self.cross_documents:
        yield packed_features(row, self.seq_length, self.special)
        row, used = [], 0
    if row:
      yield packed_features(row, self.seq_length, self.special)


def padding_fraction(batches) -> float:
  """Share of positions that are padding, over batches with `segment_ids`."""
  padding = sum(int((b["segment_ids"] == 0).sum()) for b in batches)
  return padding / sum(b["segment_ids"].size for b in batches)

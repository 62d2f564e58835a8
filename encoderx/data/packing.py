"""Packed rows: RoBERTa's FULL-SENTENCES and DOC-SENTENCES, and best-fit packing.

A row holds one or more sequences `[CLS] sentences... [SEP]` (RoBERTa: `<s> ... </s>`),
each made of contiguous whole sentences of one document:

- full_sentences: sentences are taken in order until the row is full; when a document
  ends, the next document starts a new sequence in the same row. Rows are full but for
  the last one of a group of documents.
- doc_sentences: a row never holds two documents; a row ends with its document (and is
  padded), so documents' last rows are shorter. Also SpanBERT's input: single contiguous
  segments of up to the max length.

How full_sentences fills its rows (data.packing):

- greedy: in document order, as above; a row ends where the next sentence does not fit,
  so each row loses what is left of it at that sentence.
- best_fit: each document's tokens are cut, as one text, into sequences of the row's
  length (at a word start near it; so a sequence may start or end inside a sentence, as
  in ModernBERT's and EuroBERT's data, which are tokens, not sentences); then the
  sequences of the group of documents (data.document_pool) are placed longest first,
  each into the row whose free space fits it most tightly, a new row where none fits
  (best-fit decreasing bin packing; ModernBERT packs its batches by best fit:
  AnswerDotAI/ModernBERT src/sequence_packer.py GreedyBestFitSequencePacker, which takes
  sequences in arrival order over a buffer and one batch of rows at a time). Full pieces
  fill their rows; documents' last pieces and short documents fill what is left. Rows
  come out in the order they were opened; the same group gives the same rows (no
  randomness), so a resumed run reads the same rows. Whole sentences cost padding:
  cutting documents at sentence boundaries and packing those sequences by best fit
  leaves about as much as greedy at 512 and 1,024 tokens (each sentence-bounded piece
  ends short of the row, and a group has too few short pieces to fill those gaps).

RoBERTa lets packed documents attend to each other, separated by an extra `</s>`; here each
sequence has its own segment id (attention stays inside it) and positions restarting at
0, so a packed row computes exactly what its sequences would compute in rows of their own
(tested), and packing only removes padding.
"""
from __future__ import annotations

import bisect
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


Sentence = tuple[np.ndarray, np.ndarray]  # (token ids, word starts)
PACKINGS = ("greedy", "best_fit")  # data.packing


def document_pieces(document: segment_pairs.Document,
                    seq_length: int) -> list[list[Sentence]]:
  """`document`'s tokens as one text, cut into sequences of at most `seq_length` tokens
  with their [CLS] and [SEP] (at a word start where one is in the length's last half:
  segment_pairs.split_long_sentences); each a list of one (ids, word starts) piece."""
  if not document.sentences:
    return []
  joined = segment_pairs.Document(document.document_id,
                                  [np.concatenate(document.sentences)],
                                  [np.concatenate(document.word_starts)])
  pieces = segment_pairs.split_long_sentences(joined, seq_length - 2)
  return [[piece] for piece in zip(pieces.sentences, pieces.word_starts)]


def sequence_length(sequence: list[Sentence]) -> int:
  """Tokens of a sequence in a row: its sentences, [CLS] and [SEP]."""
  return 2 + sum(len(ids) for ids, _ in sequence)


def best_fit(lengths: list[int], capacity: int) -> list[list[int]]:
  """Rows of items of `lengths` (each at most `capacity`) by best-fit decreasing: the
  longest first (ties in their order), each into the row with the least free space that
  holds it, or a new row. [rows][indices of the row's items, in placing order]."""
  rows: list[list[int]] = []
  free: list[tuple[int, int]] = []  # (free space, row index), sorted
  for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):  # stable
    at = bisect.bisect_left(free, (lengths[index], -1))
    if at == len(free):
      rows.append([])
      row, left = len(rows) - 1, capacity
    else:
      left, row = free.pop(at)
    rows[row].append(index)
    if left - lengths[index] > 0:
      bisect.insort(free, (left - lengths[index], row))
  return rows


def best_fit_rows(sequences: list[list[Sentence]],
                  seq_length: int) -> list[list[list[Sentence]]]:
  """Rows of `sequences` (each at most `seq_length` tokens) by `best_fit`:
  [rows][sequences in the row][sentences]."""
  rows = best_fit([sequence_length(s) for s in sequences], seq_length)
  return [[sequences[index] for index in row] for row in rows]


class SentencePacker:
  """Packs a group of documents into rows of whole sentences (see the module docstring):
  `cross_documents` False is doc_sentences, True full_sentences, whose rows `packing`
  (PACKINGS) fills."""
  feature_names = segment_pairs.TOKEN_FEATURES

  def __init__(self, seq_length: int, special: segment_pairs.SpecialIds,
               cross_documents: bool, packing: str = "greedy"):
    if packing not in PACKINGS or (packing == "best_fit" and not cross_documents):
      raise ValueError(f"packing {packing!r} with cross_documents={cross_documents}")
    self.seq_length = seq_length
    self.special = special
    self.cross_documents = cross_documents
    self.packing = packing

  def __call__(self, documents: list[segment_pairs.Document],
               rng: np.random.Generator) -> Iterator[dict]:
    del rng  # packing is deterministic; the document order is already shuffled
    if self.packing == "best_fit":
      sequences = [s for d in documents for s in document_pieces(d, self.seq_length)]
      for row in best_fit_rows(sequences, self.seq_length):
        yield packed_features(row, self.seq_length, self.special)
      return
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

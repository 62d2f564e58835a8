"""XLNet's examples: every batch row a stream of consecutive chunks of one token stream,
each chunk continuing the row's chunk of the step before (segment recurrence).

zihangdai/xlnet's data_utils.py (`_create_data`, `batchify`, `create_tfrecords`,
`_split_a_and_b`), streamed over document sets instead of written to TFRecords once:

- A document set (a group of `document_pool` documents of the shuffled corpus) becomes
  one token stream: its documents in order, each followed by [SEP] (XLNet: <eod>);
  a document separator counts as a sentence of its own.
- The stream is cut into `rows` equal parts (XLNet's `batchify`), one per batch row. With
  bidirectional data it is cut into rows / 2 parts, each read forwards by one row and
  backwards (tokens, sentences and words reversed) by the row rows / 2 further
  (XLNet's `bwd_data`).
- Step t of a row, at i = t x reuse_len of its part: the part's tokens i .. i +
  reuse_len (the reused part: the previous step's began at i - reuse_len, so the memory
  of it is what precedes them), then segment A, sentences from i + reuse_len, and B: the
  sentences after A, or, half the time (and always when A reaches no sentence end), a
  random run of whole sentences elsewhere in the row's part; A and B are trimmed from
  their ends to fill the row exactly. The row is `reused A [SEP] B [SEP] [CLS]` (XLNet
  puts [SEP] [CLS] at the end), with token types 0 (reused, A and its [SEP]), 1 (B and
  its [SEP]) and 2 ([CLS]).
- Examples come out step by step, row by row: batch t (of `rows` examples) holds every
  row's step t. All rows of a document set start together, with `stream_start` 1 on
  their first step, where a memory of earlier steps must be forgotten.
A document set yields steps until its parts run out (a part's last reuse_len to
seq_length tokens are dropped, as batchify drops the stream's tail).
"""
from __future__ import annotations

import dataclasses
from typing import Iterator

import numpy as np

from encoderx.data import segment_pairs

# Besides TOKEN_FEATURES, a scalar per example: 1 on the first step of a document set,
# and 1 for a row read backwards.
STREAM_FEATURES = ("stream_start", "reversed")
TOKEN_TYPE_A, TOKEN_TYPE_B, TOKEN_TYPE_CLS = 0, 1, 2


@dataclasses.dataclass
class Part:
  """One row's token stream: ids, word starts and sentence starts, [tokens] each."""
  token_ids: np.ndarray
  word_starts: np.ndarray
  sentence_starts: np.ndarray

  def reversed(self) -> "Part":
    """The stream read backwards: a word (or sentence) starts where it ended."""
    def ends(starts):
      return np.append(starts[1:], 1)[::-1].copy()
    return Part(self.token_ids[::-1].copy(), ends(self.word_starts),
                ends(self.sentence_starts))

  def __len__(self) -> int:
    return len(self.token_ids)


def document_stream(documents: list[segment_pairs.Document], separator: int) -> Part:
  """The documents in order, each followed by `separator` (a sentence of its own)."""
  ids, words, sentences = [], [], []
  for document in documents:
    for tokens, starts in zip(document.sentences, document.word_starts):
      ids.append(tokens)
      words.append(starts)
      sentences.append(np.eye(1, len(tokens), dtype=np.int32)[0])
    ids.append(np.array([separator], np.int32))
    words.append(np.ones([1], np.int32))
    sentences.append(np.ones([1], np.int32))
  if not ids:
    return Part(*(np.zeros([0], np.int32) for _ in range(3)))
  return Part(np.concatenate(ids).astype(np.int32), np.concatenate(words).astype(np.int32),
              np.concatenate(sentences).astype(np.int32))


def split_a_and_b(part: Part, begin: int, total: int, rng: np.random.Generator
                  ) -> tuple[tuple[int, int], tuple[int, int]]:
  """(A, B) as [start, end) ranges of `part`, together `total` tokens, A from `begin`:
  XLNet's `_split_a_and_b`. Requires begin + total < len(part)."""
  starts, length = part.sentence_starts, len(part)
  end = begin + 1
  cuts = []  # sentence starts after `begin` where A may end
  while end < length:
    if starts[end]:
      if end - begin >= total:
        break
      cuts.append(end)
    end += 1
  if not cuts or rng.random() < 0.5:  # B from elsewhere in the stream
    a_end = end if not cuts else int(rng.choice(cuts))
    b_length = max(1, total - (a_end - begin))
    b_begin = int(rng.integers(0, length - b_length))  # XLNet: randint(0, len - 1 - b)
    b_end = b_begin + b_length
    while b_begin > 0 and not starts[b_begin]:  # whole sentences
      b_begin -= 1
    while b_end < length - 1 and not starts[b_end]:
      b_end += 1
  else:  # B continues A
    a_end = int(rng.choice(cuts))
    b_begin, b_end = a_end, end
  while (a_end - begin) + (b_end - b_begin) > total:
    if a_end - begin > b_end - b_begin:
      a_end -= 1
    else:
      b_end -= 1
  return (begin, a_end), (b_begin, b_end)


class StreamBuilder:
  """Turns a document set into rows of consecutive chunks (module docstring)."""
  feature_names = segment_pairs.TOKEN_FEATURES + STREAM_FEATURES
  scalar_features = STREAM_FEATURES

  def __init__(self, seq_length: int, reuse_len: int, rows: int,
               special: segment_pairs.SpecialIds, bi_data: bool = False):
    if bi_data and rows % 2:
      raise ValueError(f"bidirectional data needs an even number of rows, got {rows}")
    if not 0 < reuse_len < seq_length - 3:
      raise ValueError(f"reuse_len {reuse_len} must be in 1 .. seq_length - 4 = "
                       f"{seq_length - 4} ([SEP] B [SEP] [CLS] follow it)")
    self.seq_length, self.reuse_len, self.rows = seq_length, reuse_len, rows
    self.special, self.bi_data = special, bi_data

  def parts(self, stream: Part) -> list[Part]:
    """The rows' streams: equal consecutive parts (then, for bi_data, reversed)."""
    count = self.rows // 2 if self.bi_data else self.rows
    size = len(stream) // count
    parts = [Part(*(field[r * size:(r + 1) * size] for field in dataclasses.astuple(stream)))
             for r in range(count)]
    return parts + [part.reversed() for part in parts] if self.bi_data else parts

  def example(self, part: Part, step: int, rng: np.random.Generator, row: int) -> dict:
    """Row `row`'s example of step `step` (module docstring)."""
    special, begin = self.special, step * self.reuse_len
    (_, a_end), (b_start, b_end) = split_a_and_b(
        part, begin + self.reuse_len, self.seq_length - self.reuse_len - 3, rng)

    def words(start, end):  # a chunk cut inside a word starts a (partial) word
      starts = part.word_starts[start:end].copy()
      starts[:1] = 1
      return starts

    one = np.ones([1], np.int32)
    pieces = [  # (ids, word starts, token type): reused + A (contiguous), [SEP], B, ...
        (part.token_ids[begin:a_end], words(begin, a_end), TOKEN_TYPE_A),
        (np.array([special.sep], np.int32), one, TOKEN_TYPE_A),
        (part.token_ids[b_start:b_end], words(b_start, b_end), TOKEN_TYPE_B),
        (np.array([special.sep], np.int32), one, TOKEN_TYPE_B),
        (np.array([special.cls], np.int32), one, TOKEN_TYPE_CLS)]
    n = sum(len(ids) for ids, _, _ in pieces)
    features = {name: np.zeros([self.seq_length], np.int32)
                for name in segment_pairs.TOKEN_FEATURES}
    features["input_ids"][:] = special.pad
    features["input_ids"][:n] = np.concatenate([ids for ids, _, _ in pieces])
    features["word_starts"][:n] = np.concatenate([starts for _, starts, _ in pieces])
    features["token_type_ids"][:n] = np.concatenate(
        [np.full(len(ids), kind, np.int32) for ids, _, kind in pieces])
    features["segment_ids"][:n] = 1
    features["positions"][:n] = np.arange(n)
    features["stream_start"] = np.int32(step == 0)
    features["reversed"] = np.int32(self.bi_data and row >= self.rows // 2)
    return features

  def steps(self, part_length: int) -> int:
    """Steps a part of this length gives (XLNet: while i + seq_len <= len)."""
    if part_length < self.seq_length:
      return 0
    return (part_length - self.seq_length) // self.reuse_len + 1

  def __call__(self, documents: list[segment_pairs.Document], rng: np.random.Generator
               ) -> Iterator[dict]:
    stream = document_stream(documents, self.special.sep)
    parts = self.parts(stream)
    for step in range(self.steps(len(parts[0]))):
      for row, part in enumerate(parts):
        yield self.example(part, step, rng, row)

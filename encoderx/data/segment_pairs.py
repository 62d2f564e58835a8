"""Sentence-aware segment pairs `[CLS] A [SEP] B [SEP]` for NSP (BERT) and SOP (ALBERT).

The algorithm is BERT's `create_instances_from_document` (google-research/bert,
create_pretraining_data.py): sentences of a document are gathered into chunks of a
target length (shorter with `short_seq_prob`), each chunk is cut at a random sentence
boundary into A and B; with probability 1/2 B is replaced by a run of sentences from
another document (label 1, "NotNext") and the unused sentences go back to the document.
The pair is then truncated, one token at a time from the longer segment, at a random
end, so both segments survive.

Sentence-order prediction (ALBERT's `create_instances_from_document` with
random_next_sentence=False) uses no other document: B is always A's continuation, and
with probability 1/2 the truncated pair is swapped (label 1, as Hugging Face
`AlbertForPreTraining`'s sentence_order_label).

Where this differs from BERT, and why:
- a chunk of one sentence (a one-sentence document, a long sentence) that must be a real
  next pair is split at a word boundary; BERT makes every such chunk random-next, which
  tips the labels away from 50/50. A one-word chunk is random-next.
- a sentence longer than the max length is cut into pieces (at word starts) instead of
  being truncated away.
- the short target length is drawn for every chunk, not once per document: drawn per
  document, a long document that draws a short target yields dozens of short examples,
  so far more than `short_seq_prob` of the examples are short (25% under 64 tokens at
  length 512 on the Austen chapters); drawn per chunk, about that share of examples is.
- random segments come from the other documents of a group of `document_pool`
  documents of the (shuffled) stream, not the whole corpus in memory, so the builder
  streams.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable, Iterator

import numpy as np

IS_NEXT, NOT_NEXT = 0, 1  # NSP labels
IN_ORDER, SWAPPED = 0, 1  # SOP labels
LABEL_MODES = ("nsp", "sop")


def label_mode(objective_names) -> str | None:
  """The pairs' labels the objectives ask for: the first of `objective_names` that is a
  sentence-level objective ('nsp', 'sop'), or None."""
  return next((name for name in objective_names if name in LABEL_MODES), None)
# The [seq_length] features of every pretraining example; pairs add `sentence_label`.
TOKEN_FEATURES = ("input_ids", "token_type_ids", "segment_ids", "positions", "word_starts")


@dataclasses.dataclass
class Document:
  """A tokenized document: token ids and word-start flags, one array per sentence."""
  document_id: int
  sentences: list[np.ndarray]
  word_starts: list[np.ndarray]

  @classmethod
  def from_flat(cls, document_id, token_ids, word_starts, sentence_lengths) -> "Document":
    bounds = np.cumsum(sentence_lengths)[:-1]
    sentences = [s for s in np.split(token_ids, bounds)]
    starts = [s for s in np.split(word_starts, bounds)]
    keep = [i for i, s in enumerate(sentences) if len(s)]
    return cls(int(document_id), [sentences[i] for i in keep], [starts[i] for i in keep])


@dataclasses.dataclass(frozen=True)
class SpecialIds:
  pad: int
  cls: int
  sep: int


def split_long_sentences(document: Document, max_tokens: int) -> Document:
  """Cuts sentences longer than `max_tokens` into pieces, at word starts where possible."""
  sentences, starts = [], []
  for tokens, word_starts in zip(document.sentences, document.word_starts):
    while len(tokens) > max_tokens:
      cut = max_tokens
      candidates = np.flatnonzero(word_starts[max_tokens // 2:max_tokens + 1])
      if len(candidates):
        cut = max_tokens // 2 + candidates[-1]
      sentences.append(tokens[:cut])
      starts.append(word_starts[:cut])
      tokens, word_starts = tokens[cut:], word_starts[cut:].copy()
      word_starts[0] = 1
    sentences.append(tokens)
    starts.append(word_starts)
  return Document(document.document_id, sentences, starts)


def _concat(parts):
  return np.concatenate(parts) if parts else np.zeros([0], np.int32)


def _truncate_pair(a, b, max_tokens, rng):
  """BERT's truncate_seq_pair: trim the longer segment at a random end until they fit."""
  (a_ids, a_starts), (b_ids, b_starts) = a, b
  a_lo, a_hi, b_lo, b_hi = 0, len(a_ids), 0, len(b_ids)
  while (a_hi - a_lo) + (b_hi - b_lo) > max_tokens:
    if a_hi - a_lo > b_hi - b_lo:
      if rng.random() < 0.5:
        a_lo += 1
      else:
        a_hi -= 1
    elif rng.random() < 0.5:
      b_lo += 1
    else:
      b_hi -= 1
  a_starts, b_starts = a_starts[a_lo:a_hi].copy(), b_starts[b_lo:b_hi].copy()
  a_starts[:1] = 1  # a segment cut inside a word starts a (partial) word
  b_starts[:1] = 1
  return (a_ids[a_lo:a_hi], a_starts), (b_ids[b_lo:b_hi], b_starts)


def pair_features(a, b, label: int, seq_length: int, special: SpecialIds) -> dict:
  """Fixed-length features of `[CLS] A [SEP] B [SEP]`, padded to `seq_length`."""
  (a_ids, a_starts), (b_ids, b_starts) = a, b
  n = len(a_ids) + len(b_ids) + 3
  input_ids = np.full([seq_length], special.pad, np.int32)
  input_ids[:n] = np.concatenate([[special.cls], a_ids, [special.sep], b_ids, [special.sep]])
  token_type_ids = np.zeros([seq_length], np.int32)
  token_type_ids[len(a_ids) + 2:n] = 1
  word_starts = np.zeros([seq_length], np.int32)
  # Special tokens count as words of their own, so no word spans across them.
  word_starts[:n] = np.concatenate([[1], a_starts, [1], b_starts, [1]])
  segment_ids = np.zeros([seq_length], np.int32)
  segment_ids[:n] = 1
  positions = np.zeros([seq_length], np.int32)
  positions[:n] = np.arange(n)
  return dict(input_ids=input_ids, token_type_ids=token_type_ids, segment_ids=segment_ids,
              positions=positions, word_starts=word_starts,
              sentence_label=np.int32(label))


class SentencePairBuilder:
  """Turns a group of documents into NSP or SOP examples (see the module docstring)."""
  feature_names = TOKEN_FEATURES + ("sentence_label",)
  scalar_features = ("sentence_label",)

  def __init__(self, seq_length: int, short_seq_prob: float, special: SpecialIds,
               label_mode: str = "nsp"):
    if label_mode not in LABEL_MODES:
      raise ValueError(f"label_mode {label_mode!r} is not one of {LABEL_MODES}")
    self.seq_length = seq_length
    self.max_tokens = seq_length - 3
    self.short_seq_prob = short_seq_prob
    self.special = special
    self.label_mode = label_mode

  def __call__(self, documents: list[Document], rng: np.random.Generator
               ) -> Iterator[dict]:
    """Pairs of every document; random segments come from the group's other documents.

    A group of one document (the last of an epoch, at worst) makes real next pairs only,
    and so does SOP, which never reads other documents.
    """
    documents = [split_long_sentences(d, self.max_tokens) for d in documents]
    documents = [d for d in documents if d.sentences]
    for index, document in enumerate(documents):
      others = documents[:index] + documents[index + 1:] if self.label_mode == "nsp" else []
      yield from self._document_pairs(document, others, rng)

  def _random_segment(self, others, target, rng):
    """Sentences from a random other document, about `target` tokens."""
    other = others[rng.integers(len(others))]
    start = rng.integers(len(other.sentences))
    ids, starts, length = [], [], 0
    for i in range(start, len(other.sentences)):
      ids.append(other.sentences[i])
      starts.append(other.word_starts[i])
      length += len(other.sentences[i])
      if length >= target:
        break
    return _concat(ids), _concat(starts)

  def _target_length(self, rng) -> int:
    if rng.random() < self.short_seq_prob:
      return int(rng.integers(2, self.max_tokens + 1))
    return self.max_tokens

  def _document_pairs(self, document, others, rng) -> Iterator[dict]:
    sentences, word_starts = document.sentences, document.word_starts
    target = self._target_length(rng)
    chunk, length, i = [], 0, 0
    while i < len(sentences):
      chunk.append(i)
      length += len(sentences[i])
      if i == len(sentences) - 1 or length >= target:
        a_end = int(rng.integers(1, len(chunk))) if len(chunk) >= 2 else 1
        a_ids = _concat([sentences[j] for j in chunk[:a_end]])
        a_starts = _concat([word_starts[j] for j in chunk[:a_end]])
        label = NOT_NEXT if others and rng.random() < 0.5 else IS_NEXT
        if label == IS_NEXT and len(chunk) >= 2:
          b_ids = _concat([sentences[j] for j in chunk[a_end:]])
          b_starts = _concat([word_starts[j] for j in chunk[a_end:]])
        elif label == IS_NEXT:  # one sentence: split it at a word start
          cuts = np.flatnonzero(a_starts[1:]) + 1
          if len(cuts):
            cut = cuts[len(cuts) // 2]
            a_ids, b_ids = a_ids[:cut], a_ids[cut:]
            a_starts, b_starts = a_starts[:cut], a_starts[cut:]
          elif others:
            label = NOT_NEXT
          else:
            b_ids, b_starts = a_ids[:0], a_starts[:0]  # one word, no partner: skipped
        if label == NOT_NEXT:
          b_ids, b_starts = self._random_segment(others, max(target - len(a_ids), 1), rng)
          i -= len(chunk) - a_end  # the unused sentences start the next chunk
        a, b = _truncate_pair((a_ids, a_starts), (b_ids, b_starts), self.max_tokens, rng)
        if self.label_mode == "sop" and rng.random() < 0.5:
          a, b, label = b, a, SWAPPED
        if len(a[0]) and len(b[0]):
          yield pair_features(a, b, label, self.seq_length, self.special)
        chunk, length = [], 0
        target = self._target_length(rng)
      i += 1

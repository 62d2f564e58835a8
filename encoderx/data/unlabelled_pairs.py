"""(anchor, positive) pairs made from unlabelled text, and batches of one source each.

contrastive.pairs_from = "crops" follows Contriever (Izacard et al. 2021, "Unsupervised
Dense Information Retrieval with Contrastive Learning", section 3.2, independent
cropping): each document gives two independent random spans, each of 10%-50% of it.
Contriever crops tokens; the spans here are of whitespace words, so that a pair is made
on the host before tokenization (the Task's rows are texts) and a crop never cuts a
word piece in two; a word is a close, tokenizer-independent stand-in for its pieces.

contrastive.pairs_from = "ict" follows the inverse cloze task (Lee et al. 2019,
"Latent Retrieval for Weakly Supervised Open Domain Question Answering", ORQA, section
7): a random sentence of a passage is the query and the rest of the passage its
positive, the sentence left in the passage with probability 0.1 (so that the model also
learns word matching). A passage's sentences are its lines with data.sentence_per_line,
else its text split after '.', '!' or '?' followed by whitespace.

Both are pure functions of (documents, seed): a run draws new pairs each epoch from
the epoch's seed, and the same seed draws the same pairs (resume replays them).

source_batch_order follows sentence-transformers' ProportionalBatchSampler and
RoundRobinBatchSampler (sentence_transformers/base/sampler.py): every batch holds the
rows of one source (another source's positives would be easy negatives), the sources
drawn in proportion to their number of batches, or in turn until the smallest runs out.
"""
from __future__ import annotations

import re
from typing import Sequence

import numpy as np

# Contriever's span bounds, as fractions of the document.
CROP_RATIOS = (0.1, 0.5)
# ORQA: the query sentence is kept in its passage with this probability.
ICT_KEEP_PROBABILITY = 0.1
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
PAIRS_FROM = ("", "crops", "ict")
SOURCE_SAMPLINGS = ("proportional", "round_robin")


def crop(words: Sequence[str], rng: np.random.Generator,
         ratios: tuple[float, float] = CROP_RATIOS) -> list[str]:
  """A random span of `words` of between ratios[0] and ratios[1] of them (at least 1)."""
  low = max(1, int(np.ceil(ratios[0] * len(words))))
  high = max(low, int(ratios[1] * len(words)))
  length = int(rng.integers(low, high + 1))
  start = int(rng.integers(0, len(words) - length + 1))
  return list(words[start:start + length])


def crop_pairs(documents: Sequence[str], seed: int) -> dict[str, list[str]]:
  """{'text': a crop of each document, 'text_pair': another, independent crop}."""
  rng = np.random.default_rng(seed)
  anchors, positives = [], []
  for document in documents:
    words = document.split()
    anchors.append(" ".join(crop(words, rng)))
    positives.append(" ".join(crop(words, rng)))
  return {"text": anchors, "text_pair": positives}


def sentences(passage: str, sentence_per_line: bool = False) -> list[str]:
  """The passage's sentences: its lines, or its text split at sentence ends."""
  parts = passage.split("\n") if sentence_per_line else SENTENCE_END.split(passage)
  return [part.strip() for part in parts if part.strip()]


def ict_pairs(passages: Sequence[Sequence[str]], seed: int,
              keep_probability: float = ICT_KEEP_PROBABILITY) -> dict[str, list[str]]:
  """passages: each one's sentences (at least 2) -> {'text': a random sentence,
  'text_pair': the passage without it, or with it at probability keep_probability}."""
  rng = np.random.default_rng(seed)
  queries, positives = [], []
  for passage in passages:
    chosen = int(rng.integers(len(passage)))
    keep = rng.random() < keep_probability
    queries.append(passage[chosen])
    positives.append(" ".join(sentence for i, sentence in enumerate(passage)
                              if keep or i != chosen))
  return {"text": queries, "text_pair": positives}


def passages(documents: Sequence[Sequence[str]], pairs_from: str,
             sentence_per_line: bool = False) -> list[str]:
  """Documents (lists of text blocks) -> the texts pairs are made from: each document's
  text (crops), or each passage's sentences, one a line (ict: a paragraph, or a whole
  document of one sentence a line; passages of one sentence dropped)."""
  if pairs_from == "crops":
    return [" ".join(blocks) for blocks in documents]
  found = ([list(blocks)] if sentence_per_line else
           [sentences(block) for block in blocks] for blocks in documents)
  return ["\n".join(passage) for parts in found for passage in parts if len(passage) > 1]


def make_pairs(pairs_from: str, texts: Sequence[str], seed: int) -> dict[str, list[str]]:
  """An epoch's pairs of `texts` (as `passages` gives them) from its seed."""
  if pairs_from == "crops":
    return crop_pairs(texts, seed)
  return ict_pairs([text.split("\n") for text in texts], seed)


def source_batch_order(orders: Sequence[Sequence[int]], batch_size: int, seed: int,
                       sampling: str = "proportional") -> list[int]:
  """orders[s]: source s's rows in their epoch order (its no-duplicates order) ->
  the rows of whole batches, each batch_size consecutive rows of one source, the
  sources' batches interleaved by `sampling` (a source's last partial batch dropped)."""
  batches = [[list(order[start:start + batch_size])
              for start in range(0, len(order) - batch_size + 1, batch_size)]
             for order in orders]
  if sampling == "round_robin":  # ST: in turn, until the smallest source runs out
    rounds = min(len(source) for source in batches)
    sequence = [s for _ in range(rounds) for s in range(len(batches))]
  else:  # ST's ProportionalBatchSampler: each source's batches, in a random order
    sequence = [s for s, source in enumerate(batches) for _ in source]
    sequence = [sequence[i] for i in np.random.default_rng(seed).permutation(len(sequence))]
  taken = [0] * len(batches)
  rows = []
  for source in sequence:
    rows.extend(batches[source][taken[source]])
    taken[source] += 1
  return rows

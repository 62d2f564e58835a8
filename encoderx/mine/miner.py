"""Hard negatives for (anchor, positive) pairs, as sentence-transformers 6.2 mines them
(the command: mine/__main__.py).

Mirrors `sentence_transformers/util/hard_negatives.py: mine_hard_negatives` with
`use_faiss=True` and no cross-encoder, step by step:

- the anchors are deduplicated (a repeated anchor is one query with several positives);
  the corpus is the separate corpus, or the positives, with every positive added, deduplicated;
- anchors and corpus are embedded and normalized, each text after its prompt, and each
  anchor's `range_max + max_positives` nearest corpus texts found exactly by faiss
  (`retrieval.search`, IndexFlatIP: the cosine). An anchor's prompt is chosen as
  `SentenceTransformer.encode_query` chooses it (sentence_transformers/
  sentence_transformer/model.py; `_resolve_prompt` in base/model.py): `query_prompt`,
  else the model's prompt named `query_prompt_name`, else its `query` prompt, else none
  (never its default prompt); a corpus text's as `encode_document` does, with
  `corpus_prompt`, `corpus_prompt_name` and the model's `document` prompt. Unlike there,
  a prompt given both by name and as text stops rather than the name being ignored, and
  a name the model lacks stops even where sentence-transformers' implicit empty
  `query` / `document` prompts would answer it;
- candidates are skipped: the anchor's own positives (unless `include_positives`), those
  scored above the anchor's lowest positive score minus `absolute_margin`, or minus
  `relative_margin` times its magnitude, those above `max_score` or below `min_score`;
- of the `range_max` best left, the first `range_min` are dropped, and `num_negatives`
  taken: the best ("top") or drawn at random from those not skipped ("random", seeded:
  Python's `random.Random(seed).sample`, the draws of `random.seed(seed)` there), best first;
- rows are written per (anchor, positive), grouped by anchor in the order anchors first
  appear: "triplet" one row per negative found, "n-tuple" one row with `negative_1..k`
  where all k were found, "labeled-pair" (anchor, text, label 1/0), "labeled-list"
  (anchor, [positive, negatives], labels).

    from encoderx import embed, mine
    options = mine.MiningOptions(num_negatives=3, absolute_margin=0.05)
    mined = mine.mine(pairs, embed.Embedder("hf:DIR", normalize=True), options)
"""
from __future__ import annotations

import collections
import dataclasses
import random
from typing import Callable

import numpy as np

from encoderx import embed
from encoderx import errors
from encoderx import retrieval

SAMPLING_STRATEGIES = ("top", "random")
OUTPUT_FORMATS = ("triplet", "n-tuple", "labeled-pair", "labeled-list")


class MiningError(errors.UserError, ValueError):
  """Mining options or data that cannot work; `argument` names the option."""


def _fail(argument: str, message: str, remedy: str = ""):
  raise MiningError(message, argument=argument, remedy=remedy)


@dataclasses.dataclass(frozen=True)
class MiningOptions:
  """mine_hard_negatives' options (same names, same meaning); checked when made."""
  range_min: int = 0
  range_max: int | None = None  # None: derived from the other options and the data
  max_score: float | None = None
  min_score: float | None = None
  absolute_margin: float | None = None
  relative_margin: float | None = None
  num_negatives: int = 3
  sampling_strategy: str = "top"
  include_positives: bool = False
  output_format: str = "triplet"
  seed: int = 0  # of the "random" draws
  query_prompt: str | None = None  # before each anchor; None: as query_prompt_name says
  query_prompt_name: str | None = None  # None: the model's "query" prompt, if any
  corpus_prompt: str | None = None
  corpus_prompt_name: str | None = None  # None: the model's "document" prompt, if any

  def __post_init__(self):
    if self.num_negatives < 1:
      _fail("num_negatives", f"num_negatives must be at least 1, got {self.num_negatives}.")
    if self.range_min < 0:
      _fail("range_min", f"range_min must be non-negative, got {self.range_min}.")
    if self.absolute_margin is not None and self.absolute_margin < 0:
      _fail("absolute_margin", f"absolute_margin must be >= 0 (the least distance between "
            f"a negative's score and the positive's), got {self.absolute_margin}.")
    if self.relative_margin is not None and not 0 <= self.relative_margin < 1:
      _fail("relative_margin", "relative_margin must be in [0, 1) (a fraction of the "
            f"positive's score), got {self.relative_margin}.")
    if self.sampling_strategy not in SAMPLING_STRATEGIES:
      _fail("sampling_strategy", f"sampling_strategy {self.sampling_strategy!r} is not one "
            f"of {', '.join(SAMPLING_STRATEGIES)}.")
    if self.output_format not in OUTPUT_FORMATS:
      _fail("output_format", f"output_format {self.output_format!r} is not one of "
            f"{', '.join(OUTPUT_FORMATS)}.")
    if self.include_positives and self.output_format != "n-tuple":
      _fail("include_positives", "include_positives keeps the ranking only in n-tuple "
            "rows; set output_format to n-tuple.", remedy="output_format")
    if self.range_max is not None:
      self.checked_range_max(1)
    for side, texts in (("query", "anchor"), ("corpus", "candidate")):
      prompt, name = getattr(self, f"{side}_prompt"), getattr(self, f"{side}_prompt_name")
      if prompt is not None and name is not None:
        _fail(f"{side}_prompt_name", f"{side}_prompt_name={name!r} and {side}_prompt="
              f"{prompt!r} both set the prompt before each {texts}: give one.")

  def prompts(self, model_prompts: dict) -> tuple[str, str]:
    """(before each anchor, before each corpus text): the prompt given, else the model's
    prompt of the name given, else its "query" / "document" prompt, else none
    (embed.task_prompt)."""
    def prompt(side: str, task: str) -> str:
      text, name = getattr(self, f"{side}_prompt"), getattr(self, f"{side}_prompt_name")
      if text is not None:
        return text
      if name is not None:
        return embed.named_prompt(model_prompts, name, argument=f"{side}_prompt_name")
      return embed.task_prompt(model_prompts, task)
    return prompt("query", "query"), prompt("corpus", "document")

  @property
  def filters_by_score(self) -> bool:
    return (self.absolute_margin is not None or self.relative_margin is not None
            or self.max_score is not None)

  def checked_range_max(self, max_positives: int) -> int:
    """range_max, or the one derived as sentence-transformers derives it (room for the
    positives, and ten times the negatives when scores may skip some), checked."""
    range_max = self.range_max
    if range_max is None:
      range_max = (self.range_min + self.num_negatives * (10 if self.filters_by_score else 1)
                   + max_positives)
    if self.range_min >= range_max:
      _fail("range_min", f"range_min must be smaller than range_max, got range_min="
            f"{self.range_min} and range_max={range_max}.", remedy="range_max")
    if self.num_negatives > range_max - self.range_min:
      _fail("num_negatives", f"cannot mine {self.num_negatives} negatives per anchor: only "
            f"{range_max - self.range_min} candidates remain after skipping the first "
            f"range_min={self.range_min} of range_max={range_max}.", remedy="range_max")
    return range_max


@dataclasses.dataclass
class Mined:
  """The rows with negatives (`columns` name their fields) and what the summary reports."""
  columns: list[str]
  rows: list[dict]
  pairs: int  # (anchor, positive) rows read
  anchors: int  # unique anchors
  corpus: int  # unique candidate texts
  positive_scores: np.ndarray  # [unique (anchor, positive) pairs]
  negative_scores: np.ndarray  # [negatives written]
  skipped: dict[str, tuple[int, float]]  # option -> (candidates skipped, their fraction)
  missing: int  # rows (or negatives) that could not be filled
  possible: int  # what `missing` is out of


def max_positives(anchors: list[str]) -> int:
  """The most rows any anchor has (sentence-transformers counts repeated pairs too)."""
  return max(collections.Counter(anchors).values())


def select_negatives(scores: np.ndarray, indices: np.ndarray,
                     positive_indices: list[list[int]], positive_scores: np.ndarray,
                     options: MiningOptions, range_max: int):
  """The filters and sampling of mine_hard_negatives on the nearest corpus texts.

  scores, indices: float32 / int [anchors, candidates] from the search, best first (-1
  where the corpus ran out); positive_indices: each anchor's positives in the corpus;
  positive_scores: [pairs], the anchors' positives in that order. Returns (negative
  corpus indices [anchors, num_negatives], their scores (-inf: none found), skipped)."""
  scores = np.array(scores, np.float32)
  scores[indices == -1] = -np.inf
  if not options.include_positives:
    scores[np.stack([np.isin(row, own) for row, own in zip(indices, positive_indices)])
           ] = -np.inf
  candidates, skipped = scores.size, {}

  def skip(option: str, removed: np.ndarray, counts_as_candidates: bool = True):
    nonlocal candidates
    if removed.any():
      skipped[option] = (int(removed.sum()), int(removed.sum()) / candidates)
      candidates -= int(removed.sum()) if counts_as_candidates else 0
    scores[removed] = -np.inf

  # Margins are kept from the anchor's lowest positive score (its hardest positive).
  starts = np.cumsum([0] + [len(p) for p in positive_indices])
  lowest = np.array([positive_scores[a:b].min() for a, b in zip(starts[:-1], starts[1:])],
                    np.float32)[:, None]
  if options.absolute_margin is not None:
    skip("absolute_margin", scores + np.float32(options.absolute_margin) > lowest)
  if options.relative_margin is not None:
    threshold = lowest - np.abs(lowest) * np.float32(options.relative_margin)
    skip("relative_margin", scores > threshold)
  if options.max_score is not None:
    skip("max_score", scores > np.float32(options.max_score), counts_as_candidates=False)
  if options.min_score is not None:
    skip("min_score", scores < np.float32(options.min_score), counts_as_candidates=False)

  order = np.argsort(-scores, axis=1, kind="stable")[:, :range_max][:, options.range_min:]
  indices = np.take_along_axis(indices, order, 1)
  scores = np.take_along_axis(scores, order, 1)
  k = options.num_negatives
  if options.sampling_strategy == "top":
    return indices[:, :k], scores[:, :k], skipped
  draw = random.Random(options.seed)
  options_per_row = np.maximum(np.isfinite(scores).sum(1), k)  # -inf only if too few
  chosen = np.array([draw.sample(range(n), k=k) for n in options_per_row]).reshape(-1, k)
  indices, scores = np.take_along_axis(indices, chosen, 1), np.take_along_axis(scores, chosen, 1)
  best_first = np.argsort(-scores, axis=1, kind="stable")
  return (np.take_along_axis(indices, best_first, 1), np.take_along_axis(scores, best_first, 1),
          skipped)


def _unit(vectors: np.ndarray) -> np.ndarray:
  return vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)


def mine(pairs: list[tuple[str, str]], embed_texts: Callable[..., np.ndarray],
         options: MiningOptions, corpus: list[str] | None = None,
         anchor_column: str = "anchor", positive_column: str = "positive",
         show_progress: bool = False) -> Mined:
  """Negatives for `pairs` [(anchor, positive)] from `corpus` (default: the positives).

  `embed_texts(texts, show_progress, description, prompt=...)` -> [texts, dim]: an
  embed.Embedder, whose `prompts` are the model's (a callable without them has none);
  options.prompts() says what is put before the anchors and the corpus texts."""
  query_prompt, corpus_prompt = options.prompts(getattr(embed_texts, "prompts", {}))
  anchors_all = [anchor for anchor, _ in pairs]
  positives = [positive for _, positive in pairs]
  range_max = options.checked_range_max(max_positives(anchors_all))
  corpus = list(dict.fromkeys((positives if corpus is None else list(corpus)) + positives))
  corpus_row = {text: row for row, text in enumerate(corpus)}
  anchors = list(dict.fromkeys(anchors_all))
  anchor_row = {text: row for row, text in enumerate(anchors)}
  positive_indices = [[] for _ in anchors]
  for anchor, positive in pairs:
    own = positive_indices[anchor_row[anchor]]
    if corpus_row[positive] not in own:
      own.append(corpus_row[positive])

  corpus_vectors = _unit(embed_texts(corpus, show_progress, "corpus", prompt=corpus_prompt))
  anchor_vectors = _unit(embed_texts(anchors, show_progress, "anchors", prompt=query_prompt))
  width = range_max + max_positives(anchors_all)
  scores, indices = retrieval.search(anchor_vectors, corpus_vectors, width)
  short = width - scores.shape[1]  # padded as faiss pads a search past the corpus
  scores = np.pad(scores, [(0, 0), (0, short)], constant_values=-np.inf)
  indices = np.pad(indices, [(0, 0), (0, short)], constant_values=-1)
  pair_anchor = [a for a, own in enumerate(positive_indices) for _ in own]
  pair_positive = [p for own in positive_indices for p in own]
  positive_scores = np.sum(anchor_vectors[pair_anchor] * corpus_vectors[pair_positive], -1)

  negatives, negative_scores, skipped = select_negatives(
      scores, indices, positive_indices, positive_scores, options, range_max)
  columns, rows, kept, possible = _rows(
      options, anchors, corpus, positive_indices, negatives, negative_scores,
      positive_scores, anchor_column, positive_column, len(pairs))
  return Mined(columns, rows, len(pairs), len(anchors), len(corpus), positive_scores,
               kept, skipped, possible - len(rows), possible)


def _rows(options, anchors, corpus, positive_indices, negatives, negative_scores,
          positive_scores, anchor_column, positive_column, pairs):
  """(columns, rows, the scores of the negatives written, rows possible) of the format."""
  k, rows, kept = options.num_negatives, [], []
  pair = 0
  for a, anchor in enumerate(anchors):
    found = np.isfinite(negative_scores[a])
    texts = [corpus[i] for i in negatives[a]]
    if options.output_format == "labeled-pair":
      rows += [{anchor_column: anchor, positive_column: corpus[p], "label": 1}
               for p in positive_indices[a]]
      rows += [{anchor_column: anchor, positive_column: t, "label": 0}
               for t, ok in zip(texts, found) if ok]
    for p in positive_indices[a]:
      positive, pair = corpus[p], pair + 1
      if options.output_format == "triplet":
        rows += [{anchor_column: anchor, positive_column: positive, "negative": t}
                 for t, ok in zip(texts, found) if ok]
      elif options.output_format == "n-tuple" and found.all():
        rows.append({anchor_column: anchor, positive_column: positive,
                     **{f"negative_{i}": t for i, t in enumerate(texts, start=1)}})
      elif options.output_format == "labeled-list" and found.any():
        chosen = [t for t, ok in zip(texts, found) if ok]
        rows.append({anchor_column: anchor, positive_column: [positive] + chosen,
                     "labels": [1] + [0] * len(chosen)})
      if options.output_format != "n-tuple" or found.all():
        kept.append(negative_scores[a][found])
  columns = {
      "triplet": [anchor_column, positive_column, "negative"],
      "n-tuple": [anchor_column, positive_column,
                  *(f"negative_{i}" for i in range(1, k + 1))],
      "labeled-pair": [anchor_column, positive_column, "label"],
      "labeled-list": [anchor_column, positive_column, "labels"],
  }[options.output_format]
  possible = {"triplet": pair * k, "n-tuple": pair, "labeled-list": pair,
              "labeled-pair": len(anchors) * k + pairs}[options.output_format]
  kept = np.concatenate(kept) if kept else np.zeros([0], np.float32)
  return columns, rows, kept, possible


def summary(mined: Mined, options: MiningOptions) -> str:
  """One paragraph: rows in and out, negatives per row, mean scores, what was skipped."""
  def mean(values):
    return f"{float(np.mean(values)):.4f}" if len(values) else "-"
  text = (f"Mined {len(mined.rows):,} {options.output_format} rows from {mined.pairs:,} "
          f"pairs ({mined.anchors:,} unique anchors, {mined.corpus:,} candidate texts), "
          f"{options.num_negatives} negatives per anchor ({options.sampling_strategy}); "
          f"{len(mined.negative_scores):,} negatives written. Mean score: positives "
          f"{mean(mined.positive_scores)}, negatives {mean(mined.negative_scores)}.")
  for option, (count, ratio) in mined.skipped.items():
    text += (f" Skipped {count:,} potential negatives ({ratio:.2%}) due to the {option} of "
             f"{getattr(options, option)}.")
  if mined.missing > 0:
    text += (f" Could not find enough negatives for {mined.missing} samples "
             f"({mined.missing / mined.possible:.2%}): widen range_max, or loosen the "
             "margins and max_score.")
  return text

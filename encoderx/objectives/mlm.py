"""Masked language modelling: choose, corrupt and predict tokens, words, n-grams or spans.

What is masked is `MlmConfig.unit`:

- "token" (BERT): per row, round(rate x candidates) tokens (at least one, at most
  `max_predictions`), where candidates are the non-special, non-padding tokens.
- "word" (BERT whole-word masking), "ngram" (ALBERT: n whole words, n <= max_ngram with
  p(n) proportional to 1/n) and "span" (SpanBERT: n whole words, n ~ Geometric(p)
  restricted to 1..max_span_words). A unit's length n is drawn, then its start uniformly
  among the word starts where n free words follow in one sequence, apart from every
  unit already taken (so no unit overlaps, touches another, holds a special or padding
  token, or crosses a sequence boundary). Units are taken until rate x candidates tokens
  are masked: see `select_units` for how that masks 15% on average without biasing the
  unit lengths.

Of the chosen tokens, `mask_token_prob` become [MASK], `random_token_prob` random
non-special tokens, the rest stay (BERT: 0.8 / 0.1 / 0.1; ELECTRA's generator input,
google-research/electra pretrain_helpers.mask: 0.85 / 0 / 0.15); for units the choice is
made once per unit (the whole span is [MASK], or random tokens, or kept). All chosen
tokens are predicted.
This runs on device at every step (every step and epoch sees fresh masks), as BERT's
create_pretraining_data, ALBERT's n-gram and SpanBERT's span masking did offline.

Besides the MLM targets every prediction carries its unit's boundary tokens (the tokens
just before and after it) and its offset inside the unit: the inputs of SBO.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from encoderx.objectives import base


# What MLM masks (MlmConfig.unit); the whole-word units give every masked unit boundary
# tokens, which SBO predicts it from.
UNITS = ("token", "word", "ngram", "span")
WHOLE_WORD_UNITS = ("word", "ngram", "span")


def config_section() -> ml_collections.ConfigDict:
  """config.objective.mlm: BERT's masking."""
  return ml_collections.ConfigDict(dict(
      rate=0.15,  # ModernBERT 0.3, NeoBERT 0.2
      # The rate over the run, as (until_step, rate) pieces: rate r_i for the steps
      # before until_i, from the end of the previous piece; the last piece ends at
      # train.steps. mmBERT: ((s1, 0.3), (s2, 0.15), (steps, 0.05)). Empty: `rate`.
      rate_schedule=(),
      # The rate of held-out evaluations (ModernBERT evaluates at 0.15 whatever it trains
      # at); 0: `rate`.
      eval_rate=0.0,
      mask_token_prob=0.8,
      random_token_prob=0.1,
      max_predictions=20,
      # The cap in the long-sequence phase (train.long_fraction; BERT: 80 at 512).
      long_max_predictions=80,
      # What is masked: "token" (BERT), "word" (whole-word masking, BERT-wwm), "ngram"
      # (n whole words, p(n) ~ 1/n, n <= max_ngram: ALBERT) or "span" (SpanBERT: n whole
      # words, n ~ Geometric(span_geometric_p) on 1..max_span_words). Words come from the
      # batch's word_starts.
      unit="token",
      max_ngram=3,
      span_geometric_p=0.2,
      max_span_words=10,
  ))


@dataclasses.dataclass(frozen=True)
class MlmConfig:
  mask_id: int
  special_ids: tuple[int, ...]
  vocab_size: int  # of the tokenizer; random replacements are drawn below it
  rate: float = 0.15
  mask_token_prob: float = 0.8
  random_token_prob: float = 0.1
  max_predictions: int = 20
  unit: str = "token"
  max_ngram: int = 3
  span_geometric_p: float = 0.2
  max_span_words: int = 10
  rate_schedule: tuple[tuple[int, float], ...] = ()
  eval_rate: float = 0.0

  def rate_at(self, step: jax.Array | None):
    """The masking rate at train step `step` (traced, int32): a pure function of the
    step, so a resumed run masks as an unbroken one. None: the evaluation's rate."""
    if step is None:
      return self.eval_rate or self.rate
    if not self.rate_schedule:
      return self.rate
    ends = jnp.asarray([end for end, _ in self.rate_schedule], jnp.int32)
    rates = jnp.asarray([rate for _, rate in self.rate_schedule], jnp.float32)
    piece = jnp.searchsorted(ends, step, side="right")  # the pieces that ended by `step`
    return rates[jnp.minimum(piece, len(self.rate_schedule) - 1)]

  @property
  def replacement_ids(self) -> np.ndarray:
    return np.setdiff1d(np.arange(self.vocab_size), self.special_ids).astype(np.int32)

  @property
  def unit_length_probabilities(self) -> np.ndarray:
    """p(n) of a unit's length in words, n = 1, 2, ... (not for unit 'token')."""
    if self.unit == "word":
      weights = np.ones(1)
    elif self.unit == "ngram":
      weights = 1.0 / np.arange(1, self.max_ngram + 1)
    elif self.unit == "span":
      # SpanBERT's "Geo(0.2) clipped at 10" is, in its code, the geometric restricted to
      # 1..10 and renormalized (mean 3.8 words); piling the tail on 10 would give 4.5.
      p = self.span_geometric_p
      weights = p * (1.0 - p) ** np.arange(self.max_span_words)
    else:
      raise ValueError(f"unit {self.unit!r} has no length distribution.")
    return weights / weights.sum()


def candidate_mask(batch: dict, special_ids: tuple[int, ...]) -> jax.Array:
  """[batch, length] bool: tokens that may be masked (real, not special)."""
  special = jnp.isin(batch["input_ids"], jnp.asarray(special_ids, jnp.int32))
  return (batch["segment_ids"] > 0) & ~special


def masking_budget(candidates: jax.Array, config: MlmConfig, rate=None) -> jax.Array:
  """[batch] tokens to mask: round(rate x candidates), at least 1, at most the cap;
  `rate` (a float or a traced scalar) defaults to config.rate."""
  num_candidates = candidates.sum(axis=1)
  rate = config.rate if rate is None else rate
  return jnp.clip(jnp.round(rate * num_candidates).astype(jnp.int32),
                  jnp.minimum(num_candidates, 1), config.max_predictions)


def corrupt(batch: dict, key: jax.Array, positions: jax.Array, weights: jax.Array,
            config: MlmConfig, unit_starts: jax.Array | None = None) -> dict:
  """Applies [MASK] / random / keep at `positions` [batch, predictions] where `weights`.

  `unit_starts` (same shape: the first position of each prediction's unit) makes the
  choice once per unit: predictions of a unit read the draw at its first token. Without
  it every prediction draws its own (BERT). Random tokens are drawn per token.
  Returns the batch with corrupted `input_ids` and the targets `masked_positions`,
  `masked_ids` (the original tokens) and `masked_weights` (1.0 for real predictions).
  """
  input_ids = jnp.asarray(batch["input_ids"])  # also called on host (numpy) batches
  action_key, random_key = jax.random.split(key)
  original = jnp.take_along_axis(input_ids, positions, axis=1)
  if unit_starts is None:
    action = jax.random.uniform(action_key, positions.shape)
  else:
    action = jnp.take_along_axis(jax.random.uniform(action_key, input_ids.shape),
                                 unit_starts, axis=1)
  replacements = jnp.asarray(config.replacement_ids)
  random_ids = replacements[jax.random.randint(random_key, positions.shape, 0,
                                               replacements.shape[0])]
  new = jnp.where(action < config.mask_token_prob, config.mask_id,
                  jnp.where(action < config.mask_token_prob + config.random_token_prob,
                            random_ids, original))
  return {**batch, "input_ids": place(input_ids, positions, weights, new),
          "masked_positions": positions, "masked_ids": original,
          "masked_weights": weights.astype(jnp.float32)}


def place(sequence: jax.Array, positions: jax.Array, weights: jax.Array,
          values: jax.Array) -> jax.Array:
  """`sequence` [batch, length] with `values` [batch, predictions] written at `positions`
  where `weights` (elsewhere it keeps its own). Positions of a row are distinct, as every
  selection here makes them: the corruption above, and ELECTRA's generator samples and
  replaced-token labels (encoderx/methods/electra.py)."""
  rows = jnp.arange(sequence.shape[0])[:, None]
  current = jnp.take_along_axis(sequence, positions, axis=1)
  return sequence.at[rows, positions].set(jnp.where(weights, values, current))


def select_tokens(key: jax.Array, candidates: jax.Array, num_to_mask: jax.Array,
                  max_predictions: int) -> tuple[jax.Array, jax.Array]:
  """Picks `num_to_mask` random candidates per row, as sorted positions + weights.

  Positions [batch, max_predictions]; unused slots (weight False) come last.
  """
  scores = jnp.where(candidates, jax.random.uniform(key, candidates.shape), -1.0)
  _, positions = jax.lax.top_k(scores, max_predictions)
  weights = jnp.arange(max_predictions)[None, :] < num_to_mask[:, None]
  length = candidates.shape[1]
  order = jnp.argsort(jnp.where(weights, positions, length + positions), axis=1)
  return (jnp.take_along_axis(positions, order, axis=1).astype(jnp.int32),
          jnp.take_along_axis(weights, order, axis=1))


def _shift_right(x: jax.Array, fill) -> jax.Array:
  """x[:, t - 1] at t (fill at t = 0)."""
  return jnp.pad(x[:, :-1], ((0, 0), (1, 0)), constant_values=fill)


def _shift_left(x: jax.Array, fill) -> jax.Array:
  """x[:, t + 1] at t (fill at the end)."""
  return jnp.pad(x[:, 1:], ((0, 0), (0, 1)), constant_values=fill)


def _words(batch: dict, candidates: jax.Array):
  """The words of every row, numbered 0, 1, ... in order; [batch, length] arrays.

  A word starts where `word_starts` says, and also at every special or padding token
  (each is a word of its own) and where a packed sequence starts, so no word mixes
  candidates with other tokens or crosses a sequence. Returns
  (word of each token, first token of each word with `length` after the last word,
  whether each word may be masked, whether each word starts a new sequence).
  """
  length = candidates.shape[1]
  segments = jnp.asarray(batch["segment_ids"])
  starts = ((jnp.asarray(batch["word_starts"]) > 0) | ~candidates
            | ~_shift_right(candidates, False) | (segments != _shift_right(segments, -1)))
  word_of_token = jnp.cumsum(starts, axis=1) - 1
  first_token = jax.vmap(lambda s: jnp.nonzero(s, size=length, fill_value=length)[0])(starts)
  exists = first_token < length
  at_first = jnp.minimum(first_token, length - 1)
  word_candidate = exists & jnp.take_along_axis(candidates, at_first, axis=1)
  word_segment = jnp.take_along_axis(segments, at_first, axis=1)
  new_sequence = word_segment != _shift_right(word_segment, -1)
  return word_of_token, first_token, word_candidate, new_sequence


def select_units(key: jax.Array, batch: dict, candidates: jax.Array,
                 num_to_mask: jax.Array, config: MlmConfig) -> jax.Array:
  """[batch, length] bool: the tokens of whole-word units chosen per row.

  Up to max_predictions units are drawn per row and taken in order by a
  `lax.while_loop`, each step vectorized over the batch, until every row is done (a
  step that no row needs would change nothing, so stopping early keeps the masks a
  function of the key alone, whatever the devices). Whether a unit is taken never
  depends on its own length, so the taken units keep the sampled length distribution
  (Wald's identity): it is taken while the masked count, plus the part of a unit
  expected past the budget when it crosses it (E[x^2] / 2 E[x] for x, the unit's
  length in tokens, from the length distribution and the row's pieces per word), plus a
  dither in [-1/2, 1/2) per row (the count is an integer), is at most the budget. The
  last unit then overshoots as much as it undershoots, and rate x candidates tokens are
  masked on average. (SpanBERT cuts the last span to fit and BERT-wwm skips units that
  overflow: both shorten the units.) A unit is also skipped when no room is left for
  it, or when it would pass max_predictions, the cap of the output shapes: set that
  about a unit above rate x length so that it rarely happens.
  """
  probabilities = config.unit_length_probabilities
  lengths_in_words = np.arange(1, len(probabilities) + 1)
  mean, mean_square = (probabilities * lengths_in_words).sum(), (
      probabilities * lengths_in_words ** 2).sum()
  batch_size, length = candidates.shape
  word_of_token, first_token, word_candidate, new_sequence = _words(batch, candidates)
  # Pieces per candidate word, first and second moments over the row's words.
  pieces = jnp.where(word_candidate, jnp.diff(first_token, axis=1, append=length), 0)
  num_words = jnp.maximum(word_candidate.sum(axis=1), 1)
  pieces_mean = pieces.sum(axis=1) / num_words
  pieces_variance = (pieces ** 2).sum(axis=1) / num_words - pieces_mean ** 2
  # E[x^2] / 2 E[x] for x = the pieces of n words, n from the length distribution.
  crossing = (pieces_variance / pieces_mean + pieces_mean * mean_square / mean) / 2
  length_key, start_key, dither_key = jax.random.split(key, 3)
  dither = jax.random.uniform(dither_key, (batch_size,)) - 0.5
  # One past the last word resolves to `length`: the token after a unit at the end.
  first_token = jnp.pad(first_token, ((0, 0), (0, 1)), constant_values=length)
  word = jnp.arange(length)[None, :]
  steps = config.max_predictions
  unit_lengths = jax.random.choice(length_key, lengths_in_words, (steps, batch_size),
                                   p=probabilities)

  def active(count):  # rows that still take units
    return (num_to_mask > 0) & ((count == 0) | (count + crossing + dither <= num_to_mask))

  def take_one(state):
    masked, count, step = state  # masked words [batch, length], masked tokens [batch]
    n = unit_lengths[step]  # [batch] this step's unit lengths in words
    free = word_candidate & ~masked
    barrier = ~free | new_sequence
    # First barrier after each word: where a run of free words of one sequence ends.
    next_barrier = _shift_left(
        jax.lax.cummin(jnp.where(barrier, word, length), axis=1, reverse=True), length)
    run = jnp.where(free, next_barrier - word, 0)
    after = jnp.minimum(word + n[:, None], length - 1)
    masked_after = jnp.take_along_axis(masked, after, axis=1) & (word + n[:, None] < length)
    valid = (run >= n[:, None]) & ~_shift_right(masked, False) & ~masked_after
    scores = jnp.where(valid, jax.random.uniform(jax.random.fold_in(start_key, step),
                                                 valid.shape), -1.0)
    start = jnp.argmax(scores, axis=1)
    end = jnp.minimum(start + n, length)  # one past the unit's last word
    tokens = (jnp.take_along_axis(first_token, end[:, None], axis=1)[:, 0]
              - jnp.take_along_axis(first_token, start[:, None], axis=1)[:, 0])
    take = (active(count) & valid.any(axis=1)
            & (count + tokens <= config.max_predictions))
    unit = take[:, None] & (word >= start[:, None]) & (word < end[:, None])
    return masked | unit, count + jnp.where(take, tokens, 0), step + 1

  def not_done(state):
    _, count, step = state
    return (step < steps) & active(count).any()

  initial = (jnp.zeros((batch_size, length), bool), jnp.zeros((batch_size,), jnp.int32),
             jnp.zeros((), jnp.int32))
  masked, _, _ = jax.lax.while_loop(not_done, take_one, initial)
  return jnp.take_along_axis(masked, word_of_token, axis=1) & candidates


def chosen_positions(chosen: jax.Array, max_predictions: int
                     ) -> tuple[jax.Array, jax.Array]:
  """[batch, length] bool -> positions [batch, max_predictions] in order + weights.

  Unused slots (weight False) come last and hold distinct unchosen positions.
  """
  length = chosen.shape[1]
  position = jnp.arange(length)[None, :]
  _, positions = jax.lax.top_k(jnp.where(chosen, 2 * length - position, length - position),
                               max_predictions)
  return positions.astype(jnp.int32), jnp.take_along_axis(chosen, positions, axis=1)


def unit_extents(chosen: jax.Array) -> tuple[jax.Array, jax.Array]:
  """First and last position of the run of chosen tokens each token is in: [batch, length].

  Units never touch, so runs are units.
  """
  length = chosen.shape[1]
  position = jnp.arange(length)[None, :]
  first = chosen & ~_shift_right(chosen, False)
  last = chosen & ~_shift_left(chosen, False)
  return (jax.lax.cummax(jnp.where(first, position, 0), axis=1),
          jax.lax.cummin(jnp.where(last, position, length - 1), axis=1, reverse=True))


def mask_tokens(batch: dict, key: jax.Array, config: MlmConfig, rate=None) -> dict:
  """Masks the batch by `config.unit` (see the module docstring) at `rate` (default
  config.rate; a traced scalar from `MlmConfig.rate_at` under a schedule); pure and
  jit-able.

  Returns the batch with corrupted `input_ids` and, per prediction [batch,
  max_predictions]: `masked_positions`, `masked_ids`, `masked_weights`, and
  `masked_unit_left` / `masked_unit_right` (the positions of the tokens just before and
  after its unit) and `masked_unit_offset` (its position inside the unit); with unit
  'token' a unit is the token itself. Unused slots hold 0.
  """
  select_key, corrupt_key = jax.random.split(key)
  candidates = candidate_mask(batch, config.special_ids)
  num_to_mask = masking_budget(candidates, config, rate)
  if config.unit == "token":
    positions, weights = select_tokens(select_key, candidates, num_to_mask,
                                       config.max_predictions)
    masked = corrupt(batch, corrupt_key, positions, weights, config)
    first, last = positions, positions
  else:
    chosen = select_units(select_key, batch, candidates, num_to_mask, config)
    positions, weights = chosen_positions(chosen, config.max_predictions)
    first, last = (jnp.take_along_axis(extent, positions, axis=1)
                   for extent in unit_extents(chosen))
    masked = corrupt(batch, corrupt_key, positions, weights, config, unit_starts=first)
  length = candidates.shape[1]
  masked["masked_unit_left"] = jnp.where(weights, jnp.maximum(first - 1, 0), 0)
  masked["masked_unit_right"] = jnp.where(weights, jnp.minimum(last + 1, length - 1), 0)
  masked["masked_unit_offset"] = jnp.where(weights, positions - first, 0)
  return masked


def prediction_count(batch: dict) -> jax.Array:
  """The number of masked predictions in a prepared batch (at least 1): a loss divisor."""
  return jnp.maximum(jnp.sum(batch["masked_weights"]), 1.0)


@dataclasses.dataclass(frozen=True)
class MaskedLanguageModel:
  config: MlmConfig
  name: str = "mlm"
  head: str = "mlm"

  def prepare(self, batch: dict, key: jax.Array, step: jax.Array | None = None) -> dict:
    """Masks at the rate of train step `step` (None: the evaluation's rate)."""
    return mask_tokens(batch, key, self.config, self.config.rate_at(step))

  def denominator(self, batch: dict) -> jax.Array:
    return prediction_count(batch)

  def terms(self, outputs: dict, batch: dict) -> dict[str, jax.Array]:
    return base.classification_terms(outputs["mlm_logits"], batch["masked_ids"],
                                     batch["masked_weights"])

"""Masked language modelling (BERT): choose, corrupt and predict tokens.

Per row, round(rate x candidates) tokens are chosen (at least one, at most
`max_predictions`), where candidates are the non-special, non-padding tokens. Of the
chosen, `mask_token_prob` become [MASK], `random_token_prob` a random non-special token,
and the rest stay as they are; all of them are predicted. This is BERT's
create_pretraining_data rule, run on device at every step instead of once offline, so
every step (and every epoch) sees fresh masks.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from encoderx.objectives import base


@dataclasses.dataclass(frozen=True)
class MlmConfig:
  mask_id: int
  special_ids: tuple[int, ...]
  vocab_size: int  # of the tokenizer; random replacements are drawn below it
  rate: float = 0.15
  mask_token_prob: float = 0.8
  random_token_prob: float = 0.1
  max_predictions: int = 20

  @property
  def replacement_ids(self) -> np.ndarray:
    return np.setdiff1d(np.arange(self.vocab_size), self.special_ids).astype(np.int32)


def candidate_mask(batch: dict, special_ids: tuple[int, ...]) -> jax.Array:
  """[batch, length] bool: tokens that may be masked (real, not special)."""
  special = jnp.isin(batch["input_ids"], jnp.asarray(special_ids, jnp.int32))
  return (batch["segment_ids"] > 0) & ~special


def corrupt(batch: dict, key: jax.Array, positions: jax.Array, weights: jax.Array,
            config: MlmConfig) -> dict:
  """Applies [MASK] / random / keep at `positions` [batch, predictions] where `weights`.

  Returns the batch with corrupted `input_ids` and the targets `masked_positions`,
  `masked_ids` (the original tokens) and `masked_weights` (1.0 for real predictions).
  """
  input_ids = jnp.asarray(batch["input_ids"])  # also called on host (numpy) batches
  action_key, random_key = jax.random.split(key)
  original = jnp.take_along_axis(input_ids, positions, axis=1)
  action = jax.random.uniform(action_key, positions.shape)
  replacements = jnp.asarray(config.replacement_ids)
  random_ids = replacements[jax.random.randint(random_key, positions.shape, 0,
                                               replacements.shape[0])]
  new = jnp.where(action < config.mask_token_prob, config.mask_id,
                  jnp.where(action < config.mask_token_prob + config.random_token_prob,
                            random_ids, original))
  new = jnp.where(weights, new, original)
  rows = jnp.arange(input_ids.shape[0])[:, None]
  return {**batch, "input_ids": input_ids.at[rows, positions].set(new),
          "masked_positions": positions, "masked_ids": original,
          "masked_weights": weights.astype(jnp.float32)}


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


def mask_tokens(batch: dict, key: jax.Array, config: MlmConfig) -> dict:
  """BERT's token-level masking (see the module docstring); pure and jit-able."""
  select_key, corrupt_key = jax.random.split(key)
  candidates = candidate_mask(batch, config.special_ids)
  num_candidates = candidates.sum(axis=1)
  num_to_mask = jnp.clip(jnp.round(config.rate * num_candidates).astype(jnp.int32),
                         jnp.minimum(num_candidates, 1), config.max_predictions)
  positions, weights = select_tokens(select_key, candidates, num_to_mask,
                                     config.max_predictions)
  return corrupt(batch, corrupt_key, positions, weights, config)


@dataclasses.dataclass(frozen=True)
class MaskedLanguageModel:
  config: MlmConfig
  name: str = "mlm"
  head: str = "mlm"

  def prepare(self, batch: dict, key: jax.Array) -> dict:
    return mask_tokens(batch, key, self.config)

  def denominator(self, batch: dict) -> jax.Array:
    return jnp.maximum(jnp.sum(batch["masked_weights"]), 1.0)

  def terms(self, outputs: dict, batch: dict) -> dict[str, jax.Array]:
    return base.classification_terms(outputs["mlm_logits"], batch["masked_ids"],
                                     batch["masked_weights"])

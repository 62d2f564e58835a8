"""Permutation language modelling (XLNet): what each row predicts, its factorization
order and the attention masks that order gives the two streams; one pure JAX function
of the batch and a key, run on device at every step (key = fold_in(seed, step)).

It follows zihangdai/xlnet's data_utils.py, which did the same offline (the predicted
spans, `_sample_mask`, when writing TFRecords) and in its input pipeline (the order and
masks, `_local_perm`, applied by `get_dataset`'s parser to the reused part of a row and
to the rest apart). A row is `reuse_len` tokens that continue the previous row's, then
the new tokens (encoderx/data/row_streams.py); per row:

1. Targets (partial prediction, span-based): whole-word n-grams, n <= max_span_words
   with p(n) ∝ 1/n, sampled until 1/K of the candidate tokens (not special, not
   padding) of each part are covered, in the reused part and in the rest apart (XLNet
   splits its `num_predict` between them the same way). The sampling is the project's
   one n-gram sampler, `mlm.select_units` (unit 'ngram'): units never overlap, touch or
   cross a part, and their lengths keep the 1/n distribution. XLNet's own sampler puts
   each n-gram at a random offset in a context of n x K tokens and tops up with single
   tokens to exactly num_predict; both cover 1/K of the tokens. (Its word test also
   reads the n-gram's first piece instead of the current one, so its "n-grams" are n
   tokens; here they are n words.)
2. Factorization order: the part's positions in blocks of `perm_size`, the same random
   permutation in every block (`_local_perm`'s shuffled [perm_size, blocks] index).
   Tokens that are neither targets nor [SEP] / [CLS] come first, all at once (XLNet's
   rank -1: they see each other and everything sees them, and none of them sees a
   target); targets and [SEP] / [CLS] follow in the sampled order, so the targets are
   the last 1/K of the order. The whole reused part precedes the rest (the rest sees all
   of it, it sees nothing of the rest), as `get_dataset` concatenates the two masks.
3. Masks: the query stream of token i sees token j when j comes earlier in the order
   (or, for a token that is not a target, j is i: XLNet's `self_rev_index`); the
   content stream sees those and itself (encoderx/models/two_stream_attention.py).
   Padding is never seen.

The targets are the tokens themselves: the content stream reads them unchanged, only
the query stream (which never sees its own token) predicts them.
"""
from __future__ import annotations

import dataclasses

import jax
import ml_collections
import jax.numpy as jnp

from encoderx.objectives import base, mlm


def config_section() -> ml_collections.ConfigDict:
  """config.objective.plm (method 'xlnet'): XLNet's values at length 512."""
  return ml_collections.ConfigDict(dict(
      # The last 1/K of each factorization order is predicted: 1/K of the tokens.
      partial_prediction_k=6,
      num_predict=85,  # prediction slots per row (a cap, like max_predictions)
      max_span_words=5,  # predicted n-grams of 1..n whole words, p(n) ~ 1/n
      perm_size=256,  # orders permute blocks of this many tokens
      # A row's first reuse_len tokens continue the previous step's row; their hidden
      # states are what the memory keeps.
      reuse_len=256,
      mem_len=384,  # tokens of previous steps each layer attends to; 0: no memory
      # Half of the rows read their stream backwards, with negated relative positions
      # (XLNet's bidirectional data pipeline).
      bi_data=False,
  ))


@dataclasses.dataclass(frozen=True)
class PlmConfig:
  special_ids: tuple[int, ...]  # never predicted (padding, [CLS], [SEP], [MASK], <unk>)
  functional_ids: tuple[int, ...]  # [SEP] and [CLS]: ordered like targets, never predicted
  prediction_k: int = 6  # the last 1/K of each order is predicted
  max_span_words: int = 5
  num_predict: int = 85  # prediction slots per row
  perm_size: int = 256
  reuse_len: int = 256

  def part_caps(self) -> tuple[int, int]:
    """Prediction slots of the reused part and of the rest (XLNet's halves)."""
    if not self.reuse_len:
      return 0, self.num_predict
    return self.num_predict - self.num_predict // 2, self.num_predict // 2

  def span_config(self, cap: int) -> mlm.MlmConfig:
    """mlm.select_units' settings for a part (selection only: nothing is corrupted)."""
    return mlm.MlmConfig(mask_id=0, special_ids=self.special_ids, vocab_size=0,
                         rate=1.0 / self.prediction_k, max_predictions=cap, unit="ngram",
                         max_ngram=self.max_span_words)


def _parts(length: int, reuse_len: int) -> jax.Array:
  """[length] int32: 0 for the reused part, 1 for the rest."""
  return (jnp.arange(length) >= reuse_len).astype(jnp.int32)


def sample_targets(batch: dict, key: jax.Array, config: PlmConfig) -> jax.Array:
  """[batch, length] bool: the tokens to predict (step 1 of the module docstring)."""
  candidates = mlm.candidate_mask(batch, config.special_ids)
  parts = _parts(candidates.shape[1], config.reuse_len)
  targets = jnp.zeros_like(candidates)
  for part, cap in enumerate(config.part_caps()):
    if not cap:
      continue
    in_part = candidates & (parts == part)[None, :]
    span_config = config.span_config(cap)
    targets |= mlm.select_units(jax.random.fold_in(key, part), batch, in_part,
                                mlm.masking_budget(in_part, span_config), span_config)
  return targets


def factorization_order(key: jax.Array, targets: jax.Array, functional: jax.Array,
                        config: PlmConfig) -> jax.Array:
  """[batch, length] int32: each token's place in its row's factorization order (step
  2); tokens with the same place (the unpredicted context) come together."""
  batch_size, length = targets.shape
  parts = _parts(length, config.reuse_len)
  offset_in_part = jnp.arange(length) - jnp.where(parts == 1, config.reuse_len, 0)
  block, slot = offset_in_part // config.perm_size, offset_in_part % config.perm_size
  rank = jnp.zeros((batch_size, length), jnp.int32)
  for part in range(2):
    permutation = jnp.argsort(jax.random.uniform(jax.random.fold_in(key, part),
                                                 (batch_size, config.perm_size)), axis=1)
    ranks = block * config.perm_size + jnp.take_along_axis(
        permutation, jnp.broadcast_to(slot, (batch_size, length)), axis=1)
    rank = jnp.where(parts == part, ranks, rank)
  ordered = targets | functional
  # The rest starts after the reused part's last rank (reuse_len - 1) and its own
  # context (one place), so all of it comes after all of the reused part.
  part_start = jnp.where(parts == 1, config.reuse_len + 1, 0)
  return (part_start + jnp.where(ordered, rank, -1)).astype(jnp.int32)


def query_stream_visibility(order: jax.Array, targets: jax.Array,
                            real: jax.Array) -> jax.Array:
  """[batch, length, length] bool: token i's query stream may attend to token j (step 3)."""
  before = order[:, None, :] < order[:, :, None]
  same_or_before = order[:, None, :] <= order[:, :, None]
  return jnp.where(targets[:, :, None], before, same_or_before) & real[:, None, :]


def prepare(batch: dict, key: jax.Array, config: PlmConfig) -> dict:
  """The batch with, per row, `perm_visible` [batch, length, length] bool (see
  query_stream_visibility) and the predictions [batch, num_predict]: `target_positions`
  (in order; unused slots last), `target_ids` and `target_weights` (1.0 real)."""
  target_key, order_key = jax.random.split(key)
  input_ids = jnp.asarray(batch["input_ids"])
  real = jnp.asarray(batch["segment_ids"]) > 0
  targets = sample_targets(batch, target_key, config)
  functional = jnp.isin(input_ids, jnp.asarray(config.functional_ids, jnp.int32)) & real
  order = factorization_order(order_key, targets, functional, config)
  positions, weights = mlm.chosen_positions(targets, config.num_predict)
  return {**batch, "perm_visible": query_stream_visibility(order, targets, real),
          "target_positions": positions,
          "target_ids": jnp.take_along_axis(input_ids, positions, axis=1),
          "target_weights": weights.astype(jnp.float32)}


def prediction_count(batch: dict) -> jax.Array:
  """Predictions in a prepared batch (at least 1): the loss divisor."""
  return jnp.maximum(jnp.sum(batch["target_weights"]), 1.0)


def terms(logits: jax.Array, batch: dict) -> dict[str, jax.Array]:
  """Cross-entropy and accuracy sums of the predictions (logits [batch, predictions,
  vocab])."""
  return base.classification_terms(logits, batch["target_ids"], batch["target_weights"])

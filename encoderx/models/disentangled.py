"""DeBERTa's disentangled self-attention: `model.attention.variant="disentangled"`.

Attention scores are content->content plus, from relative distances, content->position
(c2p: a query's content against the key's distance embedding) and position->content
(p2c: the query's distance embedding against the key's content):

    score(q, k) = (Q_q.K_k + Q_q.Kr_{d(q,k)} + K_k.Qr_{d(q,k)}) / sqrt(3 head_dim)

with d(q, k) the relative distance position_q - position_k put in log buckets, and
Kr / Qr the distance embeddings projected by the content key / query projections
(`share_att_key`, DeBERTa-v2/v3) or by their own. The distance embeddings (2 x span
rows, span = position_buckets, or max_relative_positions without buckets) and their
LayerNorm belong to the encoder stack, shared by every layer, and are computed once per
forward pass by `RelativePositionContext` (the variant's context module), together with
the embedding row of every (query, key) pair.

Distances come from `positions`, which restart in each packed sequence: a packed row
computes what its sequences compute alone (and the mask keeps them apart).

Followed: Hugging Face transformers `models/deberta_v2/modeling_deberta_v2.py`
(`DisentangledSelfAttention.forward` / `disentangled_attention_bias`,
`make_log_bucket_position`, `DebertaV2Encoder.get_rel_embedding`), which the parity tests
compare against, and microsoft/DeBERTa `DeBERTa/deberta/disentangled_attention.py` and
`da_utils.py` (`build_relative_position_from_abs`: distances from absolute positions).
One difference between the two, for distances beyond max_relative_positions - 1 (which
512-token inputs never reach with the v2/v3 default 512): DeBERTa's code clamps the
distance first, Hugging Face does not (its far-left bucket is row 0, DeBERTa's row 1);
encoderx follows Hugging Face.
"""
from __future__ import annotations

import functools

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from encoderx import errors
from encoderx.models import model_config
from encoderx.models import attention, common
from encoderx.models import dropout as dropout_lib

TERMS = ("c2p", "p2c")
# Logical shape of scores: [batch, heads, query, key].
SCORE_AXES = ("activation_batch", "activation_heads", "activation_length", None)


def span(config: model_config.ModelConfig) -> int:
  """Rows of the distance table on each side of 0 (the table has 2 x span rows)."""
  return config.attention.position_buckets if config.attention.position_buckets > 0 else (
      config.attention.max_relative_positions)


def log_buckets(distance: np.ndarray, buckets: int, max_position: int) -> np.ndarray:
  """DeBERTa's log buckets: distances within +-buckets/2 stay, farther ones shrink
  logarithmically so that max_position - 1 maps to buckets - 1 (odd: f(-d) = -f(d)).

  In float32 as Hugging Face's `make_log_bucket_position` computes it (tested equal).
  """
  sign = np.sign(distance)
  mid = buckets // 2
  magnitude = np.where(np.abs(distance) < mid, mid - 1, np.abs(distance))
  ratio = (np.log(magnitude.astype(np.float32) / np.float32(mid))
           / np.log(np.float32((max_position - 1) / mid)))
  logarithmic = np.ceil(ratio * np.float32(mid - 1)) + mid
  return np.where(magnitude <= mid, distance, logarithmic * sign).astype(np.int32)


@functools.lru_cache(maxsize=32)
def distance_rows(config: model_config.ModelConfig, length: int) -> np.ndarray:
  """[2 * length - 1] int32: the distance table's row for each distance -(length-1) ..
  length-1 (bucketed, shifted by span, clipped into the table)."""
  distance = np.arange(-(length - 1), length, dtype=np.int32)
  if config.attention.position_buckets > 0:
    distance = log_buckets(distance, config.attention.position_buckets,
                           config.attention.max_relative_positions)
  width = span(config)
  return np.clip(distance + width, 0, 2 * width - 1).astype(np.int32)


def relative_rows(positions: jax.Array, config: model_config.ModelConfig) -> jax.Array:
  """[batch, length] positions -> [batch, query, key] int32 distance-table rows of
  d(q, k) = position_q - position_k."""
  length = positions.shape[-1]
  distance = positions[:, :, None] - positions[:, None, :]
  distance = jnp.clip(distance, -(length - 1), length - 1)  # positions are < length
  return jnp.asarray(distance_rows(config, length))[distance + length - 1]


@flax.struct.dataclass
class RelativePositions:
  """What every disentangled layer is given (`LayerContext.relative`)."""
  embeddings: jax.Array  # [2 * span, hidden]: the distance embeddings after LayerNorm
  rows: jax.Array  # [batch, query, key] int32: the row of embeddings for each pair

  def at_queries(self, indices: jax.Array) -> "RelativePositions":
    """The rows of the queries at `indices` [batch, n] alone."""
    return self.replace(rows=jnp.take_along_axis(self.rows, indices[:, :, None], axis=1))


class RelativePositionContext(nn.Module):
  """The distance table and its LayerNorm (shared by all layers), once per pass."""
  config: model_config.ModelConfig

  @nn.compact
  def __call__(self, context: attention.LayerContext,
               deterministic: bool) -> RelativePositions:
    del deterministic  # each layer applies its own dropout to the embeddings
    config = self.config
    table = self.param("relative_embeddings",
                       common.initializer(config, ("positions", "embed")),
                       (2 * span(config), config.hidden_size), config.weights_dtype)
    embeddings = common.layer_norm(config, "layer_norm")(table)
    return RelativePositions(embeddings, relative_rows(context.positions, config))


def _gather_rows(scores: jax.Array, rows: jax.Array) -> jax.Array:
  """[batch, heads, n, 2 * span] scores against every distance row, [batch, n, m] rows
  -> [batch, heads, n, m]."""
  return jnp.take_along_axis(scores, rows[:, None], axis=-1)


class DisentangledSelfAttention(nn.Module):
  """[batch, length, hidden] -> same; `query` [batch, queries, hidden] replaces the
  query stream (DeBERTa's enhanced mask decoder; `context` then describes those queries),
  keys and values still come from `x`."""
  config: model_config.ModelConfig

  @nn.compact
  def __call__(self, x: jax.Array, context: attention.LayerContext, deterministic: bool,
               query: jax.Array | None = None) -> jax.Array:
    config = self.config
    relative: RelativePositions = context.relative
    projections = {n: attention.heads_projection(config, n) for n in ("query", "key", "value")}
    query_layer, key, value = (
        nn.with_logical_constraint(projections[n](x if n != "query" or query is None
                                                  else query), attention.HEADS_AXES)
        for n in ("query", "key", "value"))
    terms = config.attention.relative_terms
    factor = 1 + len(terms)

    embeddings = dropout_lib.Dropout(config.hidden_dropout)(relative.embeddings[None],
                                                   deterministic=deterministic)
    bias = 0.0
    if "c2p" in terms:  # the query's content against the key's distance
      projection = projections["key"] if config.attention.share_att_key else (
          attention.heads_projection(config, "position_key"))
      position_key = projection(embeddings)[0]  # [2 * span, heads, head_dim]
      scores = jnp.einsum("bqnd,rnd->bnqr", query_layer, position_key)
      bias = bias + _gather_rows(scores, relative.rows)
    if "p2c" in terms:  # the key's content against the query's distance
      projection = projections["query"] if config.attention.share_att_key else (
          attention.heads_projection(config, "position_query"))
      position_query = projection(embeddings)[0]
      scores = jnp.einsum("bknd,rnd->bnkr", key, position_query)
      # Row (q, k) of the key k's scores: gathered along k's axis, so with the rows
      # transposed, then back to [query, key]. (Hugging Face gathers at -d(k, q),
      # which is d(q, k): the buckets are odd.)
      bias = bias + jnp.swapaxes(_gather_rows(scores, jnp.swapaxes(relative.rows, 1, 2)),
                                 -1, -2)
    if terms:
      bias = nn.with_logical_constraint(bias / np.sqrt(config.head_dim * factor).astype(
          np.float32), SCORE_AXES).astype(config.compute_dtype)
    else:
      bias = None

    # attend divides by sqrt(head_dim); the content term wants sqrt(factor * head_dim).
    attended = attention.attend(
        query_layer / np.sqrt(factor).astype(query_layer.dtype), key, value, context.mask,
        bias=bias, **attention.attention_dropout(self, config, deterministic))
    return attention.output_projection(config)(attended)


def validate(model) -> None:
  """DeBERTa's fields: disentangled attention's terms and buckets."""
  fields = model.attention
  terms = tuple(fields.relative_terms)
  for term in terms:
    errors.check_choice("model.attention.relative_terms", term, TERMS)
  if len(set(terms)) != len(terms):
    errors.fail("model.attention.relative_terms", f"{terms} names a term twice.")
  if fields.max_relative_positions < 2:
    errors.fail("model.attention.max_relative_positions",
                f"must be >= 2, got {fields.max_relative_positions}.")
  if fields.position_buckets < 0 or fields.position_buckets == 1:
    errors.fail("model.attention.position_buckets", f"must be 0 (no buckets) or >= 2, got "
                f"{fields.position_buckets}.")
  if (fields.position_buckets
      and fields.max_relative_positions - 1 <= fields.position_buckets // 2):
    errors.fail("model.attention.max_relative_positions", f"{fields.max_relative_positions} "
                "must exceed model.attention.position_buckets / 2 + 1 = "
                f"{fields.position_buckets // 2 + 1} (log buckets shrink the distances "
                "between the two).")


attention.register("disentangled", attention.Variant(DisentangledSelfAttention,
                                                     RelativePositionContext, validate))

"""XLNet's two-stream relative attention: `model.attention.variant = "two_stream_relative"`.

Yang et al. 2019, XLNet, sections 2.3-2.4, as zihangdai/xlnet's modeling.py computes it
(`two_stream_rel_attn`, `rel_attn_core`, `rel_shift`, `relative_positional_encoding`)
and transformers' `XLNetRelativeAttention` / `XLNetModel.forward` (the parity
reference). Every layer attends with

    score(i, j) = ((q_i + r_w_bias) . k_j                  content
                  + (q_i + r_r_bias) . W_r R_{i-j}         relative position (sinusoid)
                  + (q_i + r_s_bias) . s_{[i, j in one segment]})  relative segment
                  / sqrt(head_dim)

over keys j = the memory of previous segments (LayerContext.per_layer, [batch, memory,
hidden]: every layer its own) followed by the content stream. The hidden state is the
content stream h [batch, length, hidden] alone (fine-tuning: each token sees the tokens
its mask allows, itself included), or the two streams {'h': h, 'g': g}, where g
[batch, predictions, hidden] (starting from a learned vector, see encoderx/models/xlnet.py)
holds one row per predicted token. Both streams query the same keys and values (the
content stream's), with the same projections and biases; a token's query-stream row
sees the tokens before it in the factorization order but not itself, its content-stream
row sees those and itself (`TwoStreamInputs`). Projections have no biases (XLNet's), and
segments are XLNet's token types (0, 1, 2 for [CLS]); memory positions count as segment
0, as in both references.

The query stream is computed at the predicted positions only ([batch, predictions] rows
gathered by position), which is what transformers' einsum with the one-hot
`target_mapping` does; a prediction slot without a target gets a zero attention vector,
as there. Positional encodings of rows read backwards (XLNet's bidirectional data,
`TwoStreamInputs.reversed`) are those of the negated distances. Dropout on the
positional encodings draws one mask per direction for the batch (the references draw
one per row).
"""
from __future__ import annotations

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from encoderx.models import model_config
from encoderx.models import attention, common
from encoderx.models import dropout as dropout_lib
from encoderx.models import masks

NAME = "two_stream_relative"
CONTENT, QUERY = "h", "g"


@flax.struct.dataclass
class TwoStreamInputs:
  """What XLNet's model gives the attention (LayerContext.variant_inputs).

  visible           [batch, length, length] bool: whether the query stream of token i
                    may attend to token j (j comes earlier in the factorization order);
                    Hugging Face's and XLNet's `perm_mask` is its negation. The content
                    stream also sees the token itself. Padding is masked separately.
  target_positions  [batch, predictions] int32: the token each query-stream row predicts
                    (XLNet's `target_mapping`, as positions).
  target_weights    [batch, predictions] float: 1.0 for a real prediction, 0.0 for an
                    unused slot.
  memory_valid      [batch, memory] bool: memory slots that hold a previous segment's
                    token; None without memory.
  reversed          [batch] bool: rows read backwards (bidirectional data); None: none.
  """
  visible: jax.Array
  target_positions: jax.Array
  target_weights: jax.Array
  memory_valid: jax.Array | None = None
  reversed: jax.Array | None = None


@flax.struct.dataclass
class StreamInputs:
  """What one stream's queries need: mask [batch, 1, queries, keys] bool, the position
  in the sequence of each query [batch, queries] (None: 0, 1, ..., length - 1) and its
  token type [batch, queries]."""
  mask: jax.Array
  query_positions: jax.Array | None
  query_types: jax.Array


@flax.struct.dataclass
class RelativeInputs:
  """The context module's output, computed once for all layers.

  positional  [directions, key_length + length, hidden]: encodings of the distances
              key_length, ..., 1 - length (directions: forward, and backward when rows
              are reversed)
  direction   [batch] int32: each row's direction (0 forward, 1 backward)
  key_types   [batch, key_length] int32: token types of the keys (memory: 0)
  streams     {'h': StreamInputs, 'g': StreamInputs (with a query stream)}
  target_weights  [batch, predictions] or None
  """
  positional: jax.Array
  direction: jax.Array
  key_types: jax.Array
  streams: dict
  target_weights: jax.Array | None = None


def sinusoid_encodings(distances: jax.Array, hidden_size: int) -> jax.Array:
  """[n] distances -> [n, hidden]: sin of distance x inverse frequencies, then cos
  (Transformer-XL's order), frequencies 1 / 10000^(2i / hidden)."""
  inverse_frequencies = 1.0 / (10000.0 ** (jnp.arange(0, hidden_size, 2.0) / hidden_size))
  angles = distances[:, None] * inverse_frequencies[None, :]
  return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)


def relative_encodings(config: model_config.ModelConfig, length: int, key_length: int,
                       both_directions: bool) -> jax.Array:
  """[directions, key_length + length, hidden] float32: the encodings of the distances
  key_length, key_length - 1, ..., 1 - length (XLNet's 'bi' attention), clamped to
  +-clamp_len when that is positive; the backward direction negates them."""
  distances = jnp.arange(key_length, -length, -1, dtype=jnp.float32)
  directions = [distances, -distances] if both_directions else [distances]
  clamp = config.attention.clamp_len
  if clamp > 0:
    directions = [jnp.clip(d, -clamp, clamp) for d in directions]
  return jnp.stack([sinusoid_encodings(d, config.hidden_size) for d in directions])


def _with_memory(mask: jax.Array, memory_valid: jax.Array | None) -> jax.Array:
  """[batch, 1, queries, length] -> [batch, 1, queries, memory + length]: every query
  may attend to every valid memory slot."""
  if memory_valid is None:
    return mask
  batch, _, queries, _ = mask.shape
  memory = jnp.broadcast_to(memory_valid[:, None, None, :],
                            (batch, 1, queries, memory_valid.shape[1]))
  return jnp.concatenate([memory, mask], axis=-1)


class RelativeContext(nn.Module):
  """Positional encodings, segment types and the streams' masks, once per forward pass."""
  config: model_config.ModelConfig

  @nn.compact
  def __call__(self, context: attention.LayerContext, deterministic: bool) -> RelativeInputs:
    config = self.config
    inputs: TwoStreamInputs | None = context.variant_inputs
    batch, length = context.token_type_ids.shape
    memory_valid = None if inputs is None else inputs.memory_valid
    memory_length = 0 if memory_valid is None else memory_valid.shape[1]
    reversed_rows = None if inputs is None else inputs.reversed
    positional = relative_encodings(config, length, memory_length + length,
                                    both_directions=reversed_rows is not None)
    positional = dropout_lib.Dropout(config.hidden_dropout)(
        positional.astype(config.compute_dtype), deterministic=deterministic)
    direction = (jnp.zeros([batch], jnp.int32) if reversed_rows is None
                 else reversed_rows.astype(jnp.int32))
    types = context.token_type_ids
    key_types = jnp.concatenate([jnp.zeros([batch, memory_length], types.dtype), types],
                                axis=1)
    if inputs is None:
      return RelativeInputs(positional, direction, key_types,
                            {CONTENT: StreamInputs(context.mask, None, types)})
    itself = jnp.eye(length, dtype=bool)[None, None]
    visible = context.mask & inputs.visible[:, None]
    targets = inputs.target_positions
    query_mask = jnp.take_along_axis(visible, targets[:, None, :, None], axis=2)
    streams = {
        CONTENT: StreamInputs(_with_memory(visible | (itself & context.mask), memory_valid),
                              None, types),
        QUERY: StreamInputs(_with_memory(query_mask, memory_valid), targets,
                            jnp.take_along_axis(types, targets, axis=1)),
    }
    return RelativeInputs(positional, direction, key_types, streams, inputs.target_weights)


def shift_relative(scores: jax.Array, query_positions: jax.Array | None, length: int,
                   key_length: int) -> jax.Array:
  """Scores against the distance encodings [batch, heads, queries, key_length + length]
  -> against the keys [batch, heads, queries, key_length].

  Query i at sequence position p (after `key_length - length` memory slots) and key j
  are p + key_length - length - j apart: column length - p + j of the encodings. For
  the content stream (p = i) that is XLNet's `rel_shift` reshape; query-stream rows
  gather their columns.
  """
  batch, heads, queries, width = scores.shape
  if query_positions is None:
    shifted = scores.reshape(batch, heads, width, queries)[:, :, 1:]
    return shifted.reshape(batch, heads, queries, width - 1)[..., :key_length]
  columns = length - query_positions[:, :, None] + jnp.arange(key_length)[None, None, :]
  columns = jnp.broadcast_to(columns[:, None], (batch, heads, queries, key_length))
  return jnp.take_along_axis(scores, columns, axis=-1)


class TwoStreamRelativeAttention(nn.Module):
  """One layer's attention: the content stream, or both streams (module docstring)."""
  config: model_config.ModelConfig

  @nn.compact
  def __call__(self, x, context: attention.LayerContext, deterministic: bool):
    config = self.config
    relative: RelativeInputs = context.relative
    streams = x if isinstance(x, dict) else {CONTENT: x}
    heads, head_dim = config.num_heads, config.head_dim

    def bias(name, shape, axes):
      return self.param(name, common.initializer(config, axes), shape, config.weights_dtype
                        ).astype(config.compute_dtype)

    content_bias = bias("r_w_bias", (heads, head_dim), ("heads", "kv"))
    position_bias = bias("r_r_bias", (heads, head_dim), ("heads", "kv"))
    segment_bias = bias("r_s_bias", (heads, head_dim), ("heads", "kv"))
    segment_embeddings = bias("seg_embed", (2, heads, head_dim), (None, "heads", "kv"))
    project_query = attention.heads_projection(config, "query", use_bias=False)
    probabilities_dropout = dropout_lib.Dropout(config.attention.dropout)

    content = streams[CONTENT]
    keys_in = content
    if context.per_layer is not None:  # this layer's memory
      keys_in = jnp.concatenate([context.per_layer.astype(content.dtype), content], axis=1)
    key, value = (nn.with_logical_constraint(
        attention.heads_projection(config, name, use_bias=False)(keys_in),
        attention.HEADS_AXES) for name in ("key", "value"))
    # [directions, key_length + length, heads, head_dim]
    positional_key = attention.heads_projection(config, "relative", use_bias=False)(
        relative.positional)
    length, key_length = content.shape[1], keys_in.shape[1]

    def attend(queries, stream: StreamInputs):
      """[batch, queries, heads, head_dim] -> the same: attention over the keys."""
      content_scores = jnp.einsum("bind,bjnd->bnij", queries + content_bias, key)
      if positional_key.shape[0] == 1:
        position_scores = jnp.einsum("bind,jnd->bnij", queries + position_bias,
                                     positional_key[0])
      else:
        position_scores = jnp.einsum("bind,bjnd->bnij", queries + position_bias,
                                     positional_key[relative.direction])
      position_scores = shift_relative(position_scores, stream.query_positions, length,
                                       key_length)
      by_segment = jnp.einsum("bind,snd->bnis", queries + segment_bias, segment_embeddings)
      other_segment = (stream.query_types[:, :, None] != relative.key_types[:, None, :])
      segment_scores = jnp.where(other_segment[:, None], by_segment[..., 1:],
                                 by_segment[..., :1])
      scores = (content_scores + position_scores + segment_scores) * head_dim ** -0.5
      # As XLNet: a masked score is -1e30, so a row with no key left averages them all.
      scores = jnp.where(stream.mask, scores.astype(jnp.float32), -1e30)
      with masks.softmax_rule():
        probabilities = jax.nn.softmax(scores, axis=-1).astype(config.compute_dtype)
      probabilities = probabilities_dropout(probabilities, deterministic=deterministic)
      return jnp.einsum("bnij,bjnd->bind", probabilities, value)

    project_out = attention.output_projection(config, use_bias=False)
    outputs = {}
    for name, hidden in streams.items():
      queries = nn.with_logical_constraint(project_query(hidden), attention.HEADS_AXES)
      attended = attend(queries, relative.streams[name])
      if name == QUERY:  # prediction slots without a target attend to nothing
        attended = attended * relative.target_weights[:, :, None, None].astype(
            attended.dtype)
      outputs[name] = project_out(attended)
    return outputs if isinstance(x, dict) else outputs[CONTENT]


attention.register(NAME, attention.Variant(TwoStreamRelativeAttention, RelativeContext))

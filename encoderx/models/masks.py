"""What every attention kernel shares: its arguments' checks, the mask (packed documents
and local windows), the masked softmax, and what a padding query gets.

Every kernel (blockwise_attention.py for XLA, flash_attention.py for GPU,
splash_attention.py for TPU) is called as

  fn(query, key, value, segment_ids, *, window=0, scale=None, ...) -> out

with query [batch, length, heads, head_dim], key and value [batch, length, kv_heads,
head_dim] (grouped-query attention: query head h reads kv head h // (heads / kv_heads)),
`segment_ids` [batch, length] (the packed documents 1, 2, ...; 0 is padding, never
attended to), and out like query. A query at i attends to the keys j of its own document
with |i - j| <= window // 2 (`band`; ModernBERT's local attention: window 128 is 64
each side), or to all of them with window 0: `attention_mask`, the one definition of the
mask, which the XLA and GPU kernels apply block by block and `attention.attend` to the
whole [length, length] matrix (`local_window_mask`).

A padding query (segment 0) attends to nothing. XLA's softmax over logits that are all
masked is uniform, so `attention.attend` gives it the mean of all values (over every
position of the row), and its output's gradient reaches the values only, through that
mean. The kernels give it exactly that (`padding_queries_as_xla`), computed beside the
kernel: inside it, a padding query's row is zero and contributes nothing.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from encoderx.models import dropout as dropout_lib


def segment_mask(query_segments: jax.Array, key_segments: jax.Array) -> jax.Array:
  """[..., queries, keys] from segment ids [..., queries] and [..., keys]: tokens attend
  to tokens of their own segment (one document of a packed row); id 0 is padding and is
  never attended to. (flash_attention.py applies it block by block: a padding key's id
  becomes -1, which no query's equals, so that it costs one compare an element.)"""
  key_segments = jnp.where(key_segments > 0, key_segments, -1)
  return query_segments[..., :, None] == key_segments[..., None, :]


def document_extents(segment_ids: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(first, last) [batch, length] int32: the first and the last position of each
  position's document in its row (`segment_ids` [batch, length]), the position itself
  for padding. No key outside [first, last] is attended by the query there
  (`segment_mask`), so a kernel may skip the blocks outside the extents of a block's
  queries (flash_attention.py). Ids past the length share one bucket: their extents are
  the bucket's, wider, never narrower."""
  batch, length = segment_ids.shape
  positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
  real = segment_ids > 0
  bucket = jnp.where(real, jnp.clip(segment_ids, 1, length), 0).astype(jnp.int32)
  rows = jnp.arange(batch)[:, None]
  first = jnp.full((batch, length + 1), length, jnp.int32).at[rows, bucket].min(positions)
  last = jnp.full((batch, length + 1), -1, jnp.int32).at[rows, bucket].max(positions)
  return (jnp.where(real, jnp.take_along_axis(first, bucket, axis=1), positions),
          jnp.where(real, jnp.take_along_axis(last, bucket, axis=1), positions))


def padding_and_packing_mask(segment_ids: jax.Array) -> jax.Array:
  """Attention mask [batch, 1, length, length] from segment ids [batch, length]
  (`segment_mask`)."""
  return segment_mask(segment_ids, segment_ids)[:, None, :, :]


def softmax_rule():
  """A context in which jax.nn.softmax (and jax.nn.dot_product_attention's softmax)
  differentiates by jax's own rule, dx = y (g - sum(y g)) (`jax_softmax_custom_jvp`,
  off by default in jax 0.10.2): the default differentiates the quotient exp / sum(exp),
  with the sum squared and three more products over every [batch, heads, query, key]
  element. In modernbert_tiny's CPU step (one core) the softmax's backward fusion took
  1.1 ms a layer instead of 3.8. The same values; the gradient differs by rounding."""
  return jax.softmax_custom_jvp(True)


def _heads_major(x: jax.Array, kv_heads: int) -> jax.Array:
  """[batch, length, heads, head_dim] -> [batch, kv_heads, heads / kv_heads * length,
  head_dim]: the rows of the heads that read one kv head one after another."""
  batch, length, heads, head_dim = x.shape
  x = x.reshape(batch, length, kv_heads, heads // kv_heads, head_dim)
  return x.transpose(0, 2, 3, 1, 4).reshape(batch, kv_heads, -1, head_dim)


def attention_probabilities(query: jax.Array, key: jax.Array, mask: jax.Array,
                            bias: jax.Array | None = None) -> jax.Array:
  """softmax(query . key / sqrt(head_dim) + bias) over the keys a query may attend to:
  [batch, heads, query, key], in float32 (the softmax of bfloat16 logits loses the small
  probabilities), as `jax.nn.dot_product_attention` computes it; key [batch, length,
  kv_heads, head_dim] (query head h reads kv head h // (heads / kv_heads), no copy per
  query head).

  The products take the heads first, the query heads of a kv head as one run of rows
  ([batch, kv_heads, group x length, head_dim]; `weighted_values` alike): with jax's
  [batch, length, heads, head_dim] operands XLA:CPU laid out P V transposed, and
  modernbert_tiny's CPU step took 3-5% more time (interleaved in one process)."""
  batch, length, heads, _ = query.shape
  logits = jnp.einsum("bkqd,bksd->bkqs", _heads_major(query, key.shape[2]),
                      jnp.swapaxes(key, 1, 2), preferred_element_type=jnp.float32)
  logits = logits.reshape(batch, heads, length, key.shape[1])
  logits = logits * jnp.float32(query.shape[-1] ** -0.5)
  if bias is not None:
    logits = logits + bias.astype(jnp.float32)
  logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
  with softmax_rule():
    return jax.nn.softmax(logits, axis=-1)


def weighted_values(probabilities: jax.Array, value: jax.Array) -> jax.Array:
  """The attention's output [batch, query, heads, head_dim] from `probabilities`
  [batch, heads, query, key] and value [batch, key, kv_heads, head_dim] (query head h
  reads kv head h // (heads / kv_heads)), the heads first as `attention_probabilities`."""
  batch, heads, length, keys = probabilities.shape
  kv_heads, head_dim = value.shape[2:]
  out = jnp.einsum("bkqs,bksd->bkqd", probabilities.reshape(batch, kv_heads, -1, keys),
                   jnp.swapaxes(value, 1, 2))
  out = out.reshape(batch, kv_heads, heads // kv_heads, length, head_dim)
  return out.transpose(0, 3, 1, 2, 4).reshape(batch, length, heads, head_dim)


def band(query_positions: jax.Array, key_positions: jax.Array, window: int) -> jax.Array:
  """[..., queries, keys] bool: |query - key| <= window // 2 (True everywhere for window
  0), from positions [..., queries] and [..., keys] in the row."""
  if not window:
    return jnp.ones(query_positions.shape + key_positions.shape[-1:], bool)
  distance = query_positions[..., :, None] - key_positions[..., None, :]
  return jnp.abs(distance) <= window // 2


def attention_mask(query_segments: jax.Array, key_segments: jax.Array,
                   query_positions: jax.Array, key_positions: jax.Array,
                   window: int) -> jax.Array:
  """[..., queries, keys] bool: which keys each query attends to, the same document
  (`segment_mask`: padding never attended) within the window (`band`).
  Segments and positions [..., queries] and [..., keys], broadcast alike."""
  mask = segment_mask(query_segments, key_segments)
  if window:
    mask = mask & band(query_positions, key_positions, window)
  return mask


def local_window_mask(segment_ids: jax.Array, window: int) -> jax.Array:
  """The whole [batch, 1, length, length] mask of `attention_mask` (for
  `attention.attend`), from segment ids [batch, length]."""
  positions = jnp.arange(segment_ids.shape[-1])
  return attention_mask(segment_ids, segment_ids, positions, positions, window)[:, None]


def check_arguments(query, key, value, segment_ids, window: int, kernel: str,
                    dropout_rate: float = 0.0, takes_dropout: bool = False) -> int:
  """A one-line ValueError for arguments that no kernel takes, before anything is
  traced; else the query heads per kv head. `kernel` names the caller in the message;
  `takes_dropout`: whether it has attention dropout."""
  shapes = f"query {query.shape}, key {key.shape}, value {value.shape}"
  if not query.ndim == key.ndim == value.ndim == 4 or key.shape != value.shape:
    raise ValueError(f"{kernel}: query, key and value are [batch, length, heads, head_dim] "
                     f"with key and value of one shape; got {shapes}")
  batch, length, heads, head_dim = query.shape
  if key.shape[:2] != (batch, length) or key.shape[3] != head_dim:
    raise ValueError(f"{kernel}: self-attention takes query, key and value of one batch, "
                     f"length and head_dim; got {shapes}")
  if heads % key.shape[2]:
    raise ValueError(f"{kernel}: {heads} query heads do not divide into "
                     f"{key.shape[2]} kv heads (grouped-query attention); got {shapes}")
  if tuple(segment_ids.shape) != (batch, length):
    raise ValueError(f"{kernel}: segment_ids are [batch, length] = {(batch, length)}; "
                     f"got {tuple(segment_ids.shape)}")
  if not isinstance(window, (int, np.integer)) or window < 0 or window % 2:
    raise ValueError(f"{kernel}: the window is an even number of tokens >= 0 (0: "
                     f"global; 128: 64 each side); got {window!r}")
  if window > length:
    raise ValueError(f"{kernel}: a window of {window} tokens is larger than the row of "
                     f"{length}; use window 0 (global) or a row of at least {window}")
  if not takes_dropout and dropout_lib.effective_rate(dropout_rate) > 0:
    raise ValueError(f"{kernel} has no attention dropout; got dropout_rate "
                     f"{dropout_rate} (use flash_attention, or attention.attend)")
  return heads // key.shape[2]


def padding_queries_as_xla(out: jax.Array, value: jax.Array, segment_ids: jax.Array
                           ) -> jax.Array:
  """`out` [batch, length, heads, head_dim] with the rows of padding queries (segment 0)
  replaced by what `attention.attend` gives them: the mean of all values of the row
  (value [batch, length, kv_heads, head_dim]; query head h reads kv head h // groups).
  The kernel's own rows there get no gradient."""
  batch, length, heads, head_dim = out.shape
  mean = jnp.mean(value.astype(jnp.float32), axis=1, keepdims=True)
  mean = jnp.repeat(mean, heads // value.shape[2], axis=2).astype(out.dtype)
  return jnp.where((segment_ids > 0)[:, :, None, None], out, mean)


def repeat_kv_heads(query: jax.Array, key: jax.Array, value: jax.Array
                    ) -> tuple[jax.Array, jax.Array]:
  """key and value with each kv head repeated for the query heads that read it (each
  heads / kv_heads times in a row: Hugging Face's repeat_kv)."""
  groups = query.shape[2] // key.shape[2]
  if groups == 1:
    return key, value
  return jnp.repeat(key, groups, axis=2), jnp.repeat(value, groups, axis=2)

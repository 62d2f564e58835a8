"""Which keys a query may attend to, and the softmax over them: what every attention
kernel shares (attention.py's XLA path, flash_attention.py's Pallas kernel and its
reference).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def segment_mask(query_segments: jax.Array, key_segments: jax.Array) -> jax.Array:
  """[..., queries, keys] from segment ids [..., queries] and [..., keys]: tokens attend
  to tokens of their own segment (one document of a packed row); id 0 is padding and is
  never attended to. (flash_attention.py applies it block by block: a padding key's id
  becomes -1, which no query's equals, so that it costs one compare an element.)"""
  key_segments = jnp.where(key_segments > 0, key_segments, -1)
  return query_segments[..., :, None] == key_segments[..., None, :]


def padding_and_packing_mask(segment_ids: jax.Array) -> jax.Array:
  """Attention mask [batch, 1, length, length] from segment ids [batch, length]
  (`segment_mask`)."""
  return segment_mask(segment_ids, segment_ids)[:, None, :, :]


def attention_probabilities(query: jax.Array, key: jax.Array, mask: jax.Array,
                            bias: jax.Array | None = None) -> jax.Array:
  """softmax(query . key / sqrt(head_dim) + bias) over the keys a query may attend to:
  [batch, heads, query, key], in float32 (the softmax of bfloat16 logits loses the small
  probabilities), as `jax.nn.dot_product_attention` computes it."""
  logits = jnp.einsum("bqnd,bknd->bnqk", query, key, preferred_element_type=jnp.float32)
  logits = logits * jnp.float32(query.shape[-1] ** -0.5)
  if bias is not None:
    logits = logits + bias.astype(jnp.float32)
  logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
  return jax.nn.softmax(logits, axis=-1)

"""Rotary position embeddings (RoPE): queries and keys rotated by their positions.

Followed: transformers models/modernbert/modeling_modernbert.py
(ModernBertRotaryEmbedding.compute_default_rope_parameters and forward, rotate_half,
apply_rotary_pos_emb) and models/eurobert/modeling_eurobert.py (the same functions),
AnswerDotAI/ModernBERT src/bert_layers/rotary.py (flash-attn's rotary, interleaved=False).
All use the "rotate half" layout: dimension j < head_dim / 2 pairs with j + head_dim / 2
(not the interleaved pairs 2j, 2j + 1 of the RoFormer paper), with frequency
theta^(-2j / head_dim).

The positions are the batch's `positions` (encoderx/models/pretraining.py), which restart
at each packed document: a packed document is rotated as it would be alone.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def inverse_frequencies(head_dim: int, theta: float) -> jax.Array:
  """[head_dim / 2] float32: 1 / theta^(2j / head_dim), j = 0 .. head_dim / 2 - 1."""
  exponents = jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim
  return 1.0 / (jnp.float32(theta) ** exponents)


def cos_sin(positions: jax.Array, head_dim: int, theta: float
            ) -> tuple[jax.Array, jax.Array]:
  """(cos, sin), each [batch, length, head_dim] float32, of the angles position *
  frequency, the frequencies repeated for both halves (Hugging Face's
  `torch.cat((freqs, freqs), dim=-1)`); sin's first half negated: rotate_half's sign,
  folded in once for all layers (see `rotate`)."""
  angles = positions.astype(jnp.float32)[..., None] * inverse_frequencies(head_dim, theta)
  cos, sin = jnp.cos(angles), jnp.sin(angles)
  return jnp.concatenate([cos, cos], axis=-1), jnp.concatenate([-sin, sin], axis=-1)


def swap_halves(x: jax.Array) -> jax.Array:
  """[..., d] -> [x[d/2:], x[:d/2]]: a reversal of a [2, d/2] view, which XLA fuses
  into its consumers as an index map; a concatenate of slices compiles to a select per
  element (ModernBERT-tiny's CPU train step: 97 ms with it, 92 with this)."""
  halves = x.reshape(*x.shape[:-1], 2, x.shape[-1] // 2)
  return jnp.flip(halves, axis=-2).reshape(x.shape)


def rotate(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """Heads x [batch, length, heads, head_dim] rotated by `cos_sin`'s (cos, sin) [batch,
  length, head_dim]: x cos + rotate_half(x) sin as Hugging Face computes it, where
  rotate_half(x) = [-x[d/2:], x[:d/2]], here swap_halves(x) times the sign-folded sin
  (the same products: negating is exact); in float32, cast back to x's dtype (as
  ModernBERT's apply_rotary_pos_emb)."""
  y = x.astype(jnp.float32)
  y = y * cos[:, :, None, :] + swap_halves(y) * sin[:, :, None, :]
  return y.astype(x.dtype)

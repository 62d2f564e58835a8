"""Multi-head self-attention with per-head kernels and logical axes.

Kernels are created in their final shape ([hidden, heads, head_dim] for q/k/v,
[heads, head_dim, hidden] for the output). Flax's MultiHeadDotProductAttention creates
them flat and reshapes, which breaks under logical axis rules (the flat kernel gets the
3-D kernel's sharding constraint when `param()` re-checks shapes inside `apply`).
The attention itself is Flax's `dot_product_attention` (fp32 softmax, dropout).
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from encoderx.models import common


class Projection(nn.Module):
  """`einsum(spec, x, kernel) + bias` with logically partitioned parameters."""
  config: common.ModelConfig
  spec: str
  kernel_shape: tuple[int, ...]
  kernel_axes: tuple[str | None, ...]
  bias_shape: tuple[int, ...]
  bias_axes: tuple[str | None, ...]

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    config = self.config
    kernel = self.param("kernel", common.initializer(config, self.kernel_axes),
                        self.kernel_shape, config.weights_dtype)
    bias = self.param("bias", common.zeros(self.bias_axes), self.bias_shape,
                      config.weights_dtype)
    x, kernel, bias = nn.dtypes.promote_dtype(x, kernel, bias, dtype=config.compute_dtype)
    return jnp.einsum(self.spec, x, kernel) + bias


class SelfAttention(nn.Module):
  """[batch, length, hidden] -> [batch, length, hidden]; `mask` [batch, 1, q, k]."""
  config: common.ModelConfig

  @nn.compact
  def __call__(self, x: jax.Array, mask: jax.Array, deterministic: bool) -> jax.Array:
    config = self.config
    hidden, heads, head_dim = config.hidden_size, config.num_heads, config.head_dim

    def heads_projection(name):
      projection = Projection(config, "blh,hnd->blnd", (hidden, heads, head_dim),
                              ("embed", "heads", "kv"), (heads, head_dim), ("heads", "kv"),
                              name=name)
      return nn.with_logical_constraint(
          projection(x), ("activation_batch", "activation_length", "activation_heads",
                          "activation_kv"))

    query, key, value = (heads_projection(n) for n in ("query", "key", "value"))
    dropout_rng = None
    if not deterministic and config.attention_dropout > 0:
      dropout_rng = self.make_rng("dropout")
    context = nn.dot_product_attention(
        query, key, value, mask=mask, dropout_rng=dropout_rng,
        dropout_rate=config.attention_dropout, broadcast_dropout=False,
        deterministic=deterministic, dtype=config.compute_dtype,
        force_fp32_for_softmax=True)
    output = Projection(config, "blnd,ndh->blh", (heads, head_dim, hidden),
                        ("heads", "kv", "embed"), (hidden,), ("embed",), name="out")
    return output(context)

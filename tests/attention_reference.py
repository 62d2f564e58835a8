"""The reference every attention kernel is tested against: the model's own attention
(`attention.attend`, XLA's jax.nn.dot_product_attention) over the whole [length, length]
mask of encoderx/models/masks.py. Quadratic memory: for tests."""
import jax
import jax.numpy as jnp

from encoderx.models import attention, masks


def reference_attention(query: jax.Array, key: jax.Array, value: jax.Array,
                        segment_ids: jax.Array, *, window: int = 0,
                        scale: float | None = None) -> jax.Array:
  """What every kernel computes, the model's way: `attention.attend` (XLA's
  jax.nn.dot_product_attention) under the whole [length, length] `local_window_mask`,
  kv heads repeated. Quadratic memory: for tests."""
  masks.check_arguments(query, key, value, segment_ids, window, "reference_attention")
  if scale is not None:  # attend scales by 1 / sqrt(head_dim)
    query = query * jnp.asarray(scale * query.shape[-1] ** 0.5, query.dtype)
  key, value = masks.repeat_kv_heads(query, key, value)
  return attention.attend(query, key, value, masks.local_window_mask(segment_ids, window))

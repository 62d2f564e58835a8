"""8-bit dropout (encoderx/models/dropout.py) and the attention it feeds
(encoderx/models/attention.py: attend)."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from encoderx.models import attention
from encoderx.models import dropout as dropout_lib
from encoderx.models import masks
import jaxprs  # pylint: disable=g-bad-import-order


@pytest.mark.parametrize("shape", [(64, 128, 64), (7, 9, 33), (1001,)])
def test_random_bytes_are_uniform(shape):
  """Every byte value equally likely (chi-square), on shapes whose last axis divides by
  4 and on the flat fallback."""
  values = np.asarray(dropout_lib.random_bytes(jax.random.key(0), shape))
  assert values.shape == shape and values.dtype == np.uint8
  counts = np.bincount(values.ravel(), minlength=256)
  if values.size >= 256 * 50:
    assert stats.chisquare(counts).pvalue > 1e-4
  assert len(np.unique(values)) > min(values.size, 256) * 0.9


@pytest.mark.parametrize("rate", [0.1, 0.25, 0.5])
def test_dropout_zeroes_the_effective_rate_and_keeps_the_mean(rate):
  x = jnp.ones((256, 128, 64))
  y = np.asarray(dropout_lib.dropout(x, rate, jax.random.key(1)))
  effective = dropout_lib.effective_rate(rate)
  assert abs(effective - rate) <= 1 / 512
  dropped = float(np.mean(y == 0))
  standard_error = np.sqrt(effective * (1 - effective) / y.size)
  assert abs(dropped - effective) < 5 * standard_error
  assert abs(float(y.mean()) - 1.0) < 5 * standard_error / (1 - effective)
  assert np.allclose(y[y != 0], 1 / (1 - effective))


def test_dropout_edge_rates_and_keys():
  x = jnp.arange(1.0, 9.0)
  key = jax.random.key(2)
  assert np.array_equal(dropout_lib.dropout(x, 0.0, key), x)
  assert np.array_equal(dropout_lib.dropout(x, 1.0, key), np.zeros(8))
  assert dropout_lib.effective_rate(1e-4) == 1 / 256  # a positive rate never vanishes
  big = jnp.ones((64, 64))
  first, again, other = (np.asarray(dropout_lib.dropout(big, 0.5, k)) for k in
                         (key, key, jax.random.key(3)))
  assert np.array_equal(first, again) and not np.array_equal(first, other)


def test_dropout_module_is_the_identity_when_deterministic():
  module = dropout_lib.Dropout(0.5)
  x = jnp.ones((4, 16))
  assert np.array_equal(module.apply({}, x, deterministic=True), x)
  y = module.apply({}, x, deterministic=False, rngs={"dropout": jax.random.key(0)})
  assert set(np.unique(np.asarray(y))) <= {0.0, 2.0} and 0 < float(y.mean()) < 2


def _qkv_and_mask(dtype=jnp.float32):
  keys = jax.random.split(jax.random.key(0), 4)
  query, key, value = (jax.random.normal(k, (2, 12, 4, 8), dtype) for k in keys[:3])
  segment_ids = jnp.array([[1] * 9 + [0] * 3, [1] * 5 + [2] * 7])
  bias = jax.random.normal(keys[3], (2, 4, 12, 12))
  return query, key, value, masks.padding_and_packing_mask(segment_ids), bias


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_attend_matches_flax_attention(with_bias, kv_heads):
  """`attend` (XLA's attention here: cuDNN's runs on GPU only) against Flax's reference
  attention, with a bias and with grouped-query heads (2 kv heads for 4 query heads:
  query head h reads kv head h // 2, as Hugging Face's repeat_kv); values and
  gradients."""
  query, key, value, mask, bias = _qkv_and_mask()
  key, value = key[:, :, :kv_heads], value[:, :, :kv_heads]
  bias = bias if with_bias else None
  weights = jax.random.normal(jax.random.key(7), query.shape)

  def reference(q, k, v):
    k, v = masks.repeat_kv_heads(q, k, v)
    return nn.dot_product_attention(q, k, v, bias=bias, mask=mask)

  mine = lambda q, k, v: attention.attend(q, k, v, mask, bias=bias)
  np.testing.assert_allclose(mine(query, key, value), reference(query, key, value),
                             atol=1e-5)
  loss = lambda attend: lambda *qkv: jnp.sum(attend(*qkv) * weights)
  for got, expected in zip(jax.grad(loss(mine), (0, 1, 2))(query, key, value),
                           jax.grad(loss(reference), (0, 1, 2))(query, key, value)):
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_attention_products_take_the_heads_first():
  """Every product of `attend`'s XLA attention and of its gradient has the batch and
  the (kv) heads as its leading batch axes on both operands: with jax's [batch, length,
  heads, head_dim] operands XLA:CPU laid P V out transposed (modernbert_tiny's CPU step
  3-5% slower)."""
  query, key, value, mask, _ = _qkv_and_mask()
  key, value = key[:, :, :2], value[:, :, :2]
  grad = jax.grad(lambda *qkv: jnp.sum(attention.attend(*qkv, mask)), (0, 1, 2))
  jaxpr = jax.make_jaxpr(grad)(query, key, value)
  batch_axes = [equation.params["dimension_numbers"][1]
                for equation in jaxprs.equations(jaxpr.jaxpr)
                if equation.primitive.name == "dot_general"]
  assert len(batch_axes) == 6, batch_axes  # Q Kᵀ, P V; dQ, dK, dP, dV
  assert all(tuple(axes) == ((0, 1), (0, 1)) for axes in batch_axes), batch_axes


def test_attention_softmax_differentiates_by_jaxs_rule():
  """`attend` and its probabilities take the softmax's gradient by jax's custom rule
  (masks.softmax_rule), which the default (quotient) derivation does not (Flax's
  attention); their gradients match Flax's to rounding
  (test_attend_matches_flax_attention)."""
  query, key, value, mask, _ = _qkv_and_mask()
  gradient_jaxpr = lambda fn: str(jax.make_jaxpr(jax.grad(
      lambda q, k, v: jnp.sum(fn(q, k, v))))(query, key, value))
  assert "custom_jvp_call" in gradient_jaxpr(lambda q, k, v: attention.attend(q, k, v, mask))
  assert "custom_jvp_call" in gradient_jaxpr(
      lambda q, k, v: masks.attention_probabilities(q, k, mask))
  assert "custom_jvp_call" not in gradient_jaxpr(
      lambda q, k, v: nn.dot_product_attention(q, k, v, mask=mask))


def test_attend_with_dropout_drops_probabilities():
  query, key, value, mask, _ = _qkv_and_mask()
  dropout_key = jax.random.key(5)
  attended = attention.attend(query, key, value, mask, dropout_rate=0.5,
                              dropout_key=dropout_key)
  kept = dropout_lib.dropout(masks.attention_probabilities(query, key, mask), 0.5,
                             dropout_key)
  np.testing.assert_allclose(attended, jnp.einsum("bnqk,bknd->bqnd", kept, value),
                             atol=1e-6)
  assert not np.allclose(attended, attention.attend(query, key, value, mask), atol=1e-3)
  # Masked keys stay out: a key of another packed sequence changes nothing.
  changed = key.at[1, 9].add(10.0)
  again = attention.attend(query, changed, value, mask, dropout_rate=0.5,
                           dropout_key=dropout_key)
  np.testing.assert_allclose(again[1, :5], attended[1, :5], atol=1e-6)


def test_attend_in_bfloat16_follows_float32():
  query, key, value, mask, _ = _qkv_and_mask()
  as_bf16 = [x.astype(jnp.bfloat16) for x in (query, key, value)]
  full = attention.attend(query, key, value, mask)
  half = attention.attend(*as_bf16, mask)
  assert half.dtype == jnp.bfloat16
  np.testing.assert_allclose(half.astype(jnp.float32), full, atol=5e-2)


def test_fused_implementation_is_cudnn_only_where_it_applies(monkeypatch):
  """cuDNN's flash attention is asked for on GPU, for half-precision heads it supports
  (head_dim <= 128, a multiple of 8, even lengths, no bias); XLA everywhere else. On this
  CPU host the choice is XLA."""
  heads = lambda length, head_dim, dtype=jnp.bfloat16: jnp.zeros((2, length, 4, head_dim),
                                                                 dtype)
  assert attention.fused_implementation(heads(128, 64), heads(128, 64), None) is None
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  assert attention.fused_implementation(heads(128, 64), heads(128, 64), None) == "cudnn"
  assert attention.fused_implementation(heads(512, 128), heads(512, 128), None) == "cudnn"
  not_fused = [
      (heads(128, 64, jnp.float32), heads(128, 64, jnp.float32), None),  # float32
      (heads(128, 160), heads(128, 160), None),  # head_dim > 128
      (heads(128, 36), heads(128, 36), None),  # not a multiple of 8
      (heads(127, 64), heads(127, 64), None),  # odd length
      (heads(128, 64), heads(128, 64), jnp.zeros((2, 4, 128, 128))),  # a bias
  ]
  for query, key, bias in not_fused:
    assert attention.fused_implementation(query, key, bias) is None

"""The embedding lookup (`embeddings.Embed`): nn.Embed's values, its gradient summed in
float32 whatever the compute dtype."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from encoderx.models import embeddings


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_embed_gives_nn_embed_values(dtype):
  ids = jax.random.randint(jax.random.key(0), (4, 32), 0, 50)
  ours = embeddings.Embed(50, 16, dtype=dtype, param_dtype=jnp.float32)
  params = ours.init(jax.random.key(1), ids)
  reference = nn.Embed(50, 16, dtype=dtype, param_dtype=jnp.float32)
  out = ours.apply(params, ids)
  assert out.dtype == dtype
  np.testing.assert_array_equal(out, reference.apply(params, ids))
  scores_of = jax.random.normal(jax.random.key(2), (4, 16))
  np.testing.assert_array_equal(ours.apply(params, scores_of, method="attend"),
                                reference.apply(params, scores_of, method="attend"))


def test_embed_gradient_accumulates_in_float32_in_a_bfloat16_model():
  """A token type repeated over a 8 x 512 batch: its row's gradient is the sum of 4,096
  cotangents. Summed in bfloat16 (nn.Embed casts the table before the gather) the sum
  stalls far below; here it matches the float32 sum of the same (bfloat16) cotangents."""
  ids = jnp.zeros((8, 512), jnp.int32)
  cotangent = jax.random.uniform(jax.random.key(0), (8, 512, 16))
  module = embeddings.Embed(2, 16, dtype=jnp.bfloat16, param_dtype=jnp.float32)
  params = module.init(jax.random.key(1), ids)
  loss = lambda p: jnp.sum(module.apply(p, ids).astype(jnp.float32) * cotangent)
  gradient = jax.grad(loss)(params)["params"]["embedding"]
  expected = jnp.sum(cotangent.astype(jnp.bfloat16).astype(jnp.float32), axis=(0, 1))
  np.testing.assert_allclose(gradient[0], expected, rtol=1e-5)
  np.testing.assert_array_equal(gradient[1], 0)
  assert gradient.dtype == jnp.float32


def test_embed_refuses_float_ids():
  module = embeddings.Embed(2, 4, dtype=jnp.float32)
  with pytest.raises(ValueError, match="integer"):
    module.init(jax.random.key(0), jnp.zeros((3,), jnp.float32))

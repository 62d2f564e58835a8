"""Blockwise attention in XLA (encoderx/models/blockwise_attention.py) against the
model's full attention (`attention_reference.reference_attention`: `attention.attend` under the
[length, length] mask), values and gradients in float32; the key blocks a local window
visits; memory linear in the length; arguments refused before tracing."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from encoderx.models import blockwise_attention as bw
from encoderx.models import masks

import attention_reference  # pylint: disable=g-bad-import-order  (tests/ is on sys.path)
import jaxprs  # pylint: disable=g-bad-import-order

TOLERANCE = 1e-5  # float32, values and gradients


def heads(length, num_heads=2, kv_heads=None, head_dim=16, batch=2, seed=0,
          dtype=jnp.float32):
  """query, key, value, d_out: [batch, length, heads (kv_heads for key and value),
  head_dim] normal."""
  keys = jax.random.split(jax.random.key(seed), 4)
  kv_shape = (batch, length, kv_heads or num_heads, head_dim)
  shapes = [(batch, length, num_heads, head_dim), kv_shape, kv_shape,
            (batch, length, num_heads, head_dim)]
  return [jax.random.normal(key, shape, dtype) for key, shape in zip(keys, shapes)]


def segments(length, kind):
  """[2, length] segment ids: 'padded' (one document then padding, and a full row),
  'packed' (three documents then padding, and two documents), 'one' (one document)."""
  def row(*sizes):
    ids = [i + 1 for i, size in enumerate(sizes) for _ in range(size)]
    return ids + [0] * (length - len(ids))
  if kind == "padded":
    rows = [row(length - length // 4), row(length)]
  elif kind == "packed":
    third = length // 3
    rows = [row(third - 5, third + 7, third - 10), row(length // 2, length - length // 2)]
  else:
    rows = [row(length)] * 2
  return jnp.array(rows, jnp.int32)


def outputs_and_gradients(function, q, k, v, d_out):
  out, vjp = jax.vjp(function, q, k, v)
  return (out, *vjp(d_out))


def compiled_outputs_and_gradients(function):
  """outputs_and_gradients(function, q, k, v, d_out) as one XLA program, compiled once for
  every call of it, not op by op (2.5x faster here for the blockwise loops)."""
  return jax.jit(lambda *args: outputs_and_gradients(function, *args))


def jitted_outputs_and_gradients(function, q, k, v, d_out):
  return compiled_outputs_and_gradients(function)(q, k, v, d_out)


def max_errors(got, want):
  return [float(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32)).max())
          for a, b in zip(got, want)]


# Global attention over several blocks of padded rows: "packed" (row 0 ends in padding);
# a window of 32 over several blocks of packed rows: "length_not_a_multiple".
CASES = {  # name: (length, kind, window, heads, kv_heads, block_q, block_k)
    "packed": (192, "packed", 0, 2, 2, 64, 32),
    "window_16_uneven_blocks": (128, "padded", 16, 2, 2, 16, 48),
    "grouped_query": (128, "packed", 16, 4, 2, 32, 32),
    "length_not_a_multiple": (200, "packed", 32, 4, 2, 64, 48),
    "one_block": (96, "padded", 0, 2, 1, 512, 512),
}


@pytest.mark.parametrize("case", CASES)
def test_matches_full_attention_values_and_gradients(case):
  """Outputs and dq, dk, dv equal full attention's within 1e-5 (float32), padding queries
  included (they get attend's mean of the values), where several key blocks are visited
  and, with a window, several skipped."""
  length, kind, window, num_heads, kv_heads, block_q, block_k = CASES[case]
  q, k, v, d_out = heads(length, num_heads, kv_heads)
  segment_ids = segments(length, kind)
  got = jitted_outputs_and_gradients(
      lambda *qkv: bw.blockwise_attention(*qkv, segment_ids, window=window,
                                          block_q=block_q, block_k=block_k),
      q, k, v, d_out)
  want = jitted_outputs_and_gradients(
      lambda *qkv: attention_reference.reference_attention(*qkv, segment_ids, window=window),
      q, k, v, d_out)
  assert max(max_errors(got, want)) <= TOLERANCE, max_errors(got, want)
  assert min(float(jnp.abs(w).max()) for w in want) > 0.5  # nothing vacuous
  assert [g.shape for g in got] == [q.shape, q.shape, k.shape, v.shape]


def test_block_products_read_the_probabilities_as_laid_out():
  """Every product over a block's [queries, keys] probabilities (or their gradient)
  contracts it where a matmul reads it without a transposed copy: over its keys as the
  first operand (P V, dS K), over its queries as the second (dV and dK, summed
  transposed). XLA:CPU copied Pᵀ for dV = Pᵀ dO (ModernBERT-base at 1,024 tokens: 95 ms
  of op time a global layer)."""
  block_q, block_k = 32, 64
  q, k, v, d_out = heads(128, 4, 2)
  segment_ids = segments(128, "packed")

  def loss(q, k, v):
    out = bw.blockwise_attention(q, k, v, segment_ids, block_q=block_q, block_k=block_k)
    return jnp.sum(out * d_out)

  jaxpr = jax.make_jaxpr(jax.grad(loss, (0, 1, 2)))(q, k, v)
  contracted = []  # (operand index, its contracted axes from the end)
  for equation in jaxprs.equations(jaxpr.jaxpr):
    if equation.primitive.name != "dot_general":
      continue
    (lhs_axes, rhs_axes), _ = equation.params["dimension_numbers"]
    for index, (operand, axes) in enumerate(zip(equation.invars, (lhs_axes, rhs_axes))):
      shape = operand.aval.shape
      if shape[-2:] == (block_q, block_k):
        contracted.append((index, tuple(axis - len(shape) for axis in axes)))
  # Forward P V and backward dQ (first operands); dV and dK (second operands, over the
  # queries and, grouped, the query heads of a kv head).
  assert sorted(index for index, _ in contracted) == [0, 0, 1, 1], contracted
  for index, axes in contracted:
    if index == 0:
      assert axes == (-1,), contracted
    else:
      assert -1 not in axes and axes[-1] == -2, contracted


def test_default_blocks_scale_and_jit():
  """Default blocks (a local layer's from its window), another scale, under jit."""
  q, k, v, d_out = heads(384, 4, 2)
  segment_ids = segments(384, "packed")
  for window in (0, 128):
    kernel = jax.jit(lambda *qkv: bw.blockwise_attention(*qkv, segment_ids,
                                                         window=window, scale=0.3))
    got = jitted_outputs_and_gradients(kernel, q, k, v, d_out)
    want = jitted_outputs_and_gradients(
        lambda *qkv: attention_reference.reference_attention(*qkv, segment_ids, window=window,
                                               scale=0.3), q, k, v, d_out)
    assert max(max_errors(got, want)) <= TOLERANCE
  assert bw.default_block(0) == 512 and bw.default_block(128) == 64
  assert bw.default_block(4096) == 512
  # A global row of up to ONE_BLOCK_ROW tokens is one block; longer rows take blocks of 512.
  assert bw.default_block(0, 1024) == 1024 and bw.default_block(0, 2048) == 512


def test_padding_queries_get_the_mean_of_the_values_and_no_gradient_inside():
  """A padding query's output is the mean of its row's values, as attend gives it; its
  output's gradient reaches the values through that mean only (dq of padding rows is 0,
  and dk does not depend on their d_out)."""
  q, k, v, d_out = heads(64)
  segment_ids = segments(64, "padded")  # row 0: positions 48.. are padding
  kernel = lambda *qkv: bw.blockwise_attention(*qkv, segment_ids, block_q=16, block_k=16)
  run = compiled_outputs_and_gradients(kernel)
  out, dq, dk, dv = run(q, k, v, d_out)
  np.testing.assert_allclose(out[0, 50], v[0].mean(axis=0), atol=1e-6)
  assert not np.any(dq[0, 48:])
  changed = d_out.at[0, 48:].set(100.0)
  _, _, dk_changed, dv_changed = run(q, k, v, changed)
  np.testing.assert_allclose(dk_changed, dk, atol=1e-6)
  assert float(jnp.abs(dv_changed - dv).max()) > 1  # through the mean


@pytest.mark.parametrize("length,block,other,window", [
    (256, 32, 32, 16), (200, 64, 48, 32), (128, 16, 48, 16), (1000, 64, 64, 128),
    (256, 32, 32, 0), (100, 100, 100, 100)])
def test_block_ranges_are_exactly_the_blocks_a_window_reaches(length, block, other, window):
  """Each block's range is exactly the blocks of the other side holding a position
  within the window of one of its real positions: none missing, none extra."""
  half = window // 2 if window else length
  for index, (first, last) in enumerate(bw.block_ranges(length, block, other, window)):
    own = range(index * block, min((index + 1) * block, length))
    reached = {j // other for i in own for j in range(max(0, i - half),
                                                       min(length, i + half + 1))}
    assert set(range(first, last)) == reached, (index, first, last)


def test_a_window_never_reads_the_blocks_it_does_not_reach():
  """With window 16 and blocks of 32 over 256 positions, query blocks 0 and 1 (positions
  0-63) reach key blocks 0-2 (keys up to 71). Values (and so dP) of keys from 96 on are
  NaN: were any of those blocks visited for the first 64 queries (forward, or dQ in the
  backward), their rows would be NaN (0 x NaN); d_out NaN from query 96 on likewise
  poisons dK and dV of the first key blocks if their backward visits those query
  blocks. Global attention, which visits every block, is poisoned as the check needs."""
  q, k, v, d_out = heads(256, batch=1)
  segment_ids = segments(256, "one")[:1]
  poisoned_v = v.at[:, 96:].set(jnp.nan)
  poisoned_d_out = d_out.at[:, 96:].set(jnp.nan)
  for window in (16, 0):
    kernel = lambda *qkv: bw.blockwise_attention(*qkv, segment_ids, window=window,
                                                 block_q=32, block_k=32)
    run = compiled_outputs_and_gradients(kernel)
    out, dq, _, _ = run(q, k, poisoned_v, d_out)
    _, _, dk, dv = run(q, k, v, poisoned_d_out)
    clean = [bool(jnp.all(jnp.isfinite(x[:, :64]))) for x in (out, dq, dk, dv)]
    assert clean == ([True] * 4 if window else [False] * 4), (window, clean)


def _compiled(function, length, num_heads=4, head_dim=64):
  """Forward and backward at [1, length, heads, head_dim], compiled by XLA."""
  x = jax.ShapeDtypeStruct((1, length, num_heads, head_dim), jnp.float32)
  segment_ids = jax.ShapeDtypeStruct((1, length), jnp.int32)
  loss = lambda q, k, v, s: function(q, k, v, s).sum()
  return jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(x, x, x, segment_ids).compile()


def test_memory_grows_linearly_with_the_length():
  """Compiled forward and backward (4 heads of 64): from 2,048 to 8,192 tokens XLA's
  temporaries grow about 2x blockwise (fixed-size blocks plus linear residuals; 4x is
  the bound of linear growth), global or local, against about 16x for full attention,
  which holds [length, length] probabilities (3 GB at 8,192). No [8192, 8192] array is
  in the blockwise program."""
  ratios = {}
  for name, function in [
      ("global", lambda *a: bw.blockwise_attention(*a)),
      ("local", lambda *a: bw.blockwise_attention(*a, window=128)),
      ("full", lambda *a: attention_reference.reference_attention(*a))]:
    short, long = (_compiled(function, length) for length in (2048, 8192))
    ratios[name] = (long.memory_analysis().temp_size_in_bytes
                    / short.memory_analysis().temp_size_in_bytes)
    has_square = "8192,8192]" in long.as_text()
    assert has_square == (name == "full"), name
    if name != "full":  # one [8192, 8192] float32 is 256 MiB
      assert long.memory_analysis().temp_size_in_bytes < 128 * 2**20, name
  assert ratios["global"] < 4.5 and ratios["local"] < 4.5, ratios
  assert ratios["full"] > 12, ratios


def test_bfloat16_heads_are_close_to_float32():
  q, k, v, d_out = heads(128, 4, 2, dtype=jnp.bfloat16)
  segment_ids = segments(128, "packed")
  got = jitted_outputs_and_gradients(
      lambda *qkv: bw.blockwise_attention(*qkv, segment_ids, window=32, block_q=32,
                                          block_k=32), q, k, v, d_out)
  assert all(g.dtype == jnp.bfloat16 for g in got)
  want = jitted_outputs_and_gradients(
      lambda *qkv: attention_reference.reference_attention(*qkv, segment_ids, window=32),
      *(x.astype(jnp.float32) for x in (q, k, v, d_out)))
  errors = max_errors(got, want)
  scales = [float(jnp.abs(w).max()) for w in want]
  assert all(e < 0.03 * s for e, s in zip(errors, scales)), (errors, scales)


def test_sharded_over_batch_and_heads_matches_one_device():
  """Under a 2 x 2 x 2 mesh (rows over data and fsdp, heads over tensor) XLA partitions
  the blocks' loops: the same outputs and gradients as one device."""
  mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"),
                       axis_types=(jax.sharding.AxisType.Auto,) * 3)
  spec = jax.sharding.PartitionSpec(("data", "fsdp"), None, "tensor", None)
  q, k, v, d_out = heads(128, 4, 2, batch=4)
  segment_ids = jnp.concatenate([segments(128, "packed"), segments(128, "padded")])
  step = lambda *args: jitted_outputs_and_gradients(
      lambda *qkv: bw.blockwise_attention(*qkv, segment_ids, window=32, block_q=32,
                                          block_k=32), *args)
  one_device = step(q, k, v, d_out)
  with jax.set_mesh(mesh):
    placed = [jax.device_put(x, jax.sharding.NamedSharding(mesh, spec))
              for x in (q, k, v, d_out)]
    sharded = jax.jit(step)(*placed)
  assert max(max_errors(sharded, one_device)) < 1e-6


@pytest.mark.parametrize("change,message", [
    (dict(window=15), "even number"), (dict(window=-2), "even number"),
    (dict(window=256), "larger than the row of 128"),
    (dict(kv_heads=3), "do not divide"), (dict(dropout_rate=0.1), "no attention dropout"),
    (dict(block_q=0), "blocks are positive"), (dict(segment_length=100), "segment_ids")])
def test_bad_arguments_stop_with_one_line_before_tracing(change, message):
  q, k, v, _ = heads(128, 4, change.pop("kv_heads", 2))
  segment_ids = jnp.ones((2, change.pop("segment_length", 128)), jnp.int32)
  with pytest.raises(ValueError, match=message) as error:
    jax.eval_shape(lambda *qkv: bw.blockwise_attention(*qkv, segment_ids, **change),
                   q, k, v)
  assert "\n" not in str(error.value)
  assert "blockwise_attention" in str(error.value)

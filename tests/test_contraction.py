"""encoderx/models/contraction.py: the same values and gradients as jax's tensordot, the
kernel gradient's operands in the order that transposes the smaller one, nn.Dense's
adapter, the vocabulary scores with their bias as a column of the product on CPU, and
jax_order() for the bench's comparison."""
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from encoderx.tools.speed import bench, costs
from encoderx.models import contraction

import jaxprs  # pylint: disable=g-bad-import-order  (tests/ is on sys.path)

# (x's shape, kernel's shape, contracted dimensions): a feed-forward layer's first kernel
# (g larger than x), its second (x larger), attention's q/k/v and output projections.
CASES = [((2, 3, 8), (8, 32), 1), ((2, 3, 32), (32, 8), 1), ((2, 3, 8), (8, 2, 4), 1),
         ((2, 3, 2, 4), (2, 4, 8), 2)]


def _loss(contract, n):
  return lambda x, kernel: jnp.sum(jnp.sin(contract(x, kernel, n)))


@pytest.mark.parametrize("x_shape,kernel_shape,n", CASES)
def test_values_and_gradients_are_tensordots(x_shape, kernel_shape, n):
  keys = jax.random.split(jax.random.key(0))
  x = jax.random.normal(keys[0], x_shape)
  kernel = jax.random.normal(keys[1], kernel_shape)
  np.testing.assert_allclose(contraction.contract(x, kernel, n),
                             jnp.tensordot(x, kernel, n), rtol=1e-6, atol=1e-6)
  ours = jax.grad(_loss(contraction.contract, n), (0, 1))(x, kernel)
  theirs = jax.grad(_loss(jnp.tensordot, n), (0, 1))(x, kernel)
  for mine, reference in zip(ours, theirs):
    assert mine.shape == reference.shape and mine.dtype == reference.dtype
    np.testing.assert_allclose(mine, reference, rtol=1e-5, atol=1e-5)


def _kernel_gradient_operands(x_shape, kernel_shape, n, transpose_input=False):
  """The shapes of the operands of the dot_general that makes the kernel's gradient."""
  x, kernel = jnp.zeros(x_shape), jnp.zeros(kernel_shape)
  contract = functools.partial(contraction.contract, transpose_input=transpose_input)
  jaxpr = jax.make_jaxpr(jax.grad(_loss(contract, n), 1))(x, kernel)
  batch = len(x_shape) - n
  found = []
  for equation in jaxprs.equations(jaxpr.jaxpr):
    if equation.primitive.name == "dot_general":
      (lhs_contracting, _), _ = equation.params["dimension_numbers"]
      if tuple(lhs_contracting) == tuple(range(batch)):  # sums over batch and length
        found.append(tuple(tuple(v.aval.shape) for v in equation.invars))
  assert len(found) == 1, found
  return found[0]


def test_the_kernel_gradient_puts_the_smaller_operand_first():
  """XLA:CPU transposes the first operand: x when it is the smaller (a feed-forward
  layer's first kernel), the output's gradient when that is (its second)."""
  assert _kernel_gradient_operands((2, 3, 8), (8, 32), 1) == ((2, 3, 8), (2, 3, 32))
  assert _kernel_gradient_operands((2, 3, 32), (32, 8), 1) == ((2, 3, 8), (2, 3, 32))


@pytest.mark.parametrize("x_shape,kernel_shape,n", CASES)
def test_transpose_input_puts_x_first_with_the_same_gradients(x_shape, kernel_shape, n):
  """A pre-norm feed-forward's output kernel (x the larger: its second case) transposes
  x, not the residual stream's gradient; the values and gradients stay tensordot's."""
  assert _kernel_gradient_operands(x_shape, kernel_shape, n, transpose_input=True)[0] == (
      x_shape)
  keys = jax.random.split(jax.random.key(3))
  x, kernel = jax.random.normal(keys[0], x_shape), jax.random.normal(keys[1], kernel_shape)
  contract = functools.partial(contraction.contract, transpose_input=True)
  ours = jax.grad(_loss(contract, n), (0, 1))(x, kernel)
  theirs = jax.grad(_loss(jnp.tensordot, n), (0, 1))(x, kernel)
  for mine, reference in zip(ours, theirs):
    np.testing.assert_allclose(mine, reference, rtol=1e-5, atol=1e-5)


def test_dense_adapter_takes_denses_case_and_leaves_others_to_lax():
  x = jax.random.normal(jax.random.key(1), (2, 5, 8))
  plain = nn.Dense(16)
  ours = nn.Dense(16, dot_general=contraction.dot_general)
  params = plain.init(jax.random.key(2), x)
  grad = lambda dense: jax.grad(lambda p: jnp.sum(jnp.cos(dense.apply(p, x))))(params)
  np.testing.assert_allclose(ours.apply(params, x), plain.apply(params, x), rtol=1e-6,
                             atol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5),
               grad(ours), grad(plain))
  kernel_jaxpr = jax.make_jaxpr(lambda x, k: contraction.dot_general(
      x, k, (((2,), (0,)), ((), ()))))(x, params["params"]["kernel"])
  assert "custom_vjp" in str(kernel_jaxpr)
  # A batched contraction is not Dense's case: lax.dot_general's own.
  a, b = jnp.ones((3, 4, 5)), jnp.ones((3, 5, 6))
  numbers = (((2,), (1,)), ((0,), (0,)))
  assert "custom_vjp" not in str(jax.make_jaxpr(
      lambda a, b: contraction.dot_general(a, b, numbers))(a, b))
  np.testing.assert_array_equal(contraction.dot_general(a, b, numbers),
                                jax.lax.dot_general(a, b, numbers))


def _scores_reference(x, table, bias):
  product = x @ table.T
  return product if bias is None else product + bias


@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("dtype,tolerance", [(jnp.float32, 1e-5), (jnp.bfloat16, 2e-2)])
def test_scores_values_and_gradients_are_jaxs(with_bias, dtype, tolerance):
  keys = jax.random.split(jax.random.key(4), 3)
  x = jax.random.normal(keys[0], (2, 3, 8), dtype)
  table = jax.random.normal(keys[1], (16, 8), dtype)
  bias = jax.random.normal(keys[2], (16,), dtype) if with_bias else None
  np.testing.assert_allclose(np.float32(contraction.scores(x, table, bias)),
                             np.float32(_scores_reference(x, table, bias)),
                             rtol=tolerance, atol=tolerance)
  arguments = (x, table) + ((bias,) if with_bias else ())
  weights = jax.random.normal(jax.random.key(5), (2, 3, 16))
  loss = lambda scores: lambda *a: jnp.sum(scores(*a, *([None] * (3 - len(a))))
                                           .astype(jnp.float32) * weights)
  ours = jax.grad(loss(contraction.scores), range(len(arguments)))(*arguments)
  theirs = jax.grad(loss(_scores_reference), range(len(arguments)))(*arguments)
  for mine, reference in zip(ours, theirs):
    assert mine.shape == reference.shape and mine.dtype == reference.dtype
    np.testing.assert_allclose(np.float32(mine), np.float32(reference), rtol=tolerance,
                               atol=tolerance)


def _contracted_sizes(monkeypatch, backend):
  """The contracted sizes of the dot_generals of the scores' forward and backward, and
  whether an add is among their operations, traced as for `backend`."""
  monkeypatch.setattr(jax, "default_backend", lambda: backend)
  x, table, bias = jnp.ones((2, 3, 8)), jnp.ones((16, 8)), jnp.ones((16,))
  jaxpr = jax.make_jaxpr(jax.grad(lambda *a: jnp.sum(contraction.scores(*a)), (0, 1, 2)))(
      x, table, bias)
  equations = list(jaxprs.equations(jaxpr.jaxpr))
  sizes = [int(np.prod([e.invars[0].aval.shape[d]
                        for d in e.params["dimension_numbers"][0][0]]))
           for e in equations if e.primitive.name == "dot_general"]
  return sorted(sizes), any(e.primitive.name == "add" for e in equations)


def test_scores_bias_is_a_column_of_the_product_on_cpu_only(monkeypatch):
  """On CPU the forward contracts E + 1 (x's ones against the bias), the table's and
  bias's gradient is one product over the 6 predictions and the input's over the 16
  scores, and no add; elsewhere the forward contracts E and adds the bias."""
  assert _contracted_sizes(monkeypatch, "cpu") == ([6, 9, 16], False)
  gpu_sizes, gpu_adds = _contracted_sizes(monkeypatch, "gpu")
  assert 8 in gpu_sizes and 9 not in gpu_sizes and gpu_adds


@pytest.mark.parametrize("with_bias", [True, False])
def test_scores_table_gradient_is_compiled_with_x_first(with_bias):
  """XLA:CPU's optimized step forms the table's gradient as x · g, [E (+ 1), V], with or
  without a bias: folding the transpose back into the product gave g · x, [V, E], with g
  [predictions, V] transposed, in its Eigen path (eurobert_tiny's head, no bias)."""
  predictions, embed, vocab = 96, 24, 320
  x, table = jnp.ones((predictions, embed)), jnp.ones((vocab, embed))
  bias = jnp.ones((vocab,)) if with_bias else None
  grad = jax.jit(jax.grad(lambda x, table: jnp.sum(jnp.sin(contraction.scores(
      x, table, bias))), (0, 1)))
  hlo = grad.lower(x, table).compile().as_text()
  products = {_laid_out_shape(line.split(" = ")[1].split(" ")[0])
              for line in hlo.splitlines() if " dot(" in line}
  assert (embed + with_bias, vocab) in products, products
  assert (vocab, embed) not in products, products


def _laid_out_shape(hlo_shape: str) -> tuple[int, ...]:
  """'f32[320,24]{0,1}' -> (24, 320): the dimensions from major to minor in memory."""
  dims, layout = hlo_shape.split("[")[1].split("]{")
  dims = [int(d) for d in dims.split(",")]
  minor_to_major = [int(d) for d in layout.rstrip("}").split(",")]
  return tuple(dims[d] for d in reversed(minor_to_major))


def test_jax_order_traces_jaxs_own_gradient_and_is_restored():
  """Inside jax_order() the kernel gradient is jax's: the output's gradient first."""
  with contraction.jax_order():
    assert _kernel_gradient_operands((2, 3, 8), (8, 32), 1) == ((2, 3, 32), (2, 3, 8))
  assert _kernel_gradient_operands((2, 3, 8), (8, 32), 1) == ((2, 3, 8), (2, 3, 32))


def test_bench_times_the_step_both_ways(capsys):
  args = bench.parse_args(["--kernel_gradient_cost", "--models=bert_tiny", "--steps=1",
                           "--batch_size=4"])
  (row,) = costs.kernel_gradient_cost(args)
  assert row["model"] == "bert_tiny"
  assert row["contract_ms"] > 0 and row["jax_order_ms"] > 0 and row["paired_median"] > 0
  out = capsys.readouterr().out
  assert "bert_tiny contract" in out and "bert_tiny jax order" in out
  assert bench.parse_args(["--kernel_gradient_cost"]).models == ["bert_small"]

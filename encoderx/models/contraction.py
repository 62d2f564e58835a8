"""x · kernel over x's last dimensions, with the kernel's gradient formed the cheap way.

A layer's kernel gradient contracts the input x with the output's gradient g over their
leading (batch, length) dimensions, so one of the two must be laid out transposed for
the matmul, and XLA:CPU transposes the operand that comes first. jax's transpose rule
always puts g first (dot_general(g, x), then a transpose of the small result), so XLA
copies g transposed and runs the product in its slower Eigen path. In a feed-forward
layer's first kernel g is four times the size of x. `contract`'s gradient puts the
smaller of x and g first; `python -m encoderx.tools.speed.bench --kernel_gradient_cost` times the
train step both ways (on a 2-core CPU bert_small's took 1.12x as long in jax's order;
README, "What changed for speed"). The arithmetic is the same contraction; only the
operands' order differs.

`transpose_input=True` puts x first whatever the sizes: for a layer whose output
gradient is a pre-norm stack's residual stream (the feed-forward's output kernel of
ModernBERT and EuroBERT). That gradient is a chain of elementwise adds through every
layer above, which XLA:CPU does not write out but fuses into each consumer: into a
transposing copy of g, the chain of the whole stack above is recomputed per layer,
quadratic in depth. ModernBERT-base's step at 1,024 tokens took 24.2 s with g
transposed there and 15.0 s with x (2-core CPU, batch 2).

`scores(x, table, bias)` is x · tableᵀ + bias, an LM head's scores against the
vocabulary (the tied token embeddings or a head's own table): the table's gradient is
the kernel gradient of `contract(x, table.T)`, x first. On XLA:CPU, which adds a bias in
a pass of its own over the [predictions, vocabulary] scores and sums the bias's gradient
in another, the bias goes into the product as one more column of x (ones) and of the
table, and its gradient comes out of the table's product as one more row. Measured on
modernbert_tiny's train step (32 x 40 predictions of 8,000 scores), one core each, side
by side: 9% faster than jax's gradient. With or without a bias (EuroBERT's head has
none) the table's gradient stays x · g, [E (+ 1), V], transposed after: left to itself,
XLA folds that transpose into the product as g · x, g transposed, which XLA:CPU ran in its
Eigen path (eurobert_tiny: 52 of 320 ms a step on one core; 310 ms a step after).
Elsewhere (TPU, GPU) the bias is added as usual, which XLA fuses into the product there,
where a contraction one longer would be padded.

`contract(x, kernel, n)` is `jnp.tensordot(x, kernel, n)`: the last n dimensions of x
against the first n of kernel. `dot_general` is it with `lax.dot_general`'s signature,
for flax's `nn.Dense(dot_general=...)`. Inside `with jax_order():` it differentiates as
jax would (for the bench's comparison and the tests).
"""
from __future__ import annotations

import contextlib
import functools

import jax
import jax.numpy as jnp

_jax_order = False  # read when a function is traced


@contextlib.contextmanager
def jax_order():
  """Functions traced inside take jax's own gradient of `contract` (g first)."""
  global _jax_order
  previous, _jax_order = _jax_order, True
  try:
    yield
  finally:
    _jax_order = previous


def contract(x: jax.Array, kernel: jax.Array, n: int = 1,
             transpose_input: bool = False) -> jax.Array:
  """x [..., K1..Kn] · kernel [K1..Kn, N...] -> [..., N...]; `transpose_input`: the
  kernel's gradient transposes x even where it is the larger (see the module doc)."""
  if _jax_order:
    return jnp.tensordot(x, kernel, n)
  return _contract(x, kernel, n, transpose_input)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _contract(x, kernel, n, transpose_input):
  return jnp.tensordot(x, kernel, n)


def _forward(x, kernel, n, transpose_input):
  return jnp.tensordot(x, kernel, n), (x, kernel)


def _backward(n, transpose_input, residuals, g):
  x, kernel = residuals
  batch = tuple(range(x.ndim - n))  # summed over in the kernel's gradient
  outputs = kernel.ndim - n
  grad_x = jnp.tensordot(g, kernel, (tuple(range(len(batch), g.ndim)),
                                     tuple(range(n, kernel.ndim))))
  if transpose_input or x.size <= g.size:
    grad_kernel = jnp.tensordot(x, g, (batch, batch))
  else:  # jax's order: g first, then the kernel's axes put back in place
    grad_kernel = jnp.tensordot(g, x, (batch, batch)).transpose(
        *range(outputs, outputs + n), *range(outputs))
  return grad_x, grad_kernel


_contract.defvjp(_forward, _backward)


def dot_general(lhs, rhs, dimension_numbers, precision=None,
                preferred_element_type=None, transpose_input: bool = False):
  """`lax.dot_general`; nn.Dense's case (lhs's last dimension against rhs's first, no
  batch dimensions, default precision and type) goes through `contract` (with
  `transpose_input`: bind it with functools.partial for nn.Dense)."""
  (lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch) = dimension_numbers
  if (tuple(lhs_contracting) == (lhs.ndim - 1,) and tuple(rhs_contracting) == (0,)
      and not lhs_batch and not rhs_batch and precision is None
      and preferred_element_type is None):
    return contract(lhs, rhs, 1, transpose_input)
  return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision,
                             preferred_element_type=preferred_element_type)


def scores(x: jax.Array, table: jax.Array, bias: jax.Array | None = None) -> jax.Array:
  """x [..., E] · table [V, E]ᵀ (+ bias [V]) -> [..., V], all of x's dtype; on CPU with
  the table's gradient formed x first and the bias as one more column (module doc)."""
  if not _jax_order and jax.default_backend() == "cpu":
    return _cpu_scores(x, table, bias)
  product = contract(x, table.T)  # jax's own product and gradient inside jax_order()
  return product if bias is None else product + bias


def _with_ones(x: jax.Array) -> jax.Array:
  """x with a column of ones after its last."""
  return jnp.concatenate([x, jnp.ones((*x.shape[:-1], 1), x.dtype)], axis=-1)


@jax.custom_vjp
def _cpu_scores(x, table, bias):
  if bias is None:
    return jnp.dot(x, table.T)
  return jnp.dot(_with_ones(x), jnp.concatenate([table, bias[:, None]], axis=1).T)


def _scores_forward(x, table, bias):
  return _cpu_scores(x, table, bias), (x, table, bias)  # None: an empty pytree


def _scores_backward(residuals, g):
  x, table, bias = residuals
  has_bias = bias is not None
  batch = tuple(range(x.ndim - 1))
  # [E (+ 1), V], x first as in `contract`: the table's gradient (then the bias's); the
  # barrier keeps XLA from folding the transpose below into it (module doc).
  table_and_bias = jax.lax.optimization_barrier(
      jnp.tensordot(_with_ones(x) if has_bias else x, g, (batch, batch)))
  grad_bias = table_and_bias[-1] if has_bias else None
  return jnp.tensordot(g, table, 1), table_and_bias[:x.shape[-1]].T, grad_bias


_cpu_scores.defvjp(_scores_forward, _scores_backward)

"""The attention kernels on a device: cuDNN's fused attention against XLA's, encoderx's
Pallas kernel with dropout against its XLA reference (relative errors of the output and
the three gradients), their times with calls chained in one jit, and the kernel's
tilings swept for the fastest (`python launch/gpu_bench.py tune`). On a GPU the kernel
compiles; elsewhere (the tests) it is interpreted."""
from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp

from encoderx.models import attention as attention_lib
from encoderx.models import flash_attention, masks


def _attention_inputs(shape=(8, 512, 16, 64)):
  """Heads [batch, length, heads, head_dim] in bf16 (BERT-large's by default) over
  padded rows: q, k, v, segment ids."""
  keys = jax.random.split(jax.random.key(1), 4)
  query, key, value = (jax.random.normal(k, shape, jnp.bfloat16) for k in keys[:3])
  lengths = jax.random.randint(keys[3], (shape[0],), shape[1] // 5, shape[1] + 1)
  segment_ids = (jnp.arange(shape[1])[None] < lengths[:, None]).astype(jnp.int32)
  return query, key, value, segment_ids


def chained_ms(attention, inputs, backward: bool, chain: int = 20, runs: int = 5
               ) -> float:
  """Milliseconds a call of `attention(q, k, v, segment_ids)` (with `backward`, its
  forward and the gradients of q, k and v) takes on the device: `chain` calls in one jit,
  each feeding the next, so that no dispatch or sync is timed; the fastest of `runs`."""
  _, key, value, segment_ids = inputs

  def call(q):
    if not backward:
      return attention(q, key, value, segment_ids)
    loss = lambda q, k, v: jnp.sum(attention(q, k, v, segment_ids).astype(jnp.float32)
                                   ** 2)
    dq, dk, dv = jax.grad(loss, (0, 1, 2))(q, key, value)
    return (dq + dk + dv).astype(q.dtype)

  run = jax.jit(lambda q: jax.lax.fori_loop(0, chain, lambda i, q: call(q), q))
  jax.block_until_ready(run(inputs[0]))
  times = []
  for _ in range(runs):
    start = time.perf_counter()
    jax.block_until_ready(run(inputs[0]))
    times.append(time.perf_counter() - start)
  return 1e3 * min(times) / chain


def outputs_and_gradients(attention, inputs) -> list:
  """`attention(q, k, v, segment_ids)`'s output and the gradients of q, k and v of the
  sum of its squares over the real (unpadded) rows of `inputs` (`_attention_inputs`)."""
  query, key, value, segment_ids = inputs
  real = segment_ids[:, :, None, None] > 0

  def loss(q, k, v):
    out = attention(q, k, v, segment_ids)
    return jnp.sum(jnp.where(real, out.astype(jnp.float32), 0) ** 2), out
  (_, out), grads = jax.jit(jax.value_and_grad(loss, (0, 1, 2), has_aux=True))(
      query, key, value)
  return [out, *grads]


def relative_errors(got: list, want: list, segment_ids) -> list[float]:
  """Relative errors of each of `got` (`outputs_and_gradients`) against `want`'s, over
  the real rows."""
  real = segment_ids[:, :, None, None] > 0

  def relative_error(a, b):
    a, b = (jnp.where(real, x, 0).astype(jnp.float32) for x in (a, b))
    return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))
  return [relative_error(a, b) for a, b in zip(got, want)]


def _compare_attention(title: str, candidate, reference, shape=(8, 512, 16, 64)) -> None:
  """Prints the relative errors of `candidate`'s output and gradients against
  `reference`'s, over heads of `shape` (`_attention_inputs`)."""
  inputs = _attention_inputs(shape)
  errors = relative_errors(outputs_and_gradients(candidate, inputs),
                           outputs_and_gradients(reference, inputs), inputs[3])
  print(f"{title}, relative error: "
        + ", ".join(f"{n} {e:.1e}" for n, e in zip(("out", "dq", "dk", "dv"), errors)),
        flush=True)


def check_fused_attention() -> None:
  """cuDNN's attention against XLA's on this device (bf16, padded rows, BERT-large's
  heads): relative error of the outputs and of the three gradients."""
  query, key, _, _ = _attention_inputs()
  print("fused attention:", attention_lib.fused_implementation(query, key, None), flush=True)

  def dot_product_attention(implementation):
    return lambda q, k, v, segment_ids: jax.nn.dot_product_attention(
        q, k, v, mask=masks.padding_and_packing_mask(segment_ids),
        implementation=implementation)
  _compare_attention("cuDNN against XLA (bf16, padded rows)",
                     dot_product_attention("cudnn"), dot_product_attention("xla"))


def _kernel(rate: float, dropout_key, tiling=None):
  """encoderx's Pallas attention at `rate` (`tiling`: the default unless given): compiled
  on GPU, interpreted elsewhere (the tests)."""
  return lambda q, k, v, segment_ids: flash_attention.flash_attention(
      q, k, v, segment_ids, rate, dropout_key, tiling=tiling,
      interpret=jax.default_backend() != "gpu")


TIMED_SHAPES = ((32, 512, 16, 64), (32, 128, 16, 64))  # BERT-large's heads at 512, 128


def attention_times(shapes=TIMED_SHAPES) -> None:
  """Forward and forward + backward times (`chained_ms`) of XLA's attention with
  dropout 0.1, cuDNN's without dropout and encoderx's kernel with dropout 0.1 and 0,
  over BERT-large's heads at 512 and 128 (batch 32, bf16, padded rows)."""
  dropout_key = jax.random.key(5)
  candidates = {
      "XLA, dropout 0.1": lambda q, k, v, s: attention_lib.attend(
          q, k, v, masks.padding_and_packing_mask(s), None, 0.1, dropout_key),
      "cuDNN, no dropout": lambda q, k, v, s: attention_lib.attend(
          q, k, v, masks.padding_and_packing_mask(s)),
      "encoderx's kernel, dropout 0.1": _kernel(0.1, dropout_key),
      "encoderx's kernel, dropout 0": _kernel(0.0, None)}
  for shape in shapes:
    inputs = _attention_inputs(shape)
    print(f"attention over {shape} [batch, length, heads, head_dim], ms a call "
          "(chained in one jit):", flush=True)
    for name, candidate in candidates.items():
      print(f"  {name:32s} forward {chained_ms(candidate, inputs, False):.3f}, forward + "
            f"backward {chained_ms(candidate, inputs, True):.3f}", flush=True)


def check_flash_attention(shape=(8, 512, 16, 64), timed_shapes=TIMED_SHAPES) -> None:
  """encoderx's Pallas kernel with attention dropout 0.1 against the same computation in
  XLA (`flash_attention.reference_attention`: the same dropout bits), then the
  attention's times over `timed_shapes` (`attention_times`)."""
  dropout_key = jax.random.key(5)
  _compare_attention(
      "Pallas flash attention against XLA, dropout 0.1 (bf16, padded rows)",
      _kernel(0.1, dropout_key),
      lambda *inputs: flash_attention.reference_attention(*inputs, 0.1, dropout_key),
      shape)
  attention_times(timed_shapes)


# (block, warps, stages) tried for each kernel: the forward's with the default backward,
# then the backward's with the fastest forward.
FORWARD_TILINGS = tuple((block, warps, stages) for block in (64, 128) for warps in (4, 8)
                        for stages in (2, 3))
BACKWARD_TILINGS = tuple((block, warps, stages) for block in (32, 64) for warps in (4, 8)
                         for stages in (1, 2, 3))


def tune(shape, forward_tilings=FORWARD_TILINGS, backward_tilings=BACKWARD_TILINGS,
         chain: int = 20, runs: int = 5):
  """encoderx's kernel (attention dropout 0.1) over heads of `shape` [batch, length,
  heads, head_dim]: each forward tiling timed with the default backward, then each
  backward tiling with the fastest forward (`chained_ms`), each checked against the XLA
  reference (a tiling whose errors pass 2e-2 is not chosen). Prints and returns the
  fastest `flash_attention.Tiling`; `flash_attention.default_tiling` is where a new one
  goes."""
  dropout_key = jax.random.key(5)
  inputs = _attention_inputs(shape)
  want = outputs_and_gradients(  # the reference's, once for all candidates
      lambda *x: flash_attention.reference_attention(*x, 0.1, dropout_key), inputs)
  default = flash_attention.default_tiling(shape[3])
  print(f"tuning the attention kernel over {shape} [batch, length, heads, head_dim]; the "
        f"default: {default}", flush=True)

  def measure(tiling):
    """(forward ms, forward + backward ms), or None if it fails or errs."""
    kernel = _kernel(0.1, dropout_key, tiling)
    try:
      error = max(relative_errors(outputs_and_gradients(kernel, inputs), want,
                                  inputs[3]))
      forward, both = (chained_ms(kernel, inputs, backward, chain, runs)
                       for backward in (False, True))
    except Exception as e:  # pylint: disable=broad-except
      print(f"  {tiling}: failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
      return None
    print(f"  {tiling}: forward {forward:.3f}, forward + backward {both:.3f} ms; "
          f"relative error {error:.1e}", flush=True)
    return (forward, both) if error < 2e-2 else None

  def fastest(tilings, which):
    times = {t: measure(t) for t in tilings}
    times = {t: m[which] for t, m in times.items() if m is not None}
    if not times:
      raise SystemExit("no tiling ran correctly")
    return min(times, key=times.get)

  best = fastest([dataclasses.replace(default, block=block, forward_warps=warps,
                                      forward_stages=stages,
                                      backward_block=min(default.backward_block, block))
                  for block, warps, stages in forward_tilings], 0)
  best = fastest([dataclasses.replace(best, backward_block=block, backward_warps=warps,
                                      backward_stages=stages)
                  for block, warps, stages in backward_tilings if block <= best.block], 1)
  print(f"fastest: {best}", flush=True)
  return best

"""Attention in memory linear in the length, in XLA: blocks of queries against blocks of
keys with an online softmax, forward and backward, never an [length, length] array.

Follows FlashAttention (Dao et al., 2022, arXiv:2205.14135, Algorithms 1 and 2) and
FlashAttention-2 (Dao, 2023, arXiv:2307.08691) as jax's Pallas kernels write them
(`jax.experimental.pallas.ops.gpu.attention`: `mha_forward_kernel`'s online softmax, its
causal loop bounds from the block index; `mha_backward_kernel`): the forward keeps each
query row's running maximum and sum in float32 and rescales its output when the maximum
grows; the backward (a `jax.custom_vjp`) recomputes each block's probabilities from the
rows' log-sum-exp, with D = rowsum(dO * O), and accumulates dK and dV over the query
blocks that reach a key block, and dQ in place (FlashAttention-2's backward, Algorithm 2,
with dQ summed as it goes rather than by atomics).

What an encoder needs beyond that: packed documents and padding (`masks.attention_mask`
inside each block pair), a local window that visits only the key blocks it reaches
(`block_ranges`: static bounds for each query block, in a loop with those bounds; the
band is masked inside partial blocks) and grouped-query attention without repeating
the kv heads (query heads are viewed as [kv_heads, groups] and each block of keys is
read once per kv head). Lengths that are not a multiple of a block are padded inside
(padding segment 0: never attended to). No attention dropout: ModernBERT and EuroBERT
train without it (`masks.check_arguments` refuses a rate).

Called as the other kernels are (encoderx/models/masks.py), [batch, length, heads,
head_dim] in and out; a padding query gets what `attention.attend` gives it.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from encoderx.models import masks

MASK_VALUE = float(jnp.finfo(jnp.float32).min)
# Blocks of a global layer; a local layer's are about half its window, from 64 to 512
# (`default_block`). Measured on a 2-core CPU, forward and backward of 4 heads of 64 over
# 4,096 tokens: global 512 / 512 as fast as 256 / 512 and 1.3x faster than 256 / 256;
# window 128: 64 / 64 1.6x faster than 128 / 128 and 4x faster than 512 / 512.
GLOBAL_BLOCK = 512
# A global layer's row of at most this many tokens is one block: ModernBERT-base's train
# step at 1,024 tokens (batch 2) took 6.29 s, against 6.51 s in blocks of 512; the tiny
# ModernBERT's (batch 4) 120 ms against 131; longer rows keep blocks of 512 (blocks of
# 1,024 took 1.6x their time at 2,048 tokens, 2x at 4,096 and 8,192; 2-core Zen 5
# host, medians of 4 to 6 steps).
ONE_BLOCK_ROW = 1024


def _cdiv(a: int, b: int) -> int:
  return -(-a // b)


def default_block(window: int, length: int = 0) -> int:
  """Positions per block, queries and keys, unless given, for a row of `length` tokens
  (0: any; see GLOBAL_BLOCK and ONE_BLOCK_ROW)."""
  if window:
    return min(GLOBAL_BLOCK, max(64, window // 2))
  return length if 0 < length <= ONE_BLOCK_ROW else GLOBAL_BLOCK


def block_ranges(length: int, block: int, other_block: int, window: int
                 ) -> tuple[tuple[int, int], ...]:
  """For each block of `block` positions of a row of `length`, the [first, last) blocks
  of `other_block` positions it meets within the window: those holding a position j
  with |i - j| <= window // 2 for one of its own positions i < length (all blocks for
  window 0). The window is symmetric, so the same function gives the key blocks of a
  query block and the query blocks of a key block."""
  count = _cdiv(length, other_block)
  ranges = []
  for start in range(0, length, block):
    if not window:
      ranges.append((0, count))
      continue
    first = max(0, start - window // 2)
    last = min(length - 1, min(start + block, length) - 1 + window // 2)
    ranges.append((first // other_block, last // other_block + 1))
  return tuple(ranges)


def visits_every_block(length: int, window: int) -> bool:
  """Whether, at the default block, every query block of a row of `length` meets every
  key block within `window` (always for window 0): the band then saves no work over the
  whole row."""
  block = default_block(window, length)
  count = _cdiv(length, block)
  return all(r == (0, count) for r in block_ranges(length, block, block, window))


@dataclasses.dataclass(frozen=True)
class _Plan:
  """The static shape of one call: blocks, their ranges, the softmax's scale."""
  length: int
  block_q: int
  block_k: int
  window: int
  scale: float
  key_blocks: tuple[tuple[int, int], ...]  # per query block
  query_blocks: tuple[tuple[int, int], ...]  # per key block

  @property
  def padded_q(self) -> int:
    return len(self.key_blocks) * self.block_q

  @property
  def padded_k(self) -> int:
    return len(self.query_blocks) * self.block_k


def _bounds(ranges, index):
  """The (first, last) of `ranges` for a traced block index (static when all equal)."""
  firsts, lasts = zip(*ranges)
  if len(set(ranges)) == 1:
    return firsts[0], lasts[0]
  return jnp.asarray(np.array(firsts, np.int32))[index], jnp.asarray(
      np.array(lasts, np.int32))[index]


def _block(x, index, size, axis):
  return lax.dynamic_slice_in_dim(x, index * size, size, axis)


def _logits_and_mask(plan, q, k, q_segments, k_segments, q_start, k_start):
  """Scaled logits [batch, kv_heads, groups, block_q, block_k] (float32) of a block
  pair, and where they are attended to (q [b, kv, g, bq, d], k [b, kv, bk, d])."""
  s = jnp.einsum("bkgqd,bksd->bkgqs", q, k, preferred_element_type=jnp.float32)
  s = s * jnp.float32(plan.scale)
  q_positions = q_start + jnp.arange(plan.block_q)
  k_positions = k_start + jnp.arange(plan.block_k)
  mask = masks.attention_mask(q_segments[:, None, None, :], k_segments[:, None, None, :],
                              q_positions, k_positions, plan.window)
  return s, mask


def _forward(plan, q, k, v, segments):
  """q [b, kv, g, Lq, d], k and v [b, kv, Lk, d], segments [b, L] padded to both ->
  out like q (float32; 0 where a row attends to nothing) and the rows' log-sum-exp
  [b, kv, g, Lq]."""
  q_segments = jnp.pad(segments, ((0, 0), (0, plan.padded_q - plan.length)))
  k_segments = jnp.pad(segments, ((0, 0), (0, plan.padded_k - plan.length)))
  batch, kv_heads, groups, _, head_dim = q.shape
  row_shape = (batch, kv_heads, groups, plan.block_q)

  def query_block(_, i):
    qb = _block(q, i, plan.block_q, 3)
    q_seg = _block(q_segments, i, plan.block_q, 1)

    def key_block(j, carry):
      o, row_max, row_sum = carry
      s, mask = _logits_and_mask(plan, qb, _block(k, j, plan.block_k, 2), q_seg,
                                 _block(k_segments, j, plan.block_k, 1),
                                 i * plan.block_q, j * plan.block_k)
      s = jnp.where(mask, s, MASK_VALUE)
      new_max = jnp.maximum(row_max, s.max(axis=-1))
      correction = jnp.exp(row_max - new_max)
      p = jnp.where(mask, jnp.exp(s - new_max[..., None]), 0.0)
      row_sum = correction * row_sum + p.sum(axis=-1)
      vb = _block(v, j, plan.block_k, 2)
      pv = jnp.einsum("bkgqs,bksd->bkgqd", p.astype(vb.dtype), vb,
                      preferred_element_type=jnp.float32)
      return correction[..., None] * o + pv, new_max, row_sum

    first, last = _bounds(plan.key_blocks, i)
    o, row_max, row_sum = lax.fori_loop(
        first, last, key_block,
        (jnp.zeros(row_shape + (head_dim,), jnp.float32),
         jnp.full(row_shape, MASK_VALUE, jnp.float32), jnp.zeros(row_shape, jnp.float32)))
    row_sum = jnp.where(row_sum > 0, row_sum, 1.0)  # a padding query's row: all zero
    return None, (o / row_sum[..., None], row_max + jnp.log(row_sum))

  _, (out, lse) = lax.scan(query_block, None, jnp.arange(len(plan.key_blocks)))
  # [blocks, b, kv, g, bq, ...] -> [b, kv, g, Lq, ...]
  out = jnp.moveaxis(out, 0, 3).reshape(batch, kv_heads, groups, plan.padded_q, head_dim)
  lse = jnp.moveaxis(lse, 0, 3).reshape(batch, kv_heads, groups, plan.padded_q)
  return out, lse


def _backward(plan, q, k, v, segments, out, lse, d_out):
  """dq, dk, dv (float32, shaped as q, k, v) by blocks: each key block's dK and dV over
  the query blocks that reach it; dQ accumulated in place."""
  q_segments = jnp.pad(segments, ((0, 0), (0, plan.padded_q - plan.length)))
  k_segments = jnp.pad(segments, ((0, 0), (0, plan.padded_k - plan.length)))
  delta = jnp.einsum("bkgqd,bkgqd->bkgq", d_out.astype(jnp.float32), out)
  batch, kv_heads, _, head_dim = k.shape

  def key_block(dq, j):
    kb, vb = _block(k, j, plan.block_k, 2), _block(v, j, plan.block_k, 2)
    k_seg = _block(k_segments, j, plan.block_k, 1)

    def query_block(i, carry):
      dk, dv, dq = carry
      qb, dob = _block(q, i, plan.block_q, 3), _block(d_out, i, plan.block_q, 3)
      s, mask = _logits_and_mask(plan, qb, kb, _block(q_segments, i, plan.block_q, 1),
                                 k_seg, i * plan.block_q, j * plan.block_k)
      p = jnp.where(mask, jnp.exp(s - _block(lse, i, plan.block_q, 3)[..., None]), 0.0)
      # dV and dK summed transposed ([b, kv, d, block_k]), with the [queries, keys] block
      # second: contracted over its queries, it is then read as laid out. As the first
      # operand (dV = Pᵀ dO), XLA:CPU copied it transposed: ModernBERT-base's train step
      # at 1,024 tokens spent 95 ms of op time a global layer on that copy of P.
      dv = dv + jnp.einsum("bkgqd,bkgqs->bkds", dob, p.astype(dob.dtype),
                           preferred_element_type=jnp.float32)
      dp = jnp.einsum("bkgqd,bksd->bkgqs", dob, vb, preferred_element_type=jnp.float32)
      ds = p * (dp - _block(delta, i, plan.block_q, 3)[..., None])  # 0 where masked
      dk = dk + jnp.einsum("bkgqd,bkgqs->bkds", qb, ds.astype(qb.dtype),
                           preferred_element_type=jnp.float32)
      dq_block = jnp.einsum("bkgqs,bksd->bkgqd", ds.astype(kb.dtype), kb,
                            preferred_element_type=jnp.float32)
      dq = lax.dynamic_update_slice_in_dim(
          dq, _block(dq, i, plan.block_q, 3) + dq_block, i * plan.block_q, 3)
      return dk, dv, dq

    zeros = jnp.zeros((batch, kv_heads, head_dim, plan.block_k), jnp.float32)
    first, last = _bounds(plan.query_blocks, j)
    dk, dv, dq = lax.fori_loop(first, last, query_block, (zeros, zeros, dq))
    return dq, (dk, dv)

  dq, (dk, dv) = lax.scan(key_block, jnp.zeros(q.shape, jnp.float32),
                          jnp.arange(len(plan.query_blocks)))
  # [blocks, b, kv, d, block_k] -> [b, kv, Lk, d]
  dk, dv = (jnp.moveaxis(x, 0, 2).swapaxes(-1, -2).reshape(k.shape) for x in (dk, dv))
  return dq * plan.scale, dk * plan.scale, dv


def _query_layout(plan, x, kv_heads):
  """[b, L, h, d] -> [b, kv, g, Lq, d], padded (query head h = kv * g + its index)."""
  batch, length, heads, head_dim = x.shape
  x = jnp.pad(x, ((0, 0), (0, plan.padded_q - length), (0, 0), (0, 0)))
  x = x.reshape(batch, plan.padded_q, kv_heads, heads // kv_heads, head_dim)
  return x.transpose(0, 2, 3, 1, 4)


def _to_blocks_layout(plan, query, key, value):
  """[b, L, h, d] -> q [b, kv, g, Lq, d] and k, v [b, kv, Lk, d], padded."""
  pad_k = ((0, 0), (0, plan.padded_k - plan.length), (0, 0), (0, 0))
  k, v = (jnp.pad(x, pad_k).transpose(0, 2, 1, 3) for x in (key, value))
  return _query_layout(plan, query, key.shape[2]), k, v


def _from_blocks_layout(plan, x, heads):
  """q's [b, kv, g, Lq, d] -> [b, L, h, d]."""
  x = x.transpose(0, 3, 1, 2, 4)[:, :plan.length]
  return x.reshape(*x.shape[:2], heads, x.shape[-1])


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(plan, query, key, value, segments):
  return _attention_forward(plan, query, key, value, segments)[0]


def _attention_forward(plan, query, key, value, segments):
  q, k, v = _to_blocks_layout(plan, query, key, value)
  out, lse = _forward(plan, q, k, v, segments)
  result = _from_blocks_layout(plan, out, query.shape[2]).astype(query.dtype)
  return result, (query, key, value, segments, out, lse)


def _attention_backward(plan, residuals, d_out):
  query, key, value, segments, out, lse = residuals
  q, k, v = _to_blocks_layout(plan, query, key, value)
  d_out = _query_layout(plan, d_out, key.shape[2])
  dq, dk, dv = _backward(plan, q, k, v, segments, out, lse, d_out)
  dq = _from_blocks_layout(plan, dq, query.shape[2]).astype(query.dtype)
  dk, dv = (x.transpose(0, 2, 1, 3)[:, :plan.length].astype(key.dtype) for x in (dk, dv))
  return dq, dk, dv, None


_attention.defvjp(_attention_forward, _attention_backward)


def blockwise_attention(query: jax.Array, key: jax.Array, value: jax.Array,
                        segment_ids: jax.Array, *, window: int = 0,
                        scale: float | None = None, block_q: int | None = None,
                        block_k: int | None = None, dropout_rate: float = 0.0,
                        dropout_key: jax.Array | None = None) -> jax.Array:
  """softmax(scale * q . k) over the keys of each query's own document within the
  window, times v, in memory linear in the length.

  query [batch, length, heads, head_dim]; key, value [batch, length, kv_heads,
  head_dim]; segment_ids [batch, length] (0: padding); window 0 (global) or an even
  number of tokens (|i - j| <= window // 2); scale: 1 / sqrt(head_dim) unless given;
  block_q, block_k: positions per block (`default_block` unless given; the whole
  length when shorter; other lengths are padded to a multiple). Returns [batch, length,
  heads, head_dim] in query's dtype; logits, softmax and sums in float32. See the module docstring and
  encoderx/models/masks.py."""
  del dropout_key  # refused with any rate by check_arguments
  masks.check_arguments(query, key, value, segment_ids, window, "blockwise_attention",
                        dropout_rate)
  length = query.shape[1]
  block_q = default_block(window, length) if block_q is None else block_q
  block_k = default_block(window, length) if block_k is None else block_k
  if block_q < 1 or block_k < 1:
    raise ValueError(f"blockwise_attention: blocks are positive; got block_q {block_q}, "
                     f"block_k {block_k}")
  block_q, block_k = min(block_q, length), min(block_k, length)
  plan = _Plan(length, block_q, block_k, window,
               float(query.shape[-1] ** -0.5 if scale is None else scale),
               block_ranges(length, block_q, block_k, window),
               block_ranges(length, block_k, block_q, window))
  out = _attention(plan, query, key, value, segment_ids.astype(jnp.int32))
  return masks.padding_queries_as_xla(out, value, segment_ids)

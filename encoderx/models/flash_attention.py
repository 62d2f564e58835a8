"""Flash attention with dropout for GPU: a Pallas (Triton) kernel, forward and backward.

Why it exists: with attention dropout, `attend` (encoderx/models/attention.py) cannot use
cuDNN's fused attention (jax fixes its dropout seed at compile time, so every step would
drop the same elements) and XLA writes the probabilities [batch, heads, query, key] out
and reads them back: on an H200 that costs BERT-large @512 39.5 ms of a 134.5 ms step
(README, "On a GPU"). Here the probabilities never leave the chip, and neither does the
dropout mask: each element's keep bit is hashed from the step's seed and the element's
coordinates (`keep_mask`), so the backward pass recomputes it block by block instead of
reading it. PyTorch's SDPA and FlashAttention do the same with Philox; a stateless hash is
what fits a Triton kernel written in jnp.

The kernels follow `jax.experimental.pallas.ops.gpu.attention` (Apache 2.0): its
FlashAttention-2 forward (online softmax in base 2) and the Triton tutorial's fused
backward (dK and dV over query blocks, then dQ over key blocks, in one program). What
differs: dropout on the probabilities; encoderx's mask (`masks.segment_mask`: a
query attends to the keys of its own packed sequence, and a key of segment 0 is never
attended: padding); and the softmax's row maximum and sum are kept apart, not as one
log-sum-exp, so that a row with no key to attend to (a padding query) comes out uniform
over the keys, exactly as XLA's softmax of `finfo.min` logits does (in a log-sum-exp,
log2(keys) vanishes beside that maximum).

Dropout draws what `encoderx.models.dropout` draws: 8 bits per element (the hash's top
byte), kept when at least `dropout.threshold(rate)`, survivors scaled by 256 / (256 -
threshold). `reference_attention` is the same function over whole arrays, on the model's
own softmax (`masks.attention_probabilities`); tests/test_flash_attention.py checks
the kernels against it (forward and gradients, with Pallas's interpreter on CPU) and the
mask's statistics.

Long context (issue 36): a local window (`window`: |i - j| <= window // 2, ModernBERT's
local layers) makes each program loop over the key blocks its query block reaches only
(and the backward over the query blocks a key block reaches), masking the band inside
the partial blocks, as jax's kernel bounds its loops for causal attention
(`mha_forward_kernel`'s `upper_bound`, `mha_backward_kernel`'s `lower_bound`); the mask
is `masks.attention_mask`, the one all kernels share. Grouped-query attention: key and
value may have fewer heads (query head h reads kv head h // groups, through the
BlockSpecs' index maps); the backward computes dK and dV per query head and sums each
group's. The kernel takes q and k as they come (rotary positions already applied).
Packed documents (ModernBERT's and EuroBERT's unpadded rows): a block of queries
visits only the key blocks within the extents of its documents
(`masks.document_extents`, computed beside the kernel), and a block of keys only the
query blocks within its documents', as flash-attention's variable-length kernels and
splash attention's segment masks skip the work between documents. On the 16 batches
`launch/gpu_bench.py record` takes from the bundled corpus, a global layer visits 44% of
the 64 x 64 block pairs of ModernBERT's rows of 8,192 tokens (documents of 2,000 to
4,000 tokens) and 85% of BERT's rows of 512 (padding). A padding query visits only some
keys, so its row is replaced by what `attention.attend` gives it
(`masks.padding_queries_as_xla`), with or without a window.

Under a mesh, `sharded_flash_attention` runs the kernel on each device's rows and heads
(`jax.shard_map`); the hash takes their place in the whole batch, so the bits are the
same on any mesh.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
from jax.sharding import PartitionSpec

from encoderx.models import dropout as dropout_lib
from encoderx.models import masks

MASK_VALUE = float(jnp.finfo(jnp.float32).min)
LOG2_E = math.log2(math.e)
_GOLDEN = 0x9E3779B9  # 2^32 / golden ratio: the Weyl step of splitmix


@dataclasses.dataclass(frozen=True)
class Tiling:
  """How the kernels split their work, and Triton's launch parameters for each.

  block: the forward's block of queries and of keys (a length must be a multiple of it,
    or a power of 2 below it); backward_block: the backward's (a power of 2, at most
    `block`); *_warps: warps per program; *_stages: software pipeline stages.
  `default_tiling` is what was measured; `launch/gpu_bench.py tune` measures others."""
  block: int = 64
  backward_block: int = 64
  forward_warps: int = 4
  backward_warps: int = 4
  forward_stages: int = 3
  backward_stages: int = 3

  def __post_init__(self):
    if not (_power_of_2(self.block) and self.block >= 32
            and _power_of_2(self.backward_block)
            and 16 <= self.backward_block <= self.block):
      raise ValueError(f"tiling blocks must be powers of 2, block >= 32 and 16 <= "
                       f"backward_block <= block; got {self}")


def default_tiling(head_dim: int) -> Tiling:
  """Measured on an H200 for heads of 64 (BERT-large's, 32 x 512, bf16, attention dropout
  0.1; README, "On a GPU"): blocks of 64 queries and 64 keys, 4 warps and 3 stages,
  forward and backward. The backward's 64 (jax's kernel has 32) let Triton use Hopper's
  warpgroup MMA: 0.65 ms against 1.18. Wider heads, unmeasured: jax's 8 forward warps
  and backward blocks of 32 (with 64 the sm_90 build spills 600 bytes a thread)."""
  if head_dim <= 64:
    return Tiling()
  return Tiling(backward_block=32, forward_warps=8)


def _fmix32(x: jax.Array) -> jax.Array:
  """MurmurHash3's 32-bit finalizer: a bijection whose every output bit depends on
  every input bit."""
  x = x ^ (x >> 16)
  x = x * jnp.uint32(0x85EBCA6B)
  x = x ^ (x >> 13)
  x = x * jnp.uint32(0xC2B2AE35)
  return x ^ (x >> 16)


def keep_mask(seed0: jax.Array, seed1: jax.Array, batch_head: jax.Array,
              rows: jax.Array, cols: jax.Array, key_length: int,
              threshold: int) -> jax.Array:
  """Which elements of the [rows, cols] block of a head's [query, key] matrix dropout
  keeps: splitmix32 of the head's stream (from the two seed words and batch * heads +
  head) stepped to the element's index (row * key_length + col); its top byte against
  `threshold`. Broadcasts: a scalar head in a kernel, [batch, heads, 1, 1] over whole
  arrays.

  Written for the kernel's inner loop, the same bits with fewer operations an element:
  the step's row part is added once a row, and the finalizer's last xor-shift, which
  leaves the top byte as it is, is left out (the top byte is compared in place)."""
  stream = _fmix32(seed0 ^ _fmix32(batch_head.astype(jnp.uint32) * jnp.uint32(_GOLDEN)
                                   + seed1))
  row_step = jnp.uint32((key_length * _GOLDEN) % 2**32)
  x = ((stream + rows.astype(jnp.uint32)[:, None] * row_step)
       + cols.astype(jnp.uint32)[None, :] * jnp.uint32(_GOLDEN))
  x = x ^ (x >> 16)
  x = x * jnp.uint32(0x85EBCA6B)
  x = x ^ (x >> 13)
  x = x * jnp.uint32(0xC2B2AE35)
  return x >= jnp.uint32(threshold << 24)


def _batch_head(stream_ref, batch: jax.Array, head: jax.Array, total_heads: int
                ) -> jax.Array:
  """The index of this program's head among all heads of the whole batch: its shard's
  first row and head (`stream_ref[2:4]`) plus its own, so that a sharded run hashes the
  bits one device would."""
  return ((stream_ref[2] + batch.astype(jnp.uint32)) * jnp.uint32(total_heads)
          + stream_ref[3] + head.astype(jnp.uint32))


def _window_blocks(start, block: int, other_block: int, count: int, window: int):
  """[first, last) of the `count` blocks of `other_block` positions that the block
  `start` of `block` positions reaches within the window (all for window 0); the same
  ranges as blockwise_attention.block_ranges, for lengths that are a multiple of the
  blocks."""
  if not window:
    return 0, count
  half = window // 2
  first = lax.div(jnp.maximum(start * block - half, 0), other_block)
  last = jnp.minimum(lax.div(start * block + block - 1 + half, other_block) + 1, count)
  return first, last


def _reached_blocks(first_ref, last_ref, start, block: int, other_block: int, count: int,
                    window: int):
  """[first, last) of the blocks of `other_block` positions that the block `start` of
  `block` positions reaches: within the window (`_window_blocks`) and within its
  documents' extents (first_ref, last_ref: masks.document_extents of the row), so that
  the blocks of other documents in a packed row are skipped. The relation is symmetric
  (a block reaches another where they share a document, or within the window), so the
  backward loops over the same ranges."""
  window_first, window_last = _window_blocks(start, block, other_block, count, window)
  own = pl.ds(start * block, block)
  document_first = lax.div(jnp.min(first_ref[own]), other_block)
  document_last = lax.div(jnp.max(last_ref[own]), other_block) + 1
  return (jnp.maximum(window_first, document_first),
          jnp.minimum(window_last, document_last))


def _forward_kernel(stream_ref, q_ref, k_ref, v_ref, segments_ref, first_ref, last_ref,
                    o_ref, max_ref, inverse_sum_ref, *, total_heads, block_q, block_k,
                    threshold, window, scale):
  """One block of queries of one head: online softmax over the key blocks it reaches."""
  key_length, head_dim = k_ref.shape
  start_q = pl.program_id(0)
  batch_head = _batch_head(stream_ref, pl.program_id(1), pl.program_id(2), total_heads)
  seed0, seed1 = stream_ref[0], stream_ref[1]
  rows = start_q * block_q + jnp.arange(block_q)
  q = q_ref[...]
  q_segments = segments_ref[pl.ds(start_q * block_q, block_q)]
  qk_scale = LOG2_E * scale

  def body(start_k, carry):
    o, row_max, row_sum = carry
    keys = pl.ds(start_k * block_k, block_k)
    cols = start_k * block_k + jnp.arange(block_k)
    qk = plgpu.dot(q, k_ref[keys, :].T) * qk_scale
    mask = masks.attention_mask(q_segments, segments_ref[keys], rows, cols, window)
    qk = jnp.where(mask, qk, MASK_VALUE)
    new_max = jnp.maximum(row_max, jnp.max(qk, axis=-1))
    correction = jnp.exp2(row_max - new_max)
    p = jnp.exp2(qk - new_max[:, None])
    row_sum = correction * row_sum + p.sum(axis=-1)
    if threshold:  # survivors are scaled once, at the end
      keep = keep_mask(seed0, seed1, batch_head, rows, cols, key_length, threshold)
      p = jnp.where(keep, p, 0.0)
    v = v_ref[keys, :]
    o = correction[:, None] * o + plgpu.dot(p.astype(v.dtype), v)
    return o, new_max, row_sum

  o = jnp.zeros((block_q, head_dim), jnp.float32)
  row_max = jnp.full((block_q,), -jnp.inf, jnp.float32)
  row_sum = jnp.zeros((block_q,), jnp.float32)
  first, last = _reached_blocks(first_ref, last_ref, start_q, block_q, block_k,
                                key_length // block_k, window)
  o, row_max, row_sum = lax.fori_loop(first, last, body, (o, row_max, row_sum))
  inverse_sum = 1.0 / row_sum
  survivor = dropout_lib.survivor_scale(threshold)  # 1 without dropout
  o_ref[...] = (o * (inverse_sum * survivor)[:, None]).astype(o_ref.dtype)
  max_ref[...] = row_max
  inverse_sum_ref[...] = inverse_sum


def _backward_kernel(stream_ref, q_ref, k_ref, v_ref, segments_ref, first_ref, last_ref,
                     do_ref, max_ref, inverse_sum_ref, delta_ref, dq_ref, dk_ref, dv_ref, *,
                     total_heads, block, threshold, window, scale):
  """dK and dV of one block of keys (over the query blocks that reach it), then dQ of
  the query block of the same index (over the key blocks it reaches)."""
  length, head_dim = q_ref.shape
  batch_head = _batch_head(stream_ref, pl.program_id(0), pl.program_id(1), total_heads)
  seed0, seed1 = stream_ref[0], stream_ref[1]
  num_blocks = length // block
  start = pl.program_id(2)
  own = pl.ds(start * block, block)
  own_span = start * block + jnp.arange(block)

  def probabilities(q, k, q_segments, k_segments, row_max, inverse_sum, rows, cols):
    """Softmax probabilities of a [queries, keys] block, the mask, and which elements
    dropout keeps (None without dropout)."""
    mask = masks.attention_mask(q_segments, k_segments, rows, cols, window)
    qk = jnp.where(mask, plgpu.dot(q, k.T) * (scale * LOG2_E), MASK_VALUE)
    p = jnp.exp2(qk - row_max[:, None]) * inverse_sum[:, None]
    keep = (keep_mask(seed0, seed1, batch_head, rows, cols, length, threshold)
            if threshold else None)
    return p, mask, keep

  def score_gradient(p, mask, keep, do, v, delta):
    """dS over `gradient_scale`: the softmax's backward of dP = dO . V^T through the
    dropout; none reaches a masked logit (a padding query's uniform row included)."""
    dp = plgpu.dot(do, v.T)
    if keep is not None:
      dp = jnp.where(keep, dp, 0.0)
    return jnp.where(mask, p * (dp - delta[:, None]), 0.0)

  # Survivors' scale and the logits' 1 / sqrt(d) multiply every dS and every dropped P:
  # they are applied once, to the sums (the kernel's caller divides D by the former).
  survivor = dropout_lib.survivor_scale(threshold)  # 1 without dropout
  gradient_scale = scale * survivor
  k, v = k_ref[own, :], v_ref[own, :]
  k_segments = segments_ref[own]

  def over_queries(i, carry):
    dk, dv = carry
    queries = pl.ds(i * block, block)
    q, do = q_ref[queries, :], do_ref[queries, :]
    p, mask, keep = probabilities(q, k, segments_ref[queries], k_segments,
                                  max_ref[queries], inverse_sum_ref[queries],
                                  i * block + jnp.arange(block), own_span)
    dropped = p if keep is None else jnp.where(keep, p, 0.0)
    dv = dv + plgpu.dot(dropped.astype(do.dtype).T, do)
    ds = score_gradient(p, mask, keep, do, v, delta_ref[queries])
    dk = dk + plgpu.dot(ds.astype(q.dtype).T, q)
    return dk, dv

  zeros = jnp.zeros((block, head_dim), jnp.float32)
  reaching = _reached_blocks(first_ref, last_ref, start, block, block, num_blocks, window)
  dk, dv = lax.fori_loop(*reaching, over_queries, (zeros, zeros))
  dk_ref[...] = (dk * gradient_scale).astype(dk_ref.dtype)
  dv_ref[...] = (dv * survivor).astype(dv_ref.dtype)

  q, do = q_ref[own, :], do_ref[own, :]
  q_segments = segments_ref[own]
  row_max, inverse_sum, delta = max_ref[own], inverse_sum_ref[own], delta_ref[own]

  def over_keys(j, dq):
    keys = pl.ds(j * block, block)
    k, v = k_ref[keys, :], v_ref[keys, :]
    p, mask, keep = probabilities(q, k, q_segments, segments_ref[keys], row_max,
                                  inverse_sum, own_span, j * block + jnp.arange(block))
    ds = score_gradient(p, mask, keep, do, v, delta)
    return dq + plgpu.dot(ds.astype(k.dtype), k)

  dq = lax.fori_loop(*reaching, over_keys, zeros)  # the reach is symmetric
  dq_ref[...] = (dq * gradient_scale).astype(dq_ref.dtype)


def _heads_spec(length: int, head_dim: int, index_map) -> pl.BlockSpec:
  """[batch, length, heads, head_dim] -> one head's [length, head_dim] block."""
  return pl.BlockSpec((None, length, None, head_dim), index_map)


def _power_of_2(n: int) -> bool:
  return n > 0 and n & (n - 1) == 0


def check_supported(query: jax.Array, key: jax.Array, value: jax.Array,
                    tiling: Tiling | None = None) -> None:
  """A ValueError unless `flash_attention` takes these heads: self-attention (one batch,
  length and head size for all three; key and value of one shape, with a number of heads
  that divides query's), a head size that is a power of 2 (>= 16, Triton's smallest
  dot), and a length that is a multiple of the tiling's block (`default_tiling`'s unless
  given) or a power of 2 below it, from 16 (Triton's blocks are powers of 2, its dots at
  least 16 wide)."""
  length, head_dim = query.shape[1], query.shape[3]
  block = (tiling or default_tiling(head_dim)).block
  if not (key.shape == value.shape and key.shape[:2] == query.shape[:2]
          and key.shape[3] == head_dim and query.shape[2] % key.shape[2] == 0
          and _power_of_2(head_dim) and head_dim >= 16
          and (length % block == 0 if length >= block
               else _power_of_2(length) and length >= 16)):
    raise ValueError(f"flash attention takes self-attention with a head size that is a "
                     f"power of 2 (>= 16) and a length that is a multiple of {block} or "
                     f"a power of 2 from 16 below it; got {query.shape}, {key.shape}, "
                     f"{value.shape} [batch, length, heads, head_dim]")


def _kv_head(h, groups: int):
  """The kv head that query head `h` reads."""
  return h if groups == 1 else lax.div(h, groups)


def _forward(query, key, value, segment_ids, first, last, stream, rate, tiling, interpret,
             total_heads, window, scale):
  batch, length, num_heads, head_dim = query.shape
  check_supported(query, key, value, tiling)
  groups = num_heads // key.shape[2]
  block = min(tiling.block, length)
  kv_heads = lambda i, b, h: (b, 0, _kv_head(h, groups), 0)
  stats_spec = pl.BlockSpec((None, None, block), lambda i, b, h: (b, h, i))
  stats_shape = jax.ShapeDtypeStruct((batch, num_heads, length), jnp.float32)
  kernel = functools.partial(_forward_kernel, total_heads=total_heads, block_q=block,
                             block_k=block, threshold=dropout_lib.threshold(rate),
                             window=window, scale=scale)
  out, row_max, inverse_sum = pl.pallas_call(
      kernel,
      grid=(length // block, batch, num_heads),
      in_specs=[pl.BlockSpec((4,), lambda i, b, h: (0,)),
                pl.BlockSpec((None, block, None, head_dim), lambda i, b, h: (b, i, h, 0)),
                _heads_spec(length, head_dim, kv_heads),
                _heads_spec(length, head_dim, kv_heads)]
               + [pl.BlockSpec((None, length), lambda i, b, h: (b, 0))] * 3,
      out_specs=[pl.BlockSpec((None, block, None, head_dim),
                              lambda i, b, h: (b, i, h, 0)), stats_spec, stats_spec],
      out_shape=[jax.ShapeDtypeStruct(query.shape, query.dtype), stats_shape,
                 stats_shape],
      compiler_params=plgpu.CompilerParams(num_warps=tiling.forward_warps,
                                           num_stages=tiling.forward_stages),
      interpret=interpret, name="encoderx_flash_attention_forward",
  )(stream, query, key, value, segment_ids, first, last)
  return out, (query, key, value, segment_ids, first, last, stream, out, row_max,
               inverse_sum)


def _backward(rate, tiling, interpret, total_heads, window, scale, residuals, d_out):
  (query, key, value, segment_ids, first, last, stream, out, row_max,
   inverse_sum) = residuals
  batch, length, num_heads, head_dim = query.shape
  kv_heads = key.shape[2]
  groups = num_heads // kv_heads
  block = min(tiling.backward_block, length)
  # D = rowsum(dO * O): with dropout too, since O already is the dropped P times V;
  # over the survivors' scale, which the kernel applies to the sums (`gradient_scale`).
  threshold = dropout_lib.threshold(rate)
  delta = jnp.einsum("blhd,blhd->bhl", d_out.astype(jnp.float32),
                     out.astype(jnp.float32)) / dropout_lib.survivor_scale(threshold)
  whole = lambda b, h, i: (b, 0, h, 0)
  whole_kv = lambda b, h, i: (b, 0, _kv_head(h, groups), 0)
  stats = pl.BlockSpec((None, None, length), lambda b, h, i: (b, h, 0))
  own = pl.BlockSpec((None, block, None, head_dim), lambda b, h, i: (b, i, h, 0))
  kernel = functools.partial(_backward_kernel, total_heads=total_heads, block=block,
                             threshold=threshold, window=window, scale=scale)
  # dK and dV per query head (summed over each group below, in float32).
  kv_gradient = lambda x: jax.ShapeDtypeStruct(
      query.shape, x.dtype if groups == 1 else jnp.float32)
  dq, dk, dv = pl.pallas_call(
      kernel,
      grid=(batch, num_heads, length // block),
      in_specs=[pl.BlockSpec((4,), lambda b, h, i: (0,)),
                _heads_spec(length, head_dim, whole),
                _heads_spec(length, head_dim, whole_kv),
                _heads_spec(length, head_dim, whole_kv)]
               + [pl.BlockSpec((None, length), lambda b, h, i: (b, 0))] * 3
               + [_heads_spec(length, head_dim, whole), stats, stats, stats],
      out_specs=[own, own, own],
      out_shape=[jax.ShapeDtypeStruct(query.shape, query.dtype), kv_gradient(key),
                 kv_gradient(value)],
      compiler_params=plgpu.CompilerParams(num_warps=tiling.backward_warps,
                                           num_stages=tiling.backward_stages),
      interpret=interpret, name="encoderx_flash_attention_backward",
  )(stream, query, key, value, segment_ids, first, last, d_out, row_max, inverse_sum,
    delta)
  if groups > 1:
    dk, dv = (g.reshape(batch, length, kv_heads, groups, head_dim).sum(3).astype(x.dtype)
              for g, x in ((dk, key), (dv, value)))
  return dq, dk, dv, None, None, None, None


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8, 9, 10, 11, 12))
def _flash_attention(query, key, value, segment_ids, first, last, stream, rate, tiling,
                     interpret, total_heads, window, scale):
  return _forward(query, key, value, segment_ids, first, last, stream, rate, tiling,
                  interpret, total_heads, window, scale)[0]


_flash_attention.defvjp(_forward, _backward)


def flash_attention(query: jax.Array, key: jax.Array, value: jax.Array,
                    segment_ids: jax.Array, dropout_rate: float = 0.0,
                    dropout_key: jax.Array | None = None, *, window: int = 0,
                    scale: float | None = None, tiling: Tiling | None = None,
                    interpret: bool = False,
                    shard: tuple[jax.Array, jax.Array, int] | None = None) -> jax.Array:
  """softmax(scale * q . k) over the keys of each query's own packed sequence
  (`segment_ids` [batch, length], 0 padding) within the window, dropped at
  `dropout_rate` with bits hashed from `dropout_key`, times v. query [batch, length,
  heads, head_dim], key and value [batch, length, kv_heads, head_dim] (kv_heads
  dividing heads), out like query (`check_supported` says which shapes). `window`: 0
  (global) or an even number of tokens, |i - j| <= window // 2; `scale`: 1 / sqrt(d)
  unless given. `tiling`: how the kernels split the work (`default_tiling` for the head
  size unless given). `interpret`: Pallas's interpreter, which runs anywhere (tests, on
  CPU). `shard`: (first batch row, first head, heads in all) of these heads in the whole
  batch's, when they are one device's shard of it (`sharded_flash_attention`)."""
  masks.check_arguments(query, key, value, segment_ids, window, "flash_attention",
                        dropout_rate, takes_dropout=True)
  if dropout_key is None:
    seed = jnp.zeros((2,), jnp.uint32)
    dropout_rate = 0.0
  elif dropout_lib.threshold(dropout_rate) == dropout_lib.LEVELS:
    return jnp.zeros_like(query)  # every element dropped, as dropout.dropout does
  else:
    seed = jax.random.bits(dropout_key, (2,), jnp.uint32)
  first_batch, first_head, total_heads = shard or (0, 0, query.shape[2])
  stream = jnp.concatenate([seed, jnp.stack([jnp.asarray(first_batch, jnp.uint32),
                                             jnp.asarray(first_head, jnp.uint32)])])
  scale = 1.0 / math.sqrt(query.shape[3]) if scale is None else float(scale)
  first, last = masks.document_extents(segment_ids)
  out = _flash_attention(query, key, value, segment_ids.astype(jnp.int32), first, last,
                         stream, float(dropout_rate),
                         tiling or default_tiling(query.shape[3]), interpret, total_heads,
                         window, scale)
  return masks.padding_queries_as_xla(out, value, segment_ids)


def check_heads_layout(heads_spec: PartitionSpec) -> tuple:
  """`heads_spec` over all four axes [batch, length, heads, head_dim]; a ValueError
  unless each device holds whole sequences and whole heads (the kernel's blocks span
  them)."""
  spec = tuple(heads_spec) + (None,) * (4 - len(heads_spec))
  if spec[1] is not None or spec[3] is not None:
    raise ValueError(f"flash attention takes whole sequences and heads on each device; "
                     f"the heads are laid out as {heads_spec}")
  return spec


def sharded_flash_attention(query: jax.Array, key: jax.Array, value: jax.Array,
                            segment_ids: jax.Array, dropout_rate: float,
                            dropout_key: jax.Array | None, heads_spec: PartitionSpec, *,
                            window: int = 0, scale: float | None = None,
                            interpret: bool = False) -> jax.Array:
  """`flash_attention` on each device's shard of the heads, laid out over the current
  mesh (`jax.set_mesh`) as `heads_spec` says ([batch, length, heads, head_dim]; the
  length and head_dim axes whole; kv heads split as the query heads are). XLA cannot
  split a kernel's call, and would gather the whole batch's heads to every device;
  under `jax.shard_map` each device runs its own rows and heads, hashing the bits of
  their place in the whole batch, so the result is one device's."""
  mesh = jax.sharding.get_abstract_mesh()
  spec = check_heads_layout(heads_spec)
  options = dict(window=window, scale=scale, interpret=interpret)
  if mesh.empty or all(mesh.shape[axis] == 1 for axes in spec if axes is not None
                       for axis in ((axes,) if isinstance(axes, str) else axes)):
    return flash_attention(query, key, value, segment_ids, dropout_rate, dropout_key,
                           **options)
  head_axes = () if spec[2] is None else (
      (spec[2],) if isinstance(spec[2], str) else spec[2])
  shards = math.prod(mesh.shape[axis] for axis in head_axes)
  if key.shape[2] % shards:
    raise ValueError(f"flash attention: {key.shape[2]} kv heads do not split over the "
                     f"{shards} devices of the heads' mesh axes {spec[2]}")
  total_heads = query.shape[2]

  def local(query, key, value, segment_ids):
    def first(axes, size):  # this device's first index along an axis split over `axes`
      return 0 if axes is None else jax.lax.axis_index(axes) * size
    shard = (first(spec[0], query.shape[0]), first(spec[2], query.shape[2]), total_heads)
    # The key is replicated: every device draws the same seed words.
    return flash_attention(query, key, value, segment_ids, dropout_rate, dropout_key,
                           shard=shard, **options)

  heads = PartitionSpec(*spec)
  return jax.shard_map(local, in_specs=(heads, heads, heads, PartitionSpec(spec[0], None)),
                       out_specs=heads, check_vma=False)(query, key, value, segment_ids)


def reference_attention(query: jax.Array, key: jax.Array, value: jax.Array,
                        segment_ids: jax.Array, dropout_rate: float = 0.0,
                        dropout_key: jax.Array | None = None, *,
                        window: int = 0) -> jax.Array:
  """`flash_attention` in plain jnp over whole arrays: the same softmax, mask and
  dropout bits, for tests."""
  batch, length, num_heads, _ = query.shape
  probabilities = masks.attention_probabilities(
      query, key, masks.local_window_mask(segment_ids, window))
  threshold = dropout_lib.threshold(dropout_rate) if dropout_key is not None else 0
  if threshold:
    seed = jax.random.bits(dropout_key, (2,), jnp.uint32)
    batch_head = jnp.arange(batch * num_heads).reshape(batch, num_heads, 1, 1)
    positions = jnp.arange(length)
    keep = keep_mask(seed[0], seed[1], batch_head, positions, positions, length,
                     threshold)
    probabilities = jnp.where(
        keep, probabilities * dropout_lib.survivor_scale(threshold), 0.0)
  out = masks.weighted_values(probabilities.astype(value.dtype), value)
  return masks.padding_queries_as_xla(out, value, segment_ids)

"""Attention on TPU: JAX's splash attention (a Mosaic kernel), with packed documents,
local windows and grouped-query attention, sharded over batch and heads.

`jax.experimental.pallas.ops.tpu.splash_attention` (splash_attention_kernel.py,
splash_attention_mask.py, splash_attention_mask_info.py in jax 0.10.2) is a
flash-attention kernel whose mask is known when it is built: `make_splash_mha` turns a
`MultiHeadMask` (here `LocalMask` with window // 2 on each side, or `FullMask`) into
tables of which key blocks each query block visits (blocks outside the window are never
fetched) and which are partial (masked inside); `SegmentIds` mask packed documents
inside the blocks. It takes one row, [heads, length, head_dim], with fewer kv heads than
query heads (query head h reads kv head h // groups), and does not scale the logits.
This module follows MaxText's use of it (src/maxtext/layers/attention_op.py,
`AttentionOp.tpu_flash_attention`, read at commit e591f30 of AI-Hypercomputer/maxtext):
q scaled beforehand (MaxText folds 1 / sqrt(head_dim) into the query, attentions.py
`query_pre_attn_scalar` / depth scaling), the kernel `jax.vmap`ped over the batch inside
a `jax.shard_map` over the batch and head axes of the mesh. MaxText builds the kernel
once outside with `head_shards` = the heads' devices and hands it into the shard_map by
its `manual_sharding_spec`; here each device builds the kernel of its own heads inside
(`head_shards=1`), the same tables without a kernel object crossing the shard_map.

Constraints (the kernel's, jax 0.10.2): blocks are multiples of 128 that divide the
length (`_check_block_sizes`); rows are padded here to a multiple of the block
(`padded_length`: padding is segment 0, never attended to) and cut back after. Key
and value have query's head_dim. The mask is static: the length, window and blocks
fix the kernel, built at trace time (its tables are cached by jax).

Off TPU the kernel runs in Pallas's TPU interpret mode (`interpret=None` picks
`pltpu.InterpretParams()`: the kernel as a TPU would run it, its VMEM and SMEM
simulated, uninitialised memory read as NaN, out-of-bounds reads raised), slowly: for
tests on CPU. What this does on a real TPU (speed, the best blocks, Mosaic's
compilation of these shapes) has not been measured.

A padding query gets what `attention.attend` gives it (`masks.padding_queries_as_xla`).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask
from jax.sharding import PartitionSpec

from encoderx.models import masks

LANES = 128  # splash's blocks are multiples of the TPU's vector lanes
DEFAULT_BLOCK = 512  # MaxText's default (block_q = block_kv = 512 for every pass)


def padded_length(length: int, block_sizes: splash_attention_kernel.BlockSizes | None
                  = None) -> int:
  """The row length the kernel runs: `length` rounded up to a multiple of the blocks
  (`default_block_sizes`' unless given)."""
  blocks = _block_values(block_sizes or default_block_sizes(length))
  multiple = math.lcm(*blocks)
  return -(-length // multiple) * multiple


def default_block_sizes(length: int) -> splash_attention_kernel.BlockSizes:
  """Blocks of 512 (MaxText's), or the largest of 256 and 128 that divides `length`
  rounded up to 128 (so that padding stays under 128 positions), every pass alike."""
  rounded = -(-length // LANES) * LANES
  block = next(b for b in (DEFAULT_BLOCK, 256, LANES) if rounded % b == 0)
  return splash_attention_kernel.BlockSizes(
      block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
      block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block,
      block_kv_dq=block)


def _block_values(block_sizes) -> list[int]:
  names = ("block_q", "block_kv", "block_kv_compute", "block_q_dkv", "block_kv_dkv",
           "block_kv_dkv_compute", "block_q_dq", "block_kv_dq")
  return [getattr(block_sizes, n) for n in names if getattr(block_sizes, n) is not None]


def _check_block_sizes(block_sizes) -> None:
  if not block_sizes.has_backward_blocks:
    raise ValueError(f"splash_attention: give the backward's blocks too (block_q_dkv, "
                     f"block_kv_dkv, block_q_dq, block_kv_dq); got {block_sizes}")
  if any(b % LANES for b in _block_values(block_sizes)):
    raise ValueError(f"splash_attention: blocks are multiples of {LANES}; got "
                     f"{block_sizes}")


def _mask(length: int, heads: int, window: int) -> splash_attention_mask.MultiHeadMask:
  """Every head's mask over a [length, length] row: |i - j| <= window // 2, or all."""
  if window:
    mask = splash_attention_mask.LocalMask((length, length), (window // 2, window // 2),
                                           offset=0)
  else:
    mask = splash_attention_mask.FullMask((length, length))
  return splash_attention_mask.MultiHeadMask([mask] * heads)


def _attend_rows(query, key, value, segment_ids, window, block_sizes, interpret):
  """The kernel over [batch, heads, length, head_dim] rows of one device, vmapped over
  the batch (length already padded, query already scaled)."""
  kernel = splash_attention_kernel.make_splash_mha(
      _mask(query.shape[2], query.shape[1], window), block_sizes=block_sizes,
      head_shards=1, q_seq_shards=1, interpret=interpret)

  def row(args):
    q, k, v, segments = args
    return kernel(q, k, v, segment_ids=splash_attention_kernel.SegmentIds(segments,
                                                                         segments))
  if isinstance(interpret, pltpu.InterpretParams):
    # TPU interpret mode (jax 0.10.2) cannot run a vmapped kernel: vmap adds the batch
    # to the grid, and interpret_pallas_call._get_randomized_grid_coordinates zips the
    # grid with the kernel's dimension_semantics, one shorter (a ValueError; Mosaic's
    # lowering adds "parallel" for the vmapped dimension). The rows go one by one.
    return jax.lax.map(row, (query, key, value, segment_ids))
  return jax.vmap(row)((query, key, value, segment_ids))


def _mesh_axes(spec_entry) -> tuple[str, ...]:
  if spec_entry is None:
    return ()
  return (spec_entry,) if isinstance(spec_entry, str) else tuple(spec_entry)


def check_layout(kv_heads: int, heads_spec: PartitionSpec | None,
                 mesh: jax.sharding.Mesh | jax.sharding.AbstractMesh
                 ) -> tuple[tuple, bool]:
  """(`heads_spec` over all four axes [batch, length, heads, head_dim], whether it splits
  them over `mesh`'s devices); a one-line ValueError unless each device holds whole rows
  and heads and the `kv_heads` split as the query heads do."""
  spec = tuple(heads_spec or ()) + (None,) * (4 - len(tuple(heads_spec or ())))
  if spec[1] is not None or spec[3] is not None:
    raise ValueError(f"splash_attention takes whole rows and heads on each device; the "
                     f"heads are laid out as {heads_spec}")
  sharded = not mesh.empty and any(mesh.shape[a] > 1 for entry in spec
                                   for a in _mesh_axes(entry))
  shards = math.prod(mesh.shape[a] for a in _mesh_axes(spec[2])) if sharded else 1
  if kv_heads % shards:
    raise ValueError(f"splash_attention: {kv_heads} kv heads do not split over the "
                     f"{shards} devices of the heads' mesh axes {spec[2]}")
  return spec, sharded


def splash_attention(query: jax.Array, key: jax.Array, value: jax.Array,
                     segment_ids: jax.Array, *, window: int = 0,
                     scale: float | None = None,
                     block_sizes: splash_attention_kernel.BlockSizes | None = None,
                     heads_spec: PartitionSpec | None = None,
                     mesh: jax.sharding.Mesh | jax.sharding.AbstractMesh | None = None,
                     interpret=None, dropout_rate: float = 0.0,
                     dropout_key: jax.Array | None = None) -> jax.Array:
  """softmax(scale * q . k) over the keys of each query's own document within the
  window, times v, by splash attention (see the module docstring).

  query [batch, length, heads, head_dim]; key, value [batch, length, kv_heads,
  head_dim]; segment_ids [batch, length] (0: padding); window 0 (global) or an even
  number of tokens (|i - j| <= window // 2); scale: 1 / sqrt(head_dim) unless given;
  block_sizes: splash's (`default_block_sizes` unless given). heads_spec: how the
  heads are laid out over `mesh` (the current one, `jax.set_mesh`, unless given) as
  [batch, length, heads, head_dim]; each device then runs its rows and heads (length
  and head_dim whole; kv heads split as the query heads are). interpret: Pallas's
  interpreter for the kernel: None picks TPU interpret mode off TPU (the compiled
  kernel on TPU), or pass True or a `pltpu.InterpretParams`. Returns [batch, length,
  heads, head_dim] in query's dtype."""
  del dropout_key  # refused with any rate by check_arguments
  masks.check_arguments(query, key, value, segment_ids, window, "splash_attention",
                        dropout_rate)
  _, length, _, head_dim = query.shape
  block_sizes = block_sizes or default_block_sizes(length)
  _check_block_sizes(block_sizes)
  mesh = mesh if mesh is not None else jax.sharding.get_abstract_mesh()
  spec, sharded = check_layout(key.shape[2], heads_spec, mesh)
  padded = padded_length(length, block_sizes)
  if interpret is None:
    interpret = False if jax.default_backend() == "tpu" else pltpu.InterpretParams()
  scale = head_dim ** -0.5 if scale is None else scale

  def rows(x):  # [b, L, h, d] -> [b, h, padded, d]
    return jnp.pad(x, ((0, 0), (0, padded - length), (0, 0), (0, 0))).transpose(0, 2, 1, 3)

  q = rows((query.astype(jnp.float32) * scale).astype(query.dtype))
  k, v = rows(key), rows(value)
  segments = jnp.pad(segment_ids.astype(jnp.int32), ((0, 0), (0, padded - length)))
  local = lambda q, k, v, s: _attend_rows(q, k, v, s, window, block_sizes, interpret)

  if not sharded:
    out = local(q, k, v, segments)
  else:
    rows_spec = PartitionSpec(spec[0], spec[2], None, None)
    out = jax.shard_map(local, mesh=mesh,
                        in_specs=(rows_spec, rows_spec, rows_spec,
                                  PartitionSpec(spec[0], None)),
                        out_specs=rows_spec, check_vma=False)(q, k, v, segments)
  out = out.transpose(0, 2, 1, 3)[:, :length]
  return masks.padding_queries_as_xla(out, value, segment_ids)

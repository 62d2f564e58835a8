"""Splash attention for TPU (encoderx/models/splash_attention.py), run on CPU by Pallas's
interpreters: TPU interpret mode (`pltpu.InterpretParams`, the default off TPU: the
kernel's VMEM/SMEM simulated, uninitialised memory NaN) and the HLO interpreter
(`interpret=True`, through the `jax.vmap` over rows a TPU runs), against the model's
full attention (`attention_reference.reference_attention`), values and gradients in float32; the key
blocks a window skips; the shard_map over batch and heads; what it refuses."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel

from encoderx.models import masks
from encoderx.models import splash_attention as sp

import attention_reference  # pylint: disable=g-bad-import-order  (tests/ is on sys.path)
from tests.test_blockwise_attention import heads, max_errors, outputs_and_gradients
from tests.test_blockwise_attention import segments

# Interpreted in float32 the kernel's outputs and gradients come within 1.3e-6 of XLA's
# (measured over these cases).
TOLERANCE = 1e-5
BLOCKS_128 = splash_attention_kernel.BlockSizes(*(128,) * 8)

# A window of 32 over 4 blocks of 128 is checked against full attention in
# test_a_window_skips_the_blocks_it_does_not_reach; grouped queries with a window over
# several blocks in TPU interpret mode by "race_detection" (2 heads over 1, window 16)
# and "length_not_a_multiple" (4 over 2, window 32).
CASES = {  # name: (length, kind, window, heads, kv_heads, block sizes, interpret)
    "padded": (256, "padded", 0, 2, 2, BLOCKS_128, None),
    "packed": (256, "packed", 0, 2, 2, BLOCKS_128, None),
    "length_not_a_multiple": (200, "packed", 32, 4, 2, None, None),
    "hlo_interpreter_vmap": (256, "packed", 32, 4, 2, BLOCKS_128, True),
    "race_detection": (256, "padded", 16, 2, 1, BLOCKS_128,
                       pltpu.InterpretParams(detect_races=True)),
}


@pytest.mark.parametrize("case", CASES)
def test_matches_full_attention_values_and_gradients(case, capfd):
  """Outputs and dq, dk, dv within 1e-5 of full attention (float32): padded rows
  (padding queries get attend's mean of the values), three packed documents, windows
  of 16 over several blocks of 128, 4 query heads over 2 kv heads and 2 over 1 (the
  kernel's own grouped-query attention), a length padded to the blocks; with the interpreter's
  race detector on, no race reported."""
  length, kind, window, num_heads, kv_heads, block_sizes, interpret = CASES[case]
  q, k, v, d_out = heads(length, num_heads, kv_heads, head_dim=32)
  segment_ids = segments(length, kind)
  got = outputs_and_gradients(
      lambda *qkv: sp.splash_attention(*qkv, segment_ids, window=window,
                                       block_sizes=block_sizes, interpret=interpret),
      q, k, v, d_out)
  want = outputs_and_gradients(
      lambda *qkv: attention_reference.reference_attention(*qkv, segment_ids, window=window),
      q, k, v, d_out)
  assert max(max_errors(got, want)) <= TOLERANCE, max_errors(got, want)
  assert min(float(jnp.abs(w).max()) for w in want) > 0.5  # nothing vacuous
  assert [g.shape for g in got] == [q.shape, q.shape, k.shape, v.shape]
  assert "RACE DETECTED" not in capfd.readouterr().out


def test_a_window_skips_the_blocks_it_does_not_reach():
  """Window 32 over 512 positions in blocks of 128: the kernel's tables visit each
  query block's 2 or 3 key blocks of 4, and values NaN from key 384 on (block 3, which
  no query before 256 reaches) leave the first 256 rows and their dq finite; global
  attention reads them. Unpoisoned, window 32's outputs and dq, dk, dv are full
  attention's within 1e-5."""
  kernel = splash_attention_kernel.make_splash_mha(
      sp._mask(512, 1, 32), block_sizes=BLOCKS_128, head_shards=1, q_seq_shards=1)
  visited = (kernel.fwd_mask_info.block_mask[0] > 0).sum(axis=1).tolist()
  assert visited == [2, 3, 3, 2]
  q, k, v, d_out = heads(512, batch=1, head_dim=32)
  segment_ids = segments(512, "one")[:1]
  windowed = lambda *qkv: sp.splash_attention(*qkv, segment_ids, window=32,
                                              block_sizes=BLOCKS_128)
  got = outputs_and_gradients(windowed, q, k, v, d_out)
  want = outputs_and_gradients(
      lambda *qkv: attention_reference.reference_attention(*qkv, segment_ids, window=32),
      q, k, v, d_out)
  assert max(max_errors(got, want)) <= TOLERANCE, max_errors(got, want)
  assert min(float(jnp.abs(w).max()) for w in want) > 0.5  # nothing vacuous
  poisoned = v.at[:, 384:].set(jnp.nan)
  for window in (32, 0):
    out, dq, _, _ = outputs_and_gradients(
        lambda *qkv: sp.splash_attention(*qkv, segment_ids, window=window,
                                         block_sizes=BLOCKS_128),
        q, k, poisoned, d_out)
    clean = [bool(jnp.all(jnp.isfinite(x[:, :256]))) for x in (out, dq)]
    assert clean == ([True] * 2 if window else [False] * 2), (window, clean)


@pytest.mark.parametrize("mesh_shape,interpret", [((2, 2, 2), True), ((1, 2, 2), None)])
def test_sharded_over_batch_and_heads_matches_one_device(mesh_shape, interpret):
  """Rows over data and fsdp, heads over tensor: each device runs the kernel on its rows
  and heads (jax.shard_map), with the same outputs and gradients as one device. Over all
  8 devices with the HLO interpreter; TPU interpret mode over 4: over 8 its backward
  hangs here (each kernel call waits at a threading.Barrier of all devices,
  interpret_pallas_call._barrier, while the others' callbacks wait in
  _allocate_buffer)."""
  devices = jax.devices()[:int(np.prod(mesh_shape))]
  mesh = jax.make_mesh(mesh_shape, ("data", "fsdp", "tensor"), devices=devices,
                       axis_types=(jax.sharding.AxisType.Auto,) * 3)
  spec = jax.sharding.PartitionSpec(("data", "fsdp"), None, "tensor", None)
  q, k, v, d_out = heads(128, 4, 2, batch=4, head_dim=32)
  segment_ids = jnp.concatenate([segments(128, "packed"), segments(128, "padded")])
  step = lambda heads_spec, *args: outputs_and_gradients(
      lambda *qkv: sp.splash_attention(*qkv, segment_ids, window=32, mesh=mesh,
                                       heads_spec=heads_spec, interpret=interpret),
      *args)
  one_device = step(None, q, k, v, d_out)
  with jax.set_mesh(mesh):
    placed = [jax.device_put(x, jax.sharding.NamedSharding(mesh, spec))
              for x in (q, k, v, d_out)]
    assert "shard_map" in str(jax.make_jaxpr(lambda *a: step(spec, *a))(*placed))
    sharded = jax.jit(lambda *a: step(spec, *a))(*placed)
  assert sharded[0].sharding.spec == spec
  assert max(max_errors(sharded, one_device)) < 1e-6


def test_block_sizes_and_padding():
  assert sp.default_block_sizes(8192).block_q == 512
  assert sp.default_block_sizes(200).block_kv == 256  # 200 -> 256: one block
  assert sp.default_block_sizes(384).block_q == 128
  assert sp.padded_length(200) == 256 and sp.padded_length(8192) == 8192
  assert sp.padded_length(130, BLOCKS_128) == 256


@pytest.mark.parametrize("change,message", [
    (dict(window=7), "even number"), (dict(window=256), "larger than the row"),
    (dict(dropout_rate=0.1), "no attention dropout"),
    (dict(block_sizes=splash_attention_kernel.BlockSizes(64, 64)), "backward's blocks"),
    (dict(block_sizes=splash_attention_kernel.BlockSizes(*(64,) * 8)), "multiples of 128"),
    (dict(heads_spec=jax.sharding.PartitionSpec(None, "data")), "whole rows")])
def test_bad_arguments_stop_with_one_line(change, message):
  q, k, v, _ = heads(128, 4, 2)
  segment_ids = jnp.ones((2, 128), jnp.int32)
  with pytest.raises(ValueError, match=message) as error:
    jax.eval_shape(lambda *qkv: sp.splash_attention(*qkv, segment_ids, **change), q, k, v)
  assert "\n" not in str(error.value)


def test_kv_heads_that_do_not_split_over_the_mesh_are_refused():
  mesh = jax.make_mesh((4,), ("tensor",), axis_types=(jax.sharding.AxisType.Auto,))
  q, k, v, _ = heads(128, 4, 2)
  with pytest.raises(ValueError, match="2 kv heads do not split over the 4 devices"):
    sp.splash_attention(q, k, v, jnp.ones((2, 128), jnp.int32), mesh=mesh,
                        heads_spec=jax.sharding.PartitionSpec(None, None, "tensor"))

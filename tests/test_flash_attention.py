"""The Pallas flash attention with dropout (encoderx/models/flash_attention.py), run by
Pallas's interpreter on CPU: against its jnp reference and the model's own attention,
forward and gradients; its dropout bits' statistics; its lowering to Triton for GPU and
that IR's compilation to H100 code (the `triton` package); and
`model.attention.kernel="pallas"` in a training step. Long context: local windows (the
key blocks visited and skipped), grouped-query attention, padded and packed rows against
the model's full attention."""
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

from conftest import REPO
from encoderx import errors
from encoderx import config as config_lib
from encoderx.train import trainer as trainer_lib
from encoderx.models import model_config
from encoderx.models import attention
from encoderx.models import attention_kernels
from encoderx.models import dropout as dropout_lib
from encoderx.models import flash_attention as fa
from encoderx.models import masks
from encoderx.models import pretraining

import attention_reference  # pylint: disable=g-bad-import-order  (tests/ is on sys.path)
from tests import test_blockwise_attention as blocks
from tests.test_training import ONE_DEVICE
from tests.train_steps import pretraining_batches, step_losses
from conftest import _tiny_config  # pylint: disable=g-bad-import-order

# Two rows of 128: one sequence then padding; two packed sequences then padding.
SEGMENTS = jnp.array([[1] * 100 + [0] * 28, [1] * 60 + [2] * 50 + [0] * 18])


def _heads(dtype=jnp.float32, shape=(2, 128, 2, 32)):
  keys = jax.random.split(jax.random.key(0), 4)
  q, k, v, d_out = (jax.random.normal(key, shape, dtype) for key in keys)
  return q, k, v, d_out


def _outputs_and_gradients(function, q, k, v, d_out):
  """The output and dq, dk, dv, as one compiled program (faster than op by op)."""
  return blocks.jitted_outputs_and_gradients(function, q, k, v, d_out)


def _max_errors(got, want):
  return [float(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32)).max())
          for a, b in zip(got, want)]


# Rate 0 in blocks of 32: the WINDOW_CASES below (grouped_query_global, against full
# attention) and test_kernel_without_dropout_is_the_models_attention.
@pytest.mark.parametrize("rate,block,backward_block", [
    (0.1, 32, 32), (0.5, 32, 32), (0.1, 64, 64), (0.1, 64, 32)])
def test_kernel_matches_its_reference_forward_and_backward(rate, block, backward_block):
  """Blocks of 32 (4 x 4 blocks over 128 positions) and of 64, the default (2 x 2), and
  a backward with smaller blocks than the forward's; padding and packed rows: the
  kernels' outputs and dq, dk, dv equal the whole-array computation with the same
  bits."""
  q, k, v, d_out = _heads()
  key = jax.random.key(7)
  tiling = fa.Tiling(block=block, backward_block=backward_block)
  kernel = lambda *qkv: fa.flash_attention(*qkv, SEGMENTS, rate, key, tiling=tiling,
                                           interpret=True)
  reference = lambda *qkv: fa.reference_attention(*qkv, SEGMENTS, rate, key)
  got = _outputs_and_gradients(kernel, q, k, v, d_out)
  want = _outputs_and_gradients(reference, q, k, v, d_out)
  assert max(_max_errors(got, want)) < 5e-6
  assert min(float(jnp.abs(g).max()) for g in want) > 0.1  # nothing vacuous
  if rate:  # the dropout really applies: without it the output differs
    undropped = fa.reference_attention(q, k, v, SEGMENTS)
    assert float(jnp.abs(got[0] - undropped).max()) > 0.1


def test_kernel_without_dropout_is_the_models_attention():
  """Rate 0: the model's `attend` (jax.nn.dot_product_attention under the padding and
  packing mask), padding queries' uniform rows included, forward and gradients."""
  q, k, v, d_out = _heads()
  mask = masks.padding_and_packing_mask(SEGMENTS)
  got = _outputs_and_gradients(
      lambda *qkv: fa.flash_attention(*qkv, SEGMENTS, interpret=True),
      q, k, v, d_out)
  want = _outputs_and_gradients(lambda *qkv: attention.attend(*qkv, mask), q, k, v, d_out)
  assert max(_max_errors(got, want)) < 5e-6
  padding_query = got[0][0, 110]  # attends to nothing: the mean of all values
  np.testing.assert_allclose(padding_query, v[0].mean(axis=0), atol=1e-5)


def test_kernel_in_bfloat16_is_close_to_float32():
  """bf16 heads (the GPU's dtype): float32 accumulation, errors of bf16's order."""
  q, k, v, d_out = _heads(jnp.bfloat16)
  key = jax.random.key(3)
  got = _outputs_and_gradients(
      lambda *qkv: fa.flash_attention(*qkv, SEGMENTS, 0.1, key, interpret=True),
      q, k, v, d_out)
  assert all(g.dtype == jnp.bfloat16 for g in got)
  want = _outputs_and_gradients(
      lambda *qkv: fa.reference_attention(*qkv, SEGMENTS, 0.1, key),
      *(x.astype(jnp.float32) for x in (q, k, v, d_out)))
  errors = _max_errors(got, want)
  scales = [float(jnp.abs(w).max()) for w in want]
  assert all(e < 0.03 * s for e, s in zip(errors, scales)), (errors, scales)


def _keep(seed, batch_heads=4, length=512, rate=0.1):
  positions = jnp.arange(length)
  return np.asarray(fa.keep_mask(
      jnp.uint32(seed[0]), jnp.uint32(seed[1]),
      jnp.arange(batch_heads).reshape(batch_heads, 1, 1), positions, positions, length,
      dropout_lib.threshold(rate)))


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_dropout_bits_drop_the_effective_rate_independently(rate):
  """The fraction dropped is dropout.effective_rate (as the XLA path drops), and
  neighbours along both axes, heads of one step and steps of one head are independent
  (their agreement is p^2 + (1 - p)^2)."""
  keep = _keep((12345, 678), rate=rate)
  p = dropout_lib.effective_rate(rate)
  standard_error = np.sqrt(p * (1 - p) / keep.size)
  assert abs((1 - keep.mean()) - p) < 5 * standard_error
  agreement = p * p + (1 - p) * (1 - p)
  pairs = {"next key": (keep[:, :, 1:], keep[:, :, :-1]),
           "next query": (keep[:, 1:], keep[:, :-1]),
           "next head": (keep[1:], keep[:-1]),
           "next step": (keep, _keep((12346, 678), rate=rate))}
  for name, (a, b) in pairs.items():
    error = np.sqrt(agreement * (1 - agreement) / a.size)
    assert abs(np.mean(a == b) - agreement) < 5 * error, name


def test_different_dropout_keys_give_different_masks_and_one_key_the_same():
  q, k, v, _ = _heads()
  run = lambda key: fa.flash_attention(q, k, v, SEGMENTS, 0.1, key, interpret=True)
  first, again, other = run(jax.random.key(1)), run(jax.random.key(1)), run(
      jax.random.key(2))
  assert np.array_equal(first, again) and not np.allclose(first, other)
  everything = fa.flash_attention(q, k, v, SEGMENTS, 0.999, jax.random.key(1),
                                  interpret=True)  # 0.999 rounds to 256/256
  assert not np.any(everything)


def test_tilings_are_checked_and_the_default_follows_the_head_size():
  assert fa.default_tiling(64) == fa.Tiling()  # the measured one
  assert fa.default_tiling(128).backward_block == 32  # 64 would spill
  for bad in (dict(block=48), dict(block=16, backward_block=16),
              dict(block=64, backward_block=128), dict(backward_block=8)):
    with pytest.raises(ValueError, match="tiling blocks"):
      fa.Tiling(**bad)


def test_unsupported_shapes_are_refused_clearly(tiny_config):
  q = jnp.zeros((1, 96, 2, 32))  # 96: not a multiple of 64 nor a power of 2
  with pytest.raises(ValueError, match="multiple of 64"):
    fa.flash_attention(q, q, q, jnp.ones((1, 96), jnp.int32), interpret=True)
  q = jnp.zeros((1, 64, 2, 24))
  with pytest.raises(ValueError, match="power of 2"):
    fa.flash_attention(q, q, q, jnp.ones((1, 64), jnp.int32), interpret=True)
  config = tiny_config()  # heads of 24 in a model: refused with the config's fields
  config.model.hidden_size, config.model.attention.kernel = 48, "pallas"
  with pytest.raises(errors.ConfigError, match="model.attention.kernel'?: 'pallas' "
                     "cannot run rows of data.seq_length=.* power of 2"):
    trainer_lib.Trainer(config, devices=ONE_DEVICE)
  # A model outside a run: refused when traced.
  model = pretraining.PretrainingModel(model_config.ModelConfig.from_config(config.model, 99),
                                       heads=("mlm",))
  batch = pretraining.init_batch(1, 64)
  params = jax.eval_shape(model.init, jax.random.key(0), batch)
  with pytest.raises(ValueError, match="model.attention.kernel='pallas': .* power of 2"):
    jax.eval_shape(model.apply, params, batch)


def test_kernels_lower_to_triton_for_gpu():
  """Lowered for CUDA on this CPU-only machine (jax.export), BERT-large's heads in bf16:
  the forward and the backward are Triton kernels, and no attention matrix is left to
  XLA. (Compiling them to GPU code needs a GPU: README, "On a GPU".)"""
  heads = jax.ShapeDtypeStruct((2, 512, 16, 64), jnp.bfloat16)
  segments = jax.ShapeDtypeStruct((2, 512), jnp.int32)

  def loss(q, k, v, segment_ids):
    out = fa.flash_attention(q, k, v, segment_ids, 0.1, jax.random.key(0))
    return out.astype(jnp.float32).sum()

  exported = export.export(
      jax.jit(jax.grad(loss, argnums=(0, 1, 2))), platforms=["cuda"],
      disabled_checks=[export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")],
  )(heads, heads, heads, segments)
  module = exported.mlir_module()
  assert module.count("__gpu$xla.gpu.triton") == 2
  assert "encoderx_flash_attention_forward" in module
  assert "encoderx_flash_attention_backward" in module
  assert "512x512" not in module  # no [query, key] array in XLA's part


def test_kernels_compile_to_gpu_code_that_fits_an_h100():
  """launch/triton_check.py: the Triton IR jax builds for BERT-large's heads, compiled by
  the `triton` package for sm_90 on this machine: both kernels compile and fit the
  H100's 227 KB of shared memory a block, and the forward spills nothing. (The
  backward's 64 x 64 blocks spill 112 bytes a thread in this Triton, which is not XLA's;
  on an H200 they still ran 1.8 times faster than 32 x 32 blocks that spill nothing:
  README, "On a GPU".)"""
  ran = subprocess.run([sys.executable, str(REPO / "launch" / "triton_check.py")],
                       capture_output=True, text=True, timeout=600, cwd=REPO)
  assert ran.returncode == 0, ran.stderr
  lines = [line for line in ran.stdout.splitlines() if "compiled for sm_90" in line]
  assert [line.split(":")[0] for line in lines] == ["encoderx_flash_attention_forward",
                                                    "encoderx_flash_attention_backward"]
  assert "STACK:0" in lines[0] and "LOCAL:0" in lines[0], lines[0]
  for line in lines:
    shared = int(line.rsplit("shared memory ", 1)[1].split()[0].replace(",", ""))
    assert 0 < shared <= 227 * 1024, line


def test_config_refuses_the_kernel_for_other_attentions(tiny_config):
  config = tiny_config("deberta:tiny")
  config.model.attention.kernel = "pallas"
  with pytest.raises(errors.ConfigError, match="attention.kernel"):
    config_lib.validate(config)
  config.model.attention.kernel = "triton"
  with pytest.raises(errors.ConfigError, match="'auto', 'xla', 'pallas'"):
    config_lib.validate(config)


def test_auto_takes_the_kernel_on_gpu_with_attention_dropout():
  """model.attention.kernel="auto" picks the kernel where it was measured the faster
  (GPU, attention dropout, bf16/f16 heads it takes, whole sequences and heads on each
  device), else `attend` (cuDNN without dropout, XLA elsewhere)."""
  heads = jnp.zeros((2, 512, 16, 64), jnp.bfloat16)

  def auto(backend="gpu", q=heads, query_given=False, with_dropout=True):
    return attention_kernels.pallas_by_default(backend, q, q, q, query_given, with_dropout)

  assert auto() and auto(q=heads.astype(jnp.float16))
  assert auto(q=jnp.zeros((2, 128, 12, 64), jnp.bfloat16))
  assert not auto(backend="cpu") and not auto(backend="tpu")
  assert not auto(with_dropout=False)
  assert not auto(query_given=True)
  assert not auto(q=heads.astype(jnp.float32))
  assert not auto(q=jnp.zeros((2, 96, 16, 64), jnp.bfloat16))  # length
  assert not auto(q=jnp.zeros((2, 512, 16, 24), jnp.bfloat16))  # head size
  assert auto(q=jnp.zeros((2, 512, 16, 32), jnp.bfloat16))
  assert not auto(q=jnp.zeros((2, 512, 8, 128), jnp.bfloat16))  # unmeasured tiling
  with nn.logical_axis_rules([("activation_length", "sequence")]):
    assert not auto()  # each device would hold part of the sequences
  with nn.logical_axis_rules([("activation_heads", "tensor")]):
    assert auto()  # heads split over devices: sharded_flash_attention's shard_map


@pytest.fixture(scope="module")
def pallas_run():
  """BERT-tiny (the tests' tiny bert:tiny, attention dropout 0.1) trained 2 steps with
  model.attention.kernel="pallas", interpreted: (losses, parameters' leaves, parameters),
  one run shared by the training tests below."""
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(attention_kernels, "interpret_off_platform", True)
    config = _tiny_config()
    assert config.model.attention.dropout == 0.1
    config.model.attention.kernel = "pallas"
    losses, state = step_losses(trainer_lib.Trainer(config, devices=ONE_DEVICE),
                                pretraining_batches(config, 2))
  return losses, jax.tree_util.tree_leaves(state.params), state.params


def test_auto_trains_with_the_kernel_where_it_takes_it(tiny_config, monkeypatch,
                                                       interpreted_kernels, pallas_run):
  """The "auto" path end to end: where `pallas_by_default` says yes (as it does on a
  GPU), BERT-tiny's train steps are "pallas"'s exactly (the same dropout bits), not
  "xla"'s."""
  config = tiny_config()
  assert config.model.attention.dropout > 0
  batches = pretraining_batches(config, 2)

  def trained(kernel):
    config.model.attention.kernel = kernel
    losses, state = step_losses(trainer_lib.Trainer(config, devices=ONE_DEVICE), batches)
    return losses, jax.tree_util.tree_leaves(state.params)

  (pallas_losses, pallas_params, _), (_, xla_params) = pallas_run, trained("xla")
  monkeypatch.setattr(attention_kernels, "pallas_by_default", lambda *args: True)
  auto_losses, auto_params = trained("auto")
  np.testing.assert_array_equal(auto_losses, pallas_losses)
  for auto_leaf, pallas_leaf in zip(auto_params, pallas_params):
    np.testing.assert_array_equal(auto_leaf, pallas_leaf)
  assert max(float(np.abs(a - b).max()) for a, b in zip(auto_params, xla_params)) > 1e-4


def test_training_with_the_kernel_matches_the_xla_attention(tiny_config,
                                                             interpreted_kernels, pallas_run):
  """BERT-tiny's train steps with model.attention.kernel="pallas" (interpreted here):
  without attention dropout, the same losses as "xla" (hidden dropout on, the same
  draws) and parameters; with it, the kernel's dropout changes the gradients."""
  config = tiny_config()
  config.model.attention.dropout = 0.0
  config.model.attention.kernel = "xla"
  batches = pretraining_batches(config, 2)
  default_losses, default_state = step_losses(
      trainer_lib.Trainer(config, devices=ONE_DEVICE), batches)
  config.model.attention.kernel = "pallas"
  kernel_losses, kernel_state = step_losses(
      trainer_lib.Trainer(config, devices=ONE_DEVICE), batches)
  np.testing.assert_allclose(kernel_losses, default_losses, rtol=1e-5)
  differences = jax.tree_util.tree_map(lambda a, b: float(np.abs(a - b).max()),
                                       default_state.params, kernel_state.params)
  assert max(jax.tree_util.tree_leaves(differences)) < 1e-5
  dropped_losses, _, dropped_params = pallas_run  # the same, attention dropout 0.1
  assert np.all(np.isfinite(dropped_losses))
  differences = jax.tree_util.tree_map(lambda a, b: float(np.abs(a - b).max()),
                                       dropped_params, kernel_state.params)
  assert max(jax.tree_util.tree_leaves(differences)) > 1e-4


def test_sharded_kernel_draws_one_devices_bits():
  """`sharded_flash_attention` under a 2 x 2 x 2 mesh (rows over data and fsdp, heads
  over tensor; jax.shard_map): each device hashes the bits of its rows' and heads' place
  in the whole batch, so outputs and gradients are one device's, dropout 0.5 included."""
  mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"),
                       axis_types=(jax.sharding.AxisType.Auto,) * 3)
  spec = jax.sharding.PartitionSpec(("data", "fsdp"), None, "tensor", None)
  q, k, v, d_out = _heads(shape=(4, 128, 2, 32))
  segments = jnp.concatenate([SEGMENTS, SEGMENTS[::-1]])
  key = jax.random.key(9)
  one_device = _outputs_and_gradients(
      lambda *qkv: fa.flash_attention(*qkv, segments, 0.5, key, interpret=True),
      q, k, v, d_out)
  with jax.set_mesh(mesh):
    placed = [jax.device_put(x, jax.sharding.NamedSharding(mesh, spec))
              for x in (q, k, v, d_out)]
    step = lambda *args: _outputs_and_gradients(
        lambda *qkv: fa.sharded_flash_attention(*qkv, segments, 0.5, key, spec,
                                                interpret=True), *args)
    assert "shard_map" in str(jax.make_jaxpr(step)(*placed))  # per device, not gathered
    sharded = jax.jit(step)(*placed)
  assert sharded[0].sharding.spec == spec
  assert max(_max_errors(sharded, one_device)) < 1e-6
  shifted = fa.flash_attention(q, k, v, segments, 0.5, key, interpret=True,
                               shard=(0, 1, 2))  # other heads' bits: other outputs
  assert float(jnp.abs(shifted - one_device[0]).max()) > 0.1


def test_sharded_training_with_the_kernel_matches_one_device(tiny_config,
                                                             interpreted_kernels, pallas_run):
  """A 2 x 2 x 2 mesh trains with the kernel (attention dropout on) to one device's
  losses."""
  config = tiny_config()
  config.model.attention.kernel = "pallas"
  batches = pretraining_batches(config, 2)
  single_losses = pallas_run[0]  # this config on one device
  config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 2, 2, 2
  sharded = trainer_lib.Trainer(config)
  assert sharded.mesh.devices.shape == (2, 2, 2)
  sharded_losses, _ = step_losses(sharded, batches)
  np.testing.assert_allclose(sharded_losses, single_losses, atol=1e-5, rtol=0)


# Long context (issue 36): local windows, grouped-query attention, padded and packed rows,
# against the model's full attention (attention_reference.reference_attention: attend under the
# [length, length] mask of masks.local_window_mask).
WINDOW_CASES = {  # name: (length, kind, window, heads, kv_heads, block)
    "padded_window_16": (128, "padded", 16, 2, 2, 32),
    "packed_window_32": (256, "packed", 32, 2, 2, 32),
    "grouped_query_window_16": (128, "packed", 16, 4, 2, 32),
    "grouped_query_global": (128, "padded", 0, 4, 1, 32),
    "window_wider_than_a_block": (256, "packed", 96, 2, 2, 32),
}


@pytest.mark.parametrize("case", WINDOW_CASES)
def test_kernel_with_windows_and_grouped_queries_is_the_models_attention(case):
  """Interpreted on CPU, outputs and dq, dk, dv within 1e-5 of full attention (float32;
  ~1e-6 measured): blocks of 32, so that a window visits some key blocks, masks inside
  partial ones and skips the rest; padding queries get attend's mean of the values."""
  length, kind, window, num_heads, kv_heads, block = WINDOW_CASES[case]
  q, k, v, d_out = blocks.heads(length, num_heads, kv_heads)
  segment_ids = blocks.segments(length, kind)
  tiling = fa.Tiling(block=block, backward_block=block)
  got = _outputs_and_gradients(
      lambda *qkv: fa.flash_attention(*qkv, segment_ids, window=window, tiling=tiling,
                                      interpret=True), q, k, v, d_out)
  want = _outputs_and_gradients(
      lambda *qkv: attention_reference.reference_attention(*qkv, segment_ids, window=window),
      q, k, v, d_out)
  assert max(_max_errors(got, want)) <= 1e-5, _max_errors(got, want)
  assert [g.shape for g in got] == [q.shape, q.shape, k.shape, v.shape]


def test_kernel_with_a_window_and_dropout_matches_its_reference():
  """Dropout 0.1 with window 16 and 4 query heads over 2 kv heads: the same bits as the
  whole-array reference, forward and gradients; a scale other than 1 / sqrt(d)."""
  q, k, v, d_out = blocks.heads(128, 4, 2)
  segment_ids = blocks.segments(128, "packed")
  key = jax.random.key(5)
  tiling = fa.Tiling(block=32, backward_block=32)
  got = _outputs_and_gradients(
      lambda *qkv: fa.flash_attention(*qkv, segment_ids, 0.1, key, window=16,
                                      tiling=tiling, interpret=True), q, k, v, d_out)
  want = _outputs_and_gradients(
      lambda *qkv: fa.reference_attention(*qkv, segment_ids, 0.1, key, window=16),
      q, k, v, d_out)
  assert max(_max_errors(got, want)) < 5e-6
  undropped = attention_reference.reference_attention(q, k, v, segment_ids, window=16)
  assert float(jnp.abs(got[0] - undropped).max()) > 0.1
  scaled = fa.flash_attention(q, k, v, segment_ids, window=16, scale=0.3, tiling=tiling,
                              interpret=True)
  np.testing.assert_allclose(
      scaled, attention_reference.reference_attention(q, k, v, segment_ids, window=16, scale=0.3),
      atol=1e-5)


def test_kernel_with_a_window_never_reads_the_blocks_it_does_not_reach():
  """Window 16, blocks of 32 over 256 positions: the first 64 queries reach keys up to
  71 (blocks 0-2). Values NaN from key 96 on would make their rows and dq NaN (0 x NaN)
  were those blocks visited; d_out NaN from query 96 on likewise dK and dV of the first
  64 keys. Global attention visits them all and is poisoned."""
  q, k, v, d_out = blocks.heads(256, batch=1)
  segment_ids = blocks.segments(256, "one")[:1]
  tiling = fa.Tiling(block=32, backward_block=32)
  for window in (16, 0):
    kernel = lambda *qkv: fa.flash_attention(*qkv, segment_ids, window=window,
                                             tiling=tiling, interpret=True)
    run = blocks.compiled_outputs_and_gradients(kernel)
    out, dq, _, _ = run(q, k, v.at[:, 96:].set(jnp.nan), d_out)
    _, _, dk, dv = run(q, k, v, d_out.at[:, 96:].set(jnp.nan))
    clean = [bool(jnp.all(jnp.isfinite(x[:, :64]))) for x in (out, dq, dk, dv)]
    assert clean == ([True] * 4 if window else [False] * 4), (window, clean)


def test_kernel_never_reads_the_blocks_of_other_documents():
  """Global attention over a packed row: documents at 0-99 and 100-255, blocks of 32.
  The first 96 queries (blocks 0-2, document 1 alone) reach keys up to 127 (blocks 0-3);
  values NaN from key 128 on would make their rows and dq NaN were those blocks
  visited, d_out NaN from query 128 on likewise dK and dV of the first 96 keys. One
  document over the whole row visits them all and is poisoned."""
  q, k, v, d_out = blocks.heads(256, batch=1)
  tiling = fa.Tiling(block=32, backward_block=32)
  for documents in ([100, 156], [256]):
    segment_ids = jnp.array([[i + 1 for i, size in enumerate(documents)
                              for _ in range(size)]], jnp.int32)
    kernel = lambda *qkv: fa.flash_attention(*qkv, segment_ids, tiling=tiling,
                                             interpret=True)
    run = blocks.compiled_outputs_and_gradients(kernel)
    out, dq, _, _ = run(q, k, v.at[:, 128:].set(jnp.nan), d_out)
    _, _, dk, dv = run(q, k, v, d_out.at[:, 128:].set(jnp.nan))
    clean = [bool(jnp.all(jnp.isfinite(x[:, :96]))) for x in (out, dq, dk, dv)]
    assert clean == [len(documents) == 2] * 4, (documents, clean)


@pytest.mark.parametrize("rate", [0.0, 0.1])
def test_kernel_skipping_documents_matches_its_reference_wherever_they_lie(rate):
  """Documents whose ids come back later in the row (1, 2, 1, 3), an id past the length
  and padding between them, blocks of 32 and backward blocks of 16: the blocks skipped
  hold no key of a query's document, so outputs and gradients are the reference's."""
  sizes = [(1, 40), (2, 50), (0, 6), (1, 30), (3, 60), (999, 50), (0, 20)]
  segment_ids = jnp.array([[i for i, size in sizes for _ in range(size)]], jnp.int32)
  q, k, v, d_out = blocks.heads(256, batch=1)
  key = jax.random.key(3)
  tiling = fa.Tiling(block=32, backward_block=16)
  got = blocks.compiled_outputs_and_gradients(
      lambda *qkv: fa.flash_attention(*qkv, segment_ids, rate, key, tiling=tiling,
                                      interpret=True))(q, k, v, d_out)
  want = blocks.compiled_outputs_and_gradients(
      lambda *qkv: fa.reference_attention(*qkv, segment_ids, rate, key))(q, k, v, d_out)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, atol=2e-5, rtol=1e-5)


def test_document_extents_cover_each_documents_positions():
  """masks.document_extents: a document's first and last position wherever its tokens
  lie, padding its own position, ids past the length one wider bucket."""
  segment_ids = jnp.array([[1, 1, 2, 0, 1, 9, 3, 9], [2, 2, 2, 2, 0, 0, 0, 0]])
  first, last = masks.document_extents(segment_ids)
  np.testing.assert_array_equal(first, [[0, 0, 2, 3, 0, 5, 6, 5], [0, 0, 0, 0, 4, 5, 6, 7]])
  np.testing.assert_array_equal(last, [[4, 4, 2, 3, 4, 7, 6, 7], [3, 3, 3, 3, 4, 5, 6, 7]])
  first, last = masks.document_extents(jnp.array([[8, 9, 1, 9]]))  # 8 and 9 past 4
  np.testing.assert_array_equal(first, [[0, 0, 2, 0]])
  np.testing.assert_array_equal(last, [[3, 3, 2, 3]])


def test_windowed_grouped_kernels_lower_to_triton_and_compile_for_an_h100():
  """A local window (dynamic loop bounds) and 16 query heads over 4 kv heads: lowered for
  CUDA, both kernels are Triton's and no [query, key] array is left to XLA; the
  `triton` package compiles them for sm_90 within the H100's shared memory, the
  forward without spilling (launch/triton_check.py)."""
  heads = jax.ShapeDtypeStruct((2, 512, 16, 64), jnp.bfloat16)
  kv = jax.ShapeDtypeStruct((2, 512, 4, 64), jnp.bfloat16)
  segments = jax.ShapeDtypeStruct((2, 512), jnp.int32)
  loss = lambda q, k, v, s: fa.flash_attention(q, k, v, s, window=128).astype(
      jnp.float32).sum()
  module = export.export(
      jax.jit(jax.grad(loss, argnums=(0, 1, 2))), platforms=["cuda"],
      disabled_checks=[export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")],
  )(heads, kv, kv, segments).mlir_module()
  assert module.count("__gpu$xla.gpu.triton") == 2 and "512x512" not in module
  ran = subprocess.run([sys.executable, str(REPO / "launch" / "triton_check.py"),
                        "--window=128", "--kv_heads=4"],
                       capture_output=True, text=True, timeout=600, cwd=REPO)
  assert ran.returncode == 0, ran.stderr
  lines = [line for line in ran.stdout.splitlines() if "compiled for sm_90" in line]
  assert len(lines) == 2 and "STACK:0" in lines[0] and "LOCAL:0" in lines[0], lines
  for line in lines:
    shared = int(line.rsplit("shared memory ", 1)[1].split()[0].replace(",", ""))
    assert 0 < shared <= 227 * 1024, line


@pytest.mark.parametrize("change,message", [
    (dict(window=15), "even number"), (dict(window=256), "larger than the row of 128"),
    (dict(kv_heads=3), "do not divide")])
def test_bad_windows_and_heads_stop_with_one_line(change, message):
  q, k, v, _ = blocks.heads(128, 4, change.pop("kv_heads", 2))
  with pytest.raises(ValueError, match=message) as error:
    fa.flash_attention(q, k, v, jnp.ones((2, 128), jnp.int32), interpret=True, **change)
  assert "\n" not in str(error.value) and "flash_attention" in str(error.value)


def test_sharded_kernel_with_grouped_queries_and_a_window_matches_one_device():
  """Heads over tensor (4 query heads and 2 kv heads split in two), rows over data and
  fsdp, window 32 and dropout 0.5: one device's outputs and gradients."""
  mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"),
                       axis_types=(jax.sharding.AxisType.Auto,) * 3)
  spec = jax.sharding.PartitionSpec(("data", "fsdp"), None, "tensor", None)
  q, k, v, d_out = blocks.heads(128, 4, 2, batch=4, head_dim=32)
  segment_ids = jnp.concatenate([blocks.segments(128, "packed"),
                                 blocks.segments(128, "padded")])
  key = jax.random.key(9)
  one_device = _outputs_and_gradients(
      lambda *qkv: fa.flash_attention(*qkv, segment_ids, 0.5, key, window=32,
                                      interpret=True), q, k, v, d_out)
  with jax.set_mesh(mesh):
    placed = [jax.device_put(x, jax.sharding.NamedSharding(mesh, spec))
              for x in (q, k, v, d_out)]
    sharded = jax.jit(lambda *args: _outputs_and_gradients(
        lambda *qkv: fa.sharded_flash_attention(*qkv, segment_ids, 0.5, key, spec,
                                                window=32, interpret=True), *args))(*placed)
  assert max(_max_errors(sharded, one_device)) < 1e-6

"""Long context in the model (issue 36): the attention kernels of
encoderx/models/attention_kernels.py inside a tiny ModernBERT, against its 'xla' attention
(forward and every parameter's gradient, float32), padded, packed and windowed rows,
grouped-query heads, the scanned stack; what "auto" picks on each backend; the one-line
errors before compiling; the 8,192-token train step without an [L, L] array; a long run's
evaluation no larger than its training micro-batch; the measuring tool
(encoderx/tools/speed/long_context.py)."""
import functools
import json

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from encoderx import config as config_lib
from encoderx import errors
from encoderx import train
from encoderx.train import trainer as trainer_lib
from encoderx.hf import engine
from encoderx.models import model_config
from encoderx.models import attention_kernels, encoder as encoder_lib, pretraining
from encoderx.tools.speed import long_context
from encoderx.tools.figures import report

from reference_models import packed_batch  # pylint: disable=g-bad-import-order

TOLERANCE = 1e-5  # float32: of each output's (and gradient's) largest magnitude, from 1
LENGTH = 128  # a multiple of the Pallas kernel's 64 and of splash's 128
# ModernBERT's fields (Hugging Face's defaults, read as --init_from reads them) at a tiny
# size: heads of 16 (the Pallas kernel's smallest), 2 kv heads for 4 query heads, two
# layers (global, then local with a window of 32 tokens: each kind once, compiled once).
MODEL = model_config.ModelConfig().with_fields({
    **engine.model_fields(dict(
        model_type="modernbert", vocab_size=99, hidden_size=64, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=96, local_attention=32,
        global_attn_every_n_layers=2))[1], "embeddings.size": 64, "attention.num_kv_heads": 2})
# Row 0: three documents then padding; row 1: one document over the whole row.
_, BATCH = packed_batch(MODEL.vocab_size, rows=((40, 50, 20), (LENGTH,)), length=LENGTH)


@functools.lru_cache(maxsize=None)
def _params(scan: bool = False):
  params = flax.linen.unbox(pretraining.EncoderModel(MODEL, with_pooler=False).init(
      jax.random.key(0), pretraining.init_batch(1, 8))["params"])
  return encoder_lib.stack_layers({"encoder_model": params})["encoder_model"] if scan else (
      params)


@functools.lru_cache(maxsize=None)
def outputs_and_gradients(kernel: str, scan: bool = False):
  """The hidden states [2, LENGTH, 64] and the gradient of sum(hidden * weights) with
  respect to every parameter, with model.attention.kernel=`kernel`."""
  config = MODEL.replace(attention=dict(kernel=kernel), layout=dict(scan=scan))
  model = pretraining.EncoderModel(config, with_pooler=False)
  weights = jax.random.normal(jax.random.key(1), (2, LENGTH, config.hidden_size))

  def loss(params):
    hidden = model.apply({"params": params}, BATCH)["hidden"]
    return jnp.sum(hidden * weights), hidden

  (_, hidden), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(_params(scan))
  if scan:
    grads = encoder_lib.unstack_layers({"encoder_model": grads},
                                       config.num_layers)["encoder_model"]
  return hidden, flax.traverse_util.flatten_dict(grads)


def relative_errors(got, want) -> dict[str, float]:
  """Max |got - want| over max(1, max |want|), for the hidden states and each gradient."""
  error = lambda a, b: float(jnp.abs(a - b).max() / max(1.0, float(jnp.abs(b).max())))
  errors_ = {"hidden": error(got[0], want[0])}
  errors_.update({"/".join(path): error(got[1][path], grad)
                  for path, grad in want[1].items() if grad.size})
  return errors_


@pytest.mark.parametrize("kernel, scan", [("blockwise", False), ("blockwise", True),
                                          ("pallas", False), ("splash", False)])
def test_each_kernel_gives_the_models_attention(kernel, scan):
  """The tiny ModernBERT with blockwise attention, the Pallas kernel (interpreted) and
  splash attention (TPU interpret mode) against 'xla' (the whole [length, length] mask):
  the hidden states and every parameter's gradient within 1e-5 of their scale; padded
  and packed rows, the local layer's window, 4 query heads over 2 kv heads (unrepeated);
  scanned, each layer's kind picks its kernel under lax.cond."""
  got, want = outputs_and_gradients(kernel, scan), outputs_and_gradients("xla")
  errors_ = relative_errors(got, want)
  print(f"{kernel} (scan={scan}) against xla: worst relative error "
        f"{max(errors_.values()):.1e} ({max(errors_, key=errors_.get)})")
  assert max(errors_.values()) <= TOLERANCE, errors_
  assert float(jnp.abs(want[0]).max()) > 1  # nothing vacuous


def test_auto_on_a_tpu_runs_splash_and_gives_the_models_attention(monkeypatch):
  """"auto" traced as on a TPU: every layer runs splash (TPU interpret mode here), and
  the hidden states and gradients equal 'xla''s within 1e-5."""
  want, _ = outputs_and_gradients("xla"), _params()  # initialization traces 'xla'
  called = []
  compute = attention_kernels.compute
  monkeypatch.setattr(attention_kernels, "backend", lambda: "tpu")
  monkeypatch.setattr(attention_kernels, "compute",
                      lambda kernel, *args, **kwargs: called.append(kernel) or compute(
                          kernel, *args, **kwargs))
  errors_ = relative_errors(outputs_and_gradients.__wrapped__("auto"), want)
  assert set(called) == {"splash"} and len(called) >= MODEL.num_layers
  assert max(errors_.values()) <= TOLERANCE, errors_


def test_the_window_matters_in_these_rows():
  """Without the local window (every layer global) the outputs differ: the cases above
  check the window."""
  unwindowed = pretraining.EncoderModel(MODEL.replace(attention=dict(window=0)),
                                        with_pooler=False)
  hidden = jax.jit(unwindowed.apply)({"params": _params()}, BATCH)["hidden"]
  assert float(jnp.abs(hidden - outputs_and_gradients("xla")[0]).max()) > 1e-3


def _chosen(monkeypatch, backend, config, deterministic=True, length=LENGTH):
  """The kernels the model's layers call with `config`, traced as on `backend`."""
  params = _params()  # initialized before counting: initialization calls "xla" too
  called = []
  compute = attention_kernels.compute
  monkeypatch.setattr(attention_kernels, "backend", lambda: backend)
  monkeypatch.setattr(attention_kernels, "compute",
                      lambda kernel, *args, **kwargs: called.append(kernel) or compute(
                          kernel, *args, **kwargs))
  _, batch = packed_batch(config.vocab_size, rows=((length,),), length=length)
  jax.eval_shape(lambda params: pretraining.EncoderModel(config, with_pooler=False).apply(
      {"params": params}, batch, deterministic=deterministic,
      rngs={"dropout": jax.random.key(0)}), params)
  return called


def test_auto_picks_as_documented():
  """attention_kernels.choose, for a global (window 0) and a local (window 32) layer."""
  heads = lambda length, dtype=jnp.float32, dim=16: jax.ShapeDtypeStruct(
      (1, length, 4, dim), dtype)
  bf16 = functools.partial(heads, dtype=jnp.bfloat16)

  def choose(backend, q, window=0, dropout=False, query_given=False, kernel="auto"):
    config = MODEL.replace(attention=dict(kernel=kernel))
    return attention_kernels.choose(config, q, q, q, window, query_given, dropout, backend)

  full = attention_kernels.CPU_FULL_ROW
  assert [choose("cpu", heads(128)), choose("cpu", heads(128), 32),
          choose("cpu", heads(512), 32), choose("cpu", heads(full)),
          choose("cpu", heads(full + 1)), choose("cpu", heads(2 * full), dropout=True)] == [
              "xla", "xla", "blockwise", "xla", "blockwise", "xla"]  # 128/32: no block skipped
  assert [choose("tpu", heads(128)), choose("tpu", heads(8192), 128),
          choose("tpu", heads(128), dropout=True)] == ["splash", "splash", "xla"]
  assert [choose("gpu", bf16(512), dropout=True), choose("gpu", bf16(512), 32, True),
          choose("gpu", heads(512), dropout=True), choose("gpu", bf16(512)),
          choose("gpu", bf16(512), 32), choose("gpu", heads(8192)),
          choose("gpu", heads(8192, dim=24))] == [
              "pallas", "pallas", "xla", "xla", "xla", "pallas", "blockwise"]
  for backend in ("cpu", "gpu", "tpu"):  # a query stream; a row shorter than the window
    assert choose(backend, heads(8192), query_given=True) == "xla"
    assert choose(backend, heads(64), 128) == "xla"
  assert choose("cpu", heads(128), kernel="splash") == "splash"  # named: as named
  with flax.linen.logical_axis_rules([("activation_length", "sequence")]):
    assert choose("tpu", heads(128)) == "blockwise"  # splash takes whole rows


def test_auto_in_the_model_on_each_backend(monkeypatch):
  """The kernels the model's two layers (global, local) call under "auto",
  traced as on CPU, GPU and TPU; attention dropout in training takes 'xla' but on GPU
  (bfloat16 heads: 'pallas'), and 'xla' builds the only whole mask."""
  # the local window of 32 meets every block of a 128-token row, and skips some at 512
  assert _chosen(monkeypatch, "cpu", MODEL) == ["xla", "xla"]
  assert _chosen(monkeypatch, "cpu", MODEL, length=512) == ["xla", "blockwise"]
  assert _chosen(monkeypatch, "cpu", MODEL, length=1024) == ["xla", "blockwise"]
  assert _chosen(monkeypatch, "cpu", MODEL, length=2048) == ["blockwise"] * 2
  assert _chosen(monkeypatch, "tpu", MODEL) == ["splash"] * 2
  assert _chosen(monkeypatch, "gpu", MODEL) == ["xla"] * 2
  dropped = MODEL.replace(attention=dict(dropout=0.1), dtype="bfloat16")
  assert _chosen(monkeypatch, "tpu", dropped, deterministic=False) == ["xla"] * 2
  assert _chosen(monkeypatch, "gpu", dropped, deterministic=False) == ["pallas"] * 2
  assert _chosen(monkeypatch, "tpu", dropped) == ["splash"] * 2  # evaluation: no dropout


def _config(**model):
  """A rotary model with local layers; `model`: changes, a group's as a dict."""
  config = config_lib.default_config()
  config.model.update(dict(hidden_size=64, num_heads=4, embeddings=dict(position="rotary"),
                           attention=dict(window=128, global_every=3, dropout=0.0)))
  config.model.update(model)
  config.data.seq_length = 512
  return config


@pytest.mark.parametrize("changes, message", [
    (dict(data=dict(seq_length=64), model=dict(attention=dict(kernel="blockwise"))),
     r"'data.seq_length': 64 tokens is shorter than the local window "
     r"model.attention.window=128, which model.attention.kernel='blockwise' cannot take\. "
     r"Use rows of at least 128"),
    (dict(train=dict(long_fraction=0.1, long_seq_length=100),
          model=dict(attention=dict(kernel="splash"))),
     r"'train.long_seq_length': 100 tokens is shorter than the local window"),
    (dict(model=dict(attention=dict(kernel="blockwise", dropout=0.1))),
     r"'model.attention.kernel': 'blockwise' has no attention dropout"),
    (dict(model=dict(attention=dict(kernel="splash", dropout=0.1))),
     r"'splash' has no attention dropout"),
    (dict(model=dict(attention=dict(kernel="pallas"), hidden_size=96)),
     r"'pallas' cannot run rows of data.seq_length=512 with heads of hidden_size / "
     r"num_heads = 24: .*power of 2"),
    (dict(model=dict(attention=dict(kernel="pallas")), data=dict(seq_length=520)),
     r"'pallas' cannot run rows of data.seq_length=520 .* multiple of 64"),
    (dict(model=dict(attention=dict(kernel="flash"))), r"'model.attention.kernel': .*flash"),
    (dict(model=dict(attention=dict(kernel="blockwise", window=0),
                     embeddings=dict(position="absolute"),
                     heads=dict(enhanced_mask_decoder=True))),
     r"'blockwise' takes self-attention over whole rows; model.heads.enhanced_mask_decoder"),
])
def test_bad_settings_stop_in_one_line_before_compiling(changes, message):
  config = _config()
  for section, fields in changes.items():
    config[section].update(fields)
  with pytest.raises(errors.ConfigError, match=message) as error:
    config_lib.validate(config)
  assert "\n" not in str(error.value)


@pytest.mark.parametrize("kernel", ["auto", "xla"])
def test_rows_shorter_than_the_window_are_taken_where_the_kernel_can(kernel):
  """Fine-tuning a released ModernBERT (a window of 128) on rows of 64, as Hugging Face
  runs it: xla, and auto (which then picks xla), take it."""
  config = _config(attention=dict(kernel=kernel))
  config.data.seq_length = 64
  config_lib.validate(config)


@pytest.mark.parametrize("backend, kernel, message", [
    ("tpu", "pallas", r"'pallas' is a GPU \(Triton\) kernel and does not run on TPU\. "
                      r"Use 'auto' or 'splash'"),
    ("cpu", "pallas", r"'pallas' is a GPU kernel; on CPU Pallas would interpret it, far "
                      r"slower \(that is for tests\)\. Use 'auto' \(it picks for the "
                      r"platform\), 'blockwise' or 'xla'\."),
    ("cpu", "splash", r"'splash' is a TPU kernel; on CPU Pallas would interpret it"),
    ("gpu", "splash", r"'splash' is a TPU kernel; on GPU Pallas would interpret it"),
])
def test_a_kernel_that_does_not_run_on_this_backend_stops_in_one_line(
    monkeypatch, backend, kernel, message):
  """A Pallas kernel off its platform: refused by the config's validation, before
  tracing. 'pallas' (Triton) does not run on a TPU; elsewhere Pallas would interpret a
  kernel, which is for tests (20 steps of the tiny ModernBERT with 'splash' on CPU took
  258 s), so a run refuses it unless a test opts in. On its own platform it runs."""
  monkeypatch.setattr(attention_kernels, "backend", lambda: backend)
  with pytest.raises(errors.ConfigError, match=rf"'model.attention.kernel': {message}"
                     ) as error:
    config_lib.validate(_config(attention=dict(kernel=kernel)))
  assert "\n" not in str(error.value)
  monkeypatch.setattr(attention_kernels, "interpret_off_platform", True)  # tests' opt-in
  if backend != "tpu":
    config_lib.validate(_config(attention=dict(kernel=kernel)))
  monkeypatch.setattr(attention_kernels, "interpret_off_platform", False)
  monkeypatch.setattr(attention_kernels, "backend",
                      lambda: attention_kernels.PLATFORMS[kernel])
  config_lib.validate(_config(attention=dict(kernel=kernel)))


@pytest.mark.parametrize("kernel", attention_kernels.ATTENTION_KERNELS)
def test_every_kernel_takes_a_window(kernel, interpreted_kernels):
  """'pallas' with a local window is allowed now, as every kernel is; a window as long
  as the row too, and any window where every layer is global."""
  config_lib.validate(_config(attention=dict(kernel=kernel)))
  config = _config(attention=dict(kernel=kernel, global_every=1))
  config.data.seq_length = 64
  config_lib.validate(config)


@pytest.mark.slow  # ~40 s on 2 shared cores: two train steps compiled, one at 8,192
def test_an_8192_token_row_trains_without_an_l_by_l_array():
  """The tiny ModernBERT's train step (masking, forward, loss, backward, optimizer) at
  batch 1 over a row of 8,192 tokens, compiled by XLA on CPU with "auto" (blockwise
  here): no [8192, 8192] array in its program, and a finite loss. The same step with
  'xla' at 1,024 tokens holds [1024, 1024] arrays (the check is not vacuous)."""
  found = {}
  for length, kernel in ((8192, "auto"), (1024, "xla")):
    trainer = trainer_lib.Trainer(long_context.long_config(length, kernel),
                                  devices=jax.devices()[:1])
    state = trainer.init_state()
    batch = trainer.device_batch(long_context.packed_row(
        length, trainer.method.model_config.vocab_size, seed=0))
    step, cost = trainer.compile_train_step(state, batch)
    found[length] = long_context.has_square_array(step.__wrapped__, length)
    if length == 8192:
      _, metrics = step(state, batch)
      loss, temp_mb = float(metrics["loss"]), cost.temp_bytes / 2**20
  print(f"8,192 tokens: loss {loss:.3f}, XLA temporaries {temp_mb:,.0f} MB")
  assert found == {8192: False, 1024: True}
  assert np.isfinite(loss)
  assert temp_mb < 1024  # one [8192, 8192] float32 is 256 MB


def test_a_long_run_evaluates_no_more_tokens_than_a_training_micro_batch(monkeypatch,
                                                                        tmp_path):
  """The tiny ModernBERT (configs/modernbert.py:tiny, its own eval.batch_size) trained at
  batch 1 on rows of 512 tokens: its held-out evaluation, compiled before the first step,
  reads batches of 1 row, not the demo's 32 (at 8,192 tokens the evaluation was the run's
  memory peak: 5.6 GB against 2.1 GB)."""
  config = long_context.long_config(512, "auto")
  config.train.steps, config.train.log_every, config.optimizer.warmup_steps = 2, 1, 1
  config.eval.batches, config.checkpoint.async_save = 2, False
  events = []
  real_device_batch = trainer_lib.Trainer.device_batch
  real_compile = trainer_lib.Trainer.compile_evaluate_step

  def recording_device_batch(self, batch):
    kind = "eval" if "example_weight" in batch else "train"
    events.append((kind, batch["input_ids"].shape))
    return real_device_batch(self, batch)

  def recording_compile(self, *args):
    events.append(("compile eval", args[2]["input_ids"].shape))
    return real_compile(self, *args)

  monkeypatch.setattr(trainer_lib.Trainer, "device_batch", recording_device_batch)
  monkeypatch.setattr(trainer_lib.Trainer, "compile_evaluate_step", recording_compile)
  result = train.run(config, str(tmp_path), show_progress=False, devices=jax.devices()[:1])
  assert result["step"] == 2 and np.isfinite(result["eval"]["mlm_loss"])
  # The first train batch, then the evaluation's first batch compiled, then training.
  assert events[:4] == [("train", (1, 512)), ("eval", (1, 512)), ("compile eval", (1, 512)),
                        ("train", (1, 512))]
  assert [shape for kind, shape in events if kind == "eval"] == [(1, 512)] * 3


def test_the_measuring_tool(monkeypatch, tmp_path, capsys):
  """python -m encoderx.tools.speed.long_context: a row measured (here in this process, at 256
  tokens: a global layer on 'xla', the local one blockwise, its 64-token window skipping
  key blocks; at 128 the window meets every block and takes 'xla' too), and the run's
  table, memory line against the bound and JSON record (its rows standing in for fresh
  processes)."""
  row = long_context.measure_one(256, "auto", 1)
  assert row["kernels_run"] == "blockwise,xla" and row["peak_mb"] > 0
  assert np.isfinite(row["loss"]) and row["step_ms"] > 0 and row["square_array"]
  peaks = {1024: 1000.0, 8192: 1000.0 + 1.6 * 1024}
  monkeypatch.setattr(long_context, "run_child", lambda length, kernel, steps: {
      **row, "kernel": kernel, "seq_length": length, "peak_mb": peaks[length]})
  path = tmp_path / "long.json"
  long_context.main(["--lengths=1024,8192", "--steps=1", f"--json={path}"])
  printed = capsys.readouterr().out
  record = json.loads(path.read_text())
  assert record["kind"] == "long_context" and record["command"] == (
      f"python -m encoderx.tools.speed.long_context --lengths=1024,8192 --steps=1 --json={path}")
  assert [r["seq_length"] for r in record["rows"]] == [1024, 8192]
  assert report.table("long_context", record["rows"]) in printed
  assert ("auto: peak at 8,192 tokens - peak at 1,024 = 1.60 GB (bound 1.5 GB: "
          "EXCEEDED)") in printed
  with pytest.raises(SystemExit):
    long_context.parse_args(["--kernels=triton"])

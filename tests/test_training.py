"""Training: sharding, gradient accumulation, resuming, learning, checkpoint safety."""
import gc
import hashlib
import pathlib
import weakref

import flax
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import PartitionSpec

from encoderx import checkpoint as checkpoint_lib
from encoderx import train
from encoderx.models import embeddings
from encoderx.tools.figures import plot
from encoderx.train import memory
from encoderx.train import trainer as trainer_lib

from train_steps import pretraining_batches, step_losses  # pylint: disable=g-bad-import-order

ONE_DEVICE = jax.devices()[:1]


@pytest.mark.parametrize("name, accumulate", [("bert:tiny", 1), ("bert:tiny", 2),
                                              ("deberta:tiny", 2)])
def test_mesh_2x2x2_matches_one_device(tiny_config, name, accumulate):
  """With 2 micro-batches of 4 rows each data-parallel device holds one row: XLA once
  computed that case's gradients wrong (see models/heads.py: _transform)."""
  config = tiny_config(name)  # dropout on: the masks and dropout are sharding-independent
  config.model.num_layers = 1  # sharding is what differs, not depth
  if name == "deberta:tiny":
    config.model.vocab_multiple = 8  # 8,001 tokens in 8,008 rows, to split in two
  config.train.grad_accum_steps = accumulate
  config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 2, 2, 2
  batches = pretraining_batches(config, 3)
  sharded = trainer_lib.Trainer(config)
  assert sharded.mesh.devices.shape == (2, 2, 2)
  config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 1, 1, 1
  single = trainer_lib.Trainer(config, devices=ONE_DEVICE)
  sharded_losses, sharded_state = step_losses(sharded, batches)
  single_losses, _ = step_losses(single, batches)
  np.testing.assert_allclose(sharded_losses, single_losses, atol=1e-5, rtol=0)
  assert sharded_losses[0] != sharded_losses[2]
  # Parameters really are split: the word embedding over tensor (vocab) and fsdp (embed).
  embedding = sharded_state.params["encoder_model"]["embeddings"]["word_embeddings"]["embedding"]
  assert embedding.sharding.spec == PartitionSpec("tensor", "fsdp")
  assert embedding.addressable_shards[0].data.shape == (embedding.shape[0] // 2,
                                                         embedding.shape[1] // 2)


def _vocabulary_params(params) -> dict[str, np.ndarray]:
  """The word embedding and the MLM bias, by path."""
  return {"/".join(path): np.asarray(value) for path, value in
          flax.traverse_util.flatten_dict(jax.device_get(params)).items()
          if embeddings.is_vocabulary_param(path)}


def test_a_padded_vocabulary_trains_as_the_unpadded_one(tiny_config):
  """model.vocab_multiple=128 gives bert_tiny's 8,000 tokens 8,064 rows, drawn as the
  unpadded model's with zero padding rows. Over 3 steps (dropout on, the same keys) it
  gives the unpadded model's losses, accuracies and real rows; the padding rows get zero
  gradients and stay zero; and they score the lowest float, so that no prediction is a
  padding id even where the padding rows would win."""
  config = tiny_config()
  batches = pretraining_batches(config, 3)
  plain = trainer_lib.Trainer(config, devices=ONE_DEVICE)
  config.model.vocab_multiple = 128
  padded = trainer_lib.Trainer(config, devices=ONE_DEVICE)
  # A default field is left out of checkpoint descriptions: older runs still resume.
  assert "vocab_multiple" not in plain.describe()["model"]
  assert padded.describe()["model"]["vocab_multiple"] == 128
  runs = []
  for trainer in (plain, padded):
    state, step, metrics = trainer.init_state(), trainer.train_step(0), []
    start = jax.tree_util.tree_map(np.array, state.params)  # a copy: steps donate it
    for batch in batches:
      state, step_metrics = step(state, trainer.device_batch(batch))
      metrics.append(jax.device_get(step_metrics))
    runs.append((start, metrics, jax.device_get(state.params)))
  (plain_start, plain_metrics, plain_params), (start, padded_metrics, padded_params) = runs
  for name, value in _vocabulary_params(start).items():
    assert value.shape[0] == 8064 and not np.any(value[8000:]), name
  jax.tree_util.tree_map(np.testing.assert_array_equal,
                         embeddings.resize_vocabulary(start, 8000), plain_start)
  for name in plain_metrics[0]:
    np.testing.assert_allclose([m[name] for m in padded_metrics],
                               [m[name] for m in plain_metrics], rtol=1e-6, err_msg=name)
  differences = jax.tree_util.tree_map(
      lambda a, b: float(np.abs(a - b).max()),
      embeddings.resize_vocabulary(padded_params, 8000), plain_params)
  print("padded vs unpadded after 3 steps: largest parameter difference "
        f"{max(jax.tree_util.tree_leaves(differences)):.1e}, losses "
        f"{[float(m['loss']) for m in padded_metrics]} vs "
        f"{[float(m['loss']) for m in plain_metrics]}")
  assert max(jax.tree_util.tree_leaves(differences)) < 1e-6
  assert not any(np.any(value[8000:])
                 for value in _vocabulary_params(padded_params).values())

  method = padded.method
  prepared = padded.prepared_batch(batches[0], 0)
  gradients = _vocabulary_params(jax.jit(jax.grad(lambda params: method.loss(
      params, {}, prepared, jax.random.key(0), method.denominators(prepared), None,
      None)[0]))(start))
  for name, gradient in gradients.items():
    assert np.any(gradient[:8000]) and not np.any(gradient[8000:]), name
  # Padding rows that would outscore every token: masked all the same.
  winning = jax.tree_util.tree_map(np.copy, start)
  winning["mlm_head"]["output_bias"][8000:] = 1e4
  winning["encoder_model"]["embeddings"]["word_embeddings"]["embedding"][8000:] = 1.0
  mlm_logits = jax.jit(lambda params: method.model.apply({"params": params}, prepared)[
      "mlm_logits"])
  logits = np.asarray(mlm_logits(winning))
  assert logits.shape[-1] == 8064 and logits.argmax(-1).max() < 8000
  assert np.all(logits[..., 8000:] == np.finfo(np.float32).min)
  np.testing.assert_array_equal(logits[..., :8000], np.asarray(mlm_logits(start))[..., :8000])


def test_a_dropped_trainer_is_freed_with_its_steps(tiny_config):
  """Its jitted steps are cached in the Trainer, not on the class: a class-level cache
  kept every Trainer's compiled executables (hundreds of memory mappings each) alive,
  and a long test process crashed in XLA past the kernel's map count."""
  trainer = trainer_lib.Trainer(tiny_config("bert:tiny"), devices=ONE_DEVICE)
  assert trainer.train_step(0) is trainer.train_step(0)  # still compiled once
  trainer.evaluate_step(0), trainer.predict_step()
  dropped = weakref.ref(trainer)
  del trainer
  gc.collect()
  assert dropped() is None


def test_gradient_accumulation_equals_one_larger_batch(tiny_config):
  config = tiny_config()
  config.model.hidden_dropout = config.model.attention.dropout = 0.0
  config.train.batch_size = 16
  batches = pretraining_batches(config, 2)
  one = trainer_lib.Trainer(config, devices=ONE_DEVICE)
  config.train.grad_accum_steps = 4
  accumulated = trainer_lib.Trainer(config, devices=ONE_DEVICE)
  losses_one, state_one = step_losses(one, batches)
  losses_accumulated, state_accumulated = step_losses(accumulated, batches)
  np.testing.assert_allclose(losses_accumulated, losses_one, rtol=1e-6)
  differences = jax.tree_util.tree_map(lambda a, b: float(np.abs(a - b).max()),
                                       state_one.params, state_accumulated.params)
  assert max(jax.tree_util.tree_leaves(differences)) < 1e-6
  moved = jax.tree_util.tree_map(lambda a, b: float(np.abs(a - b).max()),
                                 state_one.params, one.init_state().params)
  assert max(jax.tree_util.tree_leaves(moved)) > 1e-4  # the updates are not no-ops


def _run(config, workdir, **kwargs):
  return train.run(config, str(workdir), show_progress=False, devices=ONE_DEVICE, **kwargs)


def _step_losses(result):
  return {entry["step"]: entry["loss"] for entry in result["history"]}


@pytest.mark.parametrize("name", ["bert:tiny", "deberta:tiny"])
def test_stop_and_resume_equals_running_straight(tiny_config, tmp_path, name):
  config = tiny_config(name)
  config.model.num_layers = 1  # what is saved and restored does not depend on depth
  config.train.steps = 8
  config.checkpoint.every_steps = 100  # only the stop and the end save
  straight = _run(config, tmp_path / "straight")
  first = _run(config, tmp_path / "resumed", stop_at_step=4)
  assert first["stopped"] and first["step"] == 4 and not first["eval"]
  second = _run(config, tmp_path / "resumed", resume=True)
  assert second["step"] == 8 and not second["stopped"]
  losses = {**_step_losses(first), **_step_losses(second)}
  assert sorted(losses) == list(range(1, 9))
  np.testing.assert_array_equal([losses[s] for s in range(1, 9)],
                                [_step_losses(straight)[s] for s in range(1, 9)])
  assert second["eval"] == pytest.approx(straight["eval"])


def test_tiny_bert_learns_on_the_bundled_corpus(tiny_config, tmp_path):
  config = tiny_config()
  config.model.hidden_size, config.model.intermediate_size = 64, 128
  config.train.steps = 60
  config.optimizer.learning_rate = 3e-3
  config.optimizer.warmup_steps = 5
  result = _run(config, tmp_path)
  history = result["history"]
  assert history[0]["step"] == 1 and history[-1]["step"] == 60
  first = history[0]
  last = np.mean([h["mlm_loss"] for h in history[-10:]])
  assert last < first["mlm_loss"] - 2.0, (first["mlm_loss"], last)
  assert np.mean([h["mlm_accuracy"] for h in history[-10:]]) > first["mlm_accuracy"] + 0.05
  assert set(result["eval"]) >= {"mlm_loss", "mlm_accuracy", "nsp_accuracy",
                                 "mlm_perplexity"}
  assert all("tokens_per_second" in h for h in history[1:])
  assert (tmp_path / "config.json").exists() and any((tmp_path / "tensorboard").iterdir())
  # python -m encoderx.tools.figures.plot reads the run's logs back: every logged step, and the
  # held-out evaluation at the end.
  curves = plot.curves(str(tmp_path), "mlm_loss")
  np.testing.assert_array_equal(curves["train"][0], [h["step"] for h in history])
  np.testing.assert_allclose(curves["train"][1], [h["mlm_loss"] for h in history], rtol=1e-6)
  assert curves["held-out"][1][-1] == pytest.approx(result["eval"]["mlm_loss"], rel=1e-6)


def _fingerprint(directory: pathlib.Path) -> dict:
  return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
          for p in sorted(directory.rglob("*")) if p.is_file()}


def test_checkpoints_are_never_overwritten_or_misread(tiny_config, tmp_path, monkeypatch):
  config = tiny_config()
  config.train.steps = 6
  config.checkpoint.every_steps = 3
  _run(config, tmp_path, stop_at_step=3)
  checkpoints = tmp_path / "checkpoints"
  before = _fingerprint(checkpoints)
  assert "3" in {p.name for p in checkpoints.iterdir()}

  with pytest.raises(checkpoint_lib.CheckpointError, match="Pass --resume"):
    _run(config, tmp_path)
  assert _fingerprint(checkpoints) == before

  other = tiny_config()
  other.train.steps = 6
  other.model.num_layers = 3
  with pytest.raises(checkpoint_lib.CheckpointError,
                     match=r"different model.*num_layers: checkpoint 2, this run 3"):
    _run(other, tmp_path, resume=True)
  assert _fingerprint(checkpoints) == before

  # A run whose train or evaluation step does not fit in device memory stops in one line
  # before its first step (on CPU, which has no limit, one injected).
  real_compile = trainer_lib.Trainer.compile_train_step
  costs, trained = [], []

  def recording_compile(self, state, batch, phase_index=0):
    step, cost = real_compile(self, state, batch, phase_index)
    costs.append(cost)

    def counted(state, batch):
      trained.append(int(state.step))
      return step(state, batch)
    return counted, cost

  monkeypatch.setattr(trainer_lib.Trainer, "compile_train_step", recording_compile)
  monkeypatch.setattr(memory, "device_limit", lambda device: 2**20)
  with pytest.raises(memory.DeviceMemoryError,
                     match=r"^the train step at length 64, batch 8 needs [0-9.]+ MB per "
                     r"device, more than the 1\.0 MB of cpu device memory\. Use a smaller "
                     r"train\.batch_size, more train\.grad_accum_steps"):
    _run(config, tmp_path, resume=True)
  # The train step fits; evaluating 64 rows beside the train state does not.
  monkeypatch.setattr(memory, "device_limit", lambda device: costs[-1].device_bytes)
  config.eval.batch_size = 64
  with pytest.raises(memory.DeviceMemoryError,
                     match=r"^the evaluation step at length 64, batch 64 needs [0-9.]+ MB per "
                     r"device beside the train state, more than the [0-9.]+ MB of cpu device "
                     r"memory\. Set a smaller eval\.batch_size \(0: as many tokens as a "
                     r"training micro-batch\)\.$") as error:
    _run(config, tmp_path, resume=True)
  assert "\n" not in str(error.value) and not trained
  assert _fingerprint(checkpoints) == before
  config.eval.batch_size = 8
  monkeypatch.undo()

  # A run that crashes after resuming leaves the earlier checkpoint restorable.

  def crashing_compile(self, state, batch, phase_index=0):
    step, cost = real_compile(self, state, batch, phase_index)

    def crash_after_one(state, batch):
      if int(state.step) >= 4:
        raise RuntimeError("simulated crash")
      return step(state, batch)
    return crash_after_one, cost

  # The loop runs the step compiled ahead of time.
  monkeypatch.setattr(trainer_lib.Trainer, "compile_train_step", crashing_compile)
  with pytest.raises(RuntimeError, match="simulated crash"):
    _run(config, tmp_path, resume=True)
  monkeypatch.undo()
  assert _fingerprint(checkpoints) == before
  finished = _run(config, tmp_path, resume=True)
  assert finished["step"] == 6 and finished["eval"]


def test_the_default_evaluation_batch_holds_a_training_micro_batchs_tokens(tiny_config):
  """eval.batch_size=0: the rows of the largest training micro-batch at the evaluation's
  length (the long phase's at its length; every phase's where none trains at it), at
  least one per data-parallel device; a batch set by hand is kept."""
  config = tiny_config()
  config.eval.batch_size = 0
  config.train.steps, config.train.batch_size, config.train.grad_accum_steps = 10, 32, 2
  config.train.batch_size_schedule = ((2, 16),)
  config.train.long_fraction, config.train.long_seq_length = 0.5, 128
  trainer = trainer_lib.Trainer(config)  # 8 data-parallel devices
  assert [(p.seq_length, p.batch_size) for p in trainer.phases] == [(64, 16), (64, 32),
                                                                     (128, 32)]
  sizes = {length: trainer.evaluation_batch_size(length) for length in (64, 128, 16, 2048)}
  assert sizes == {64: 16, 128: 16, 16: 128, 2048: 8}
  config.eval.batch_size = 24
  assert trainer_lib.Trainer(config).evaluation_batch_size(128) == 24


def test_long_sequence_phase_switches_length_and_prediction_cap(tiny_config, tmp_path,
                                                               monkeypatch):
  config = tiny_config()
  config.model.num_layers = 1  # each phase compiles its own step: keep them small
  config.train.steps = 4
  config.train.long_fraction = 0.5  # BERT: 0.1 of the steps at 512
  config.train.long_seq_length = 64
  config.objective.mlm.long_max_predictions = 12
  config.data.seq_length = 32
  config.objective.mlm.max_predictions = 5
  shapes = {"train": [], "eval": []}
  real_device_batch = trainer_lib.Trainer.device_batch

  def recording_device_batch(self, batch):
    shapes["eval" if "example_weight" in batch else "train"].append(batch["input_ids"].shape)
    return real_device_batch(self, batch)

  monkeypatch.setattr(trainer_lib.Trainer, "device_batch", recording_device_batch)
  result = _run(config, tmp_path)
  assert result["step"] == 4 and result["eval"]
  assert shapes["train"] == [(8, 32)] * 2 + [(8, 64)] * 2
  # The final evaluation at the long phase's length (its first batch also compiled before
  # the first step).
  assert shapes["eval"] == [(8, 64)] * (1 + config.eval.batches)
  trainer = trainer_lib.Trainer(config, devices=ONE_DEVICE)
  assert [(p.start, p.end, p.seq_length) for p in trainer.phases] == [(0, 2, 32), (2, 4, 64)]
  assert [m.objectives[0].config.max_predictions for m in trainer.methods.values()] == [5, 12]
  saved = checkpoint_lib.Checkpoints(str(tmp_path / "checkpoints"))
  data = saved.manager.restore(4, args=ocp.args.Composite(data=ocp.args.JsonRestore()))
  saved.close()
  assert data["data"]["phase"] == 1 and data["data"]["batch"] == 2

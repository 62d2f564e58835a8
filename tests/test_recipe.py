"""The modern recipe's settings (docs/guides/recipes.md): the masking-rate schedule and
evaluation rate, the batch-size warmup, the context extension from --init_from with a
new rotary theta, the optimizer state carried into a later phase, checkpoint averaging
and the exponential moving average of the weights; each exact across a resume."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from encoderx import errors
from encoderx.train import trainer as trainer_lib
from encoderx.data import pipeline, tasks
from encoderx.objectives import mlm

ONE_DEVICE = jax.devices()[:1]


# --- the masking rate --------------------------------------------------------------------
def test_rate_schedule_by_hand():
  """mmBERT's shape: 30% -> 15% -> 5%, a pure function of the step (traced)."""
  config = mlm.MlmConfig(mask_id=4, special_ids=(0, 1, 2, 3, 4), vocab_size=100, rate=0.2,
                         rate_schedule=((4, 0.3), (8, 0.15), (12, 0.05)), eval_rate=0.15)
  rate_at = jax.jit(config.rate_at)
  rates = [float(rate_at(jnp.int32(step))) for step in range(14)]
  np.testing.assert_allclose(rates, [0.3] * 4 + [0.15] * 4 + [0.05] * 6, rtol=1e-7)
  assert config.rate_at(None) == 0.15  # evaluation
  assert mlm.MlmConfig(mask_id=4, special_ids=(0,), vocab_size=9, rate=0.3).rate_at(None) == 0.3


def test_masks_follow_the_schedule_and_evaluation_masks_at_its_rate(tiny_config):
  """Each row masks round(rate x candidates) tokens at its step's rate; evaluation
  masks at objective.mlm.eval_rate; the same (seed, step) gives the same masks from a
  new Trainer (what a resumed run builds)."""
  config = tiny_config()
  config.train.steps = 12
  config.objective.mlm.rate_schedule = ((4, 0.3), (8, 0.15), (12, 0.05))
  config.objective.mlm.max_predictions = 20
  config.objective.mlm.eval_rate = 0.15
  task = tasks.register_pretraining_task(config)
  (batch,) = pipeline.take_batches(task, "train", 64, 8, 1, seed=5)
  trainer = trainer_lib.Trainer(config, devices=ONE_DEVICE)
  method = trainer.method
  candidates = np.asarray(mlm.candidate_mask(batch, method.objectives[0].config.special_ids)
                          ).sum(axis=1)
  for step, rate in ((0, 0.3), (5, 0.15), (11, 0.05)):
    masked = trainer.prepared_batch(batch, step)["masked_weights"].sum(axis=1)
    expected = np.clip(np.round(np.float32(rate) * candidates), 1, 20)
    np.testing.assert_array_equal(masked, expected, err_msg=f"step {step}")
  evaluation = jax.jit(lambda b, k: method.prepare(b, k))(
      {k: jnp.asarray(v) for k, v in batch.items()}, jax.random.key(0))
  np.testing.assert_array_equal(np.asarray(evaluation["masked_weights"]).sum(axis=1),
                                np.clip(np.round(np.float32(0.15) * candidates), 1, 20))
  again = trainer_lib.Trainer(config, devices=ONE_DEVICE).prepared_batch(batch, 5)
  first = trainer.prepared_batch(batch, 5)
  for name in ("input_ids", "masked_positions", "masked_weights"):
    np.testing.assert_array_equal(again[name], first[name])


@pytest.mark.parametrize("schedule, message", [
    (((4, 0.3), (10, 0.15)), "last piece ends at step 10, but train.steps is 12"),
    (((6, 0.3), (4, 0.15), (12, 0.1)), "must increase"),
    (((6, 0.3), (12, 1.5)), "rate 1.5 is not in"),
    (((6, 0.5), (12, 0.1)), "objective.mlm.max_predictions': 10 cannot hold"),
])
def test_bad_rate_schedules_are_one_line_errors(tiny_config, schedule, message):
  config = tiny_config()
  config.train.steps = 12
  config.objective.mlm.rate_schedule = schedule
  with pytest.raises(errors.ConfigError, match=message) as error:
    trainer_lib.Trainer(config, devices=ONE_DEVICE)
  assert "\n" not in str(error.value)


# --- batch-size warmup --------------------------------------------------------------------
def _run(config, workdir, **kwargs):
  from encoderx import train
  return train.run(config, str(workdir), show_progress=False, devices=ONE_DEVICE, **kwargs)


def _step_losses(result):
  return {entry["step"]: entry["loss"] for entry in result["history"]}


def _recorded_batches(monkeypatch) -> list:
  """The numpy batches the train steps get from now on (their input_ids)."""
  recorded = []
  real_device_batch = trainer_lib.Trainer.device_batch

  def recording(self, batch):
    if "example_weight" not in batch:  # not an evaluation's
      recorded.append(batch["input_ids"])
    return real_device_batch(self, batch)

  monkeypatch.setattr(trainer_lib.Trainer, "device_batch", recording)
  return recorded


def _check_resume(config, workdir, straight, stop_at_step: int) -> None:
  """A run of `config` stopped at `stop_at_step` and resumed gives every loss, the
  held-out metrics and the final weights of the unbroken run `straight`."""
  first = _run(config, workdir, stop_at_step=stop_at_step)
  second = _run(config, workdir, resume=True)
  losses = {**_step_losses(first), **_step_losses(second)}
  steps = range(1, config.train.steps + 1)
  np.testing.assert_array_equal([losses[s] for s in steps],
                                [_step_losses(straight)[s] for s in steps])
  jax.tree_util.tree_map(np.testing.assert_array_equal, jax.device_get(second["params"]),
                         jax.device_get(straight["params"]))
  assert second["eval"] == straight["eval"]


def test_batch_size_warmup_helper_is_modernbert_s():
  from encoderx.configs import common
  # Sizes 8, 16, 24 over 12 steps held in proportion 8 : 16 : 24 (ends at 2, 6, 12).
  assert common.batch_size_warmup(8, 32, 12, 8) == ((2, 8), (6, 16), (12, 24))


@pytest.mark.slow
def test_batch_size_warmup_resumes_exactly_across_a_change(tiny_config, tmp_path,
                                                           monkeypatch):
  """Batches of 2, then 4, then 8 rows read one stream in units of 2: the steps see its
  rows in order, one compilation per size; stopped in the middle of the batch-of-4
  phase and resumed (the masking rate, the learning rate's decay and a moving average
  changing too), every loss, the held-out metrics and the final weights equal an
  unbroken run's."""
  config = tiny_config()
  config.train.steps = 8
  config.train.batch_size_schedule = ((3, 2), (5, 4))
  config.checkpoint.every_steps = 100
  # The rest of the recipe changes over the same steps: the masking rate, the learning
  # rate's decay (StableAdamW, 1-sqrt) and the moving average of the weights.
  config.objective.mlm.rate_schedule = ((4, 0.3), (8, 0.15))
  config.objective.mlm.max_predictions = 20
  config.optimizer.name, config.optimizer.decouple_lr = "stable_adamw", True
  config.optimizer.schedule, config.optimizer.decay_shape = "wsd", "1-sqrt"
  config.optimizer.decay_fraction = 0.5
  config.train.ema_decay = 0.9
  rows = _recorded_batches(monkeypatch)
  straight = _run(config, tmp_path / "straight")
  assert [r.shape for r in rows[:8]] == [(2, 64)] * 3 + [(4, 64)] * 2 + [(8, 64)] * 3
  trainer = trainer_lib.Trainer(config, devices=ONE_DEVICE)
  assert [(p.start, p.end, p.batch_size) for p in trainer.phases] == [
      (0, 3, 2), (3, 5, 4), (5, 8, 8)]
  task = tasks.register_pretraining_task(config)
  stream = pipeline.take_batches(task, "train", 64, 2, 19, seed=config.train.seed)
  np.testing.assert_array_equal(np.concatenate(rows[:8]),
                                np.concatenate([b["input_ids"] for b in stream]))
  _check_resume(config, tmp_path / "resumed", straight, stop_at_step=4)


@pytest.mark.parametrize("schedule, message", [
    (((3, 2), (2, 4)), "must increase"),
    (((3, 2), (8, 4)), "below train.steps=8"),
    (((3, 16),), "batch size 16 must be positive and at most train.batch_size=8"),
    (((3, 3),), "batch size 3 is not divisible by train.grad_accum_steps=2"),
])
def test_bad_batch_size_schedules_are_one_line_errors(tiny_config, schedule, message):
  config = tiny_config()
  config.train.steps = 8
  config.train.grad_accum_steps = 2
  config.train.batch_size_schedule = schedule
  with pytest.raises(errors.ConfigError, match=message):
    trainer_lib.Trainer(config, devices=ONE_DEVICE)


# --- the moving average of the weights -----------------------------------------------------
def test_ema_by_hand(tiny_config):
  """ema_0 = the first parameters, ema_t = d ema_{t-1} + (1 - d) params_t: what the
  train state keeps and what Trainer.weights (evaluation, export) gives."""
  config = tiny_config()
  config.train.ema_decay = 0.6
  trainer = trainer_lib.Trainer(config, devices=ONE_DEVICE)
  task = tasks.register_pretraining_task(config)
  batches = pipeline.take_batches(task, "train", 64, 8, 3, seed=2)
  state, step = trainer.init_state(), trainer.train_step(0)
  expected = jax.tree_util.tree_map(np.array, jax.device_get(state.params))
  for batch in batches:
    state, _ = step(state, trainer.device_batch(batch))
    params = jax.device_get(state.params)
    expected = jax.tree_util.tree_map(lambda e, p: 0.6 * e + 0.4 * p, expected, params)
  weights = jax.device_get(trainer.weights(state))
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
                         weights, expected)
  moved = max(float(np.abs(a - b).max()) for a, b in zip(
      jax.tree_util.tree_leaves(weights), jax.tree_util.tree_leaves(params)))
  assert moved > 1e-4  # the average is not the parameters


# --- context extension, with the optimizer state carried over ---------------------------------
@pytest.mark.slow
def test_context_extension_continues_the_source_at_a_longer_length(tiny_config, tmp_path,
                                                                   monkeypatch):
  """ModernBERT's phase 2 at tiny size: from a 64-token run's checkpoint (--init_from),
  rows of 128 and a global theta of 160,000 (the run's, not the source's), the source's
  parameters and optimizer state (moments and their counts; the schedule restarted);
  the run trains at 128, and stopped and resumed it equals an unbroken one."""
  from encoderx import checkpoint as checkpoint_lib
  from encoderx import initialize
  source = tiny_config("modernbert:tiny")
  source.train.steps = 4
  source.train.batch_size_schedule = ()
  source.checkpoint.every_steps = 100
  _run(source, tmp_path / "base")

  config = tiny_config("modernbert:tiny_context_extension")
  config.init_from = str(tmp_path / "base" / "checkpoints" / "4")
  config.data.seq_length = 128
  config.model.embeddings.max_positions = 128
  config.objective.mlm.max_predictions = 40
  config.train.steps = 4
  config.optimizer.warmup_steps = 0  # the variant's (the test fixture sets 2)
  config.checkpoint.every_steps = 100
  resolved = initialize.resolve_config(config)
  assert (resolved.model.embeddings.rope_theta, resolved.model.embeddings.local_rope_theta) == (160_000.0, 10_000.0)
  assert resolved.model.hidden_size == 32 and resolved.data.seq_length == 128

  # The first state: the source's parameters and optimizer state, the schedule at 0.
  source_trainer = trainer_lib.Trainer(source, devices=ONE_DEVICE)
  saved = checkpoint_lib.Checkpoints(str(tmp_path / "base" / "checkpoints"), read_only=True)
  _, source_state, _, _ = saved.restore_latest(
      source_trainer.abstract_state_with_shardings(), source_trainer.describe())
  saved.close()
  trainer = trainer_lib.Trainer(resolved, devices=ONE_DEVICE)
  state = initialize.initial_state(trainer)
  jax.tree_util.tree_map(np.testing.assert_array_equal, jax.device_get(state.params),
                         jax.device_get(source_state.params))
  (_, (adam, schedule)) = state.opt_state["all"]
  (_, (source_adam, _)) = source_state.opt_state["all"]
  assert int(adam.count) == 4 and int(schedule.count) == 0
  jax.tree_util.tree_map(np.testing.assert_array_equal, jax.device_get(adam.mu),
                         jax.device_get(source_adam.mu))

  rows = _recorded_batches(monkeypatch)
  straight = _run(config, tmp_path / "extended")
  assert [r.shape for r in rows[:4]] == [(8, 128)] * 4
  assert straight["history"][0]["learning_rate"] == pytest.approx(1e-3)  # constant
  _check_resume(config, tmp_path / "resumed", straight, stop_at_step=2)


def test_init_from_optimizer_needs_a_run(tiny_config):
  config = tiny_config("modernbert:tiny_context_extension")
  with pytest.raises(errors.ConfigError, match="init_from_optimizer.*needs init_from "):
    trainer_lib.Trainer(config, devices=ONE_DEVICE)
  config.init_from = "hf:/some/dir"
  with pytest.raises(errors.ConfigError, match="init_from_optimizer"):
    trainer_lib.Trainer(config, devices=ONE_DEVICE)


def test_a_theta_of_zero_stops_before_compiling(tiny_config):
  config = tiny_config("modernbert:tiny")
  config.model.embeddings.rope_theta = 0.0
  with pytest.raises(errors.ConfigError, match="model.embeddings.rope_theta': must be positive"):
    trainer_lib.Trainer(config, devices=ONE_DEVICE)


# --- checkpoint averaging ------------------------------------------------------------------
def _fingerprint(directory):
  import hashlib
  return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
          for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_average_is_the_hand_mean_and_a_run_like_any_other(tiny_config, tmp_path):
  """python -m encoderx.average: the mean of the last 2 checkpoints (and of named steps)
  equals the hand mean; export and --init_from read the result; the source run is not
  touched; checkpoints of another model stop with one line. A run with
  train.ema_decay contributes (and --init_from takes) its moving average."""
  import subprocess
  import sys
  from encoderx import average, initialize, sources
  from encoderx.export import writer
  config = tiny_config()
  config.train.steps = 6
  config.checkpoint.every_steps = 2
  config.train.ema_decay = 0.5
  run = tmp_path / "run"
  result = _run(config, run)
  before = _fingerprint(run)
  weights = {step: sources.run_weights(str(run), step)[1] for step in (2, 4, 6)}
  # The run's weights are the moving average: what it returned and what export reads.
  jax.tree_util.tree_map(np.testing.assert_array_equal, weights[6],
                         jax.device_get(result["params"]))

  written, chosen = average.average([str(run)], str(tmp_path / "last2"), last=2)
  assert chosen == [(str(run), 4), (str(run), 6)] and written.endswith("checkpoints/6")
  _, mean = sources.run_weights(str(tmp_path / "last2"), None)
  hand = jax.tree_util.tree_map(lambda a, b: ((a.astype(np.float64) + b) / 2).astype(a.dtype),
                                weights[4], weights[6])
  jax.tree_util.tree_map(np.testing.assert_array_equal, mean, hand)
  average.average([str(run)], str(tmp_path / "named"), steps=(2, 6))
  _, named = sources.run_weights(str(tmp_path / "named"), None)
  jax.tree_util.tree_map(
      lambda m, a, b: np.testing.assert_allclose(m, (a + b) / 2, rtol=1e-6, atol=1e-8),
      named, weights[2], weights[6])
  assert _fingerprint(run) == before

  # Export and --init_from read it like any other run.
  exported = writer.export_npz(str(tmp_path / "last2"), str(tmp_path / "mean.npz"))
  arrays = np.load(tmp_path / "mean.npz")
  embedding = "encoder_model/embeddings/word_embeddings/embedding"
  np.testing.assert_array_equal(arrays[embedding],
                                hand["encoder_model"]["embeddings"]["word_embeddings"]["embedding"])
  assert exported
  # An embedding run from it takes the encoder; the averaged run has no head to take.
  embedding_run = tiny_config("embedding:tiny")
  embedding_run.init_from = str(tmp_path / "last2")
  assert initialize.resolve_config(embedding_run).finetune.pooling == "mean"
  follower = tiny_config()
  follower.init_from = str(tmp_path / "last2")
  follower = initialize.resolve_config(follower)
  trainer = trainer_lib.Trainer(follower, devices=ONE_DEVICE)
  state = initialize.initial_state(trainer)
  jax.tree_util.tree_map(np.testing.assert_array_equal,
                         jax.device_get(state.params["encoder_model"]),
                         hand["encoder_model"])

  # Another model: one line, exit status 2, nothing written. (Its run directory is
  # written as train.run writes one, config.json and a checkpoint of step 3, untrained.)
  from export_checks import make_run  # pylint: disable=g-import-not-at-top
  other = tiny_config()
  other.model.num_layers = 3
  other.train.steps = 3
  make_run(other, str(tmp_path / "other"))
  command = subprocess.run(
      [sys.executable, "-m", "encoderx.average", f"--runs={run},{tmp_path / 'other'}",
       f"--output={tmp_path / 'mixed'}"], capture_output=True, text=True, timeout=300)
  assert command.returncode == 2, command.stderr
  (line,) = [l for l in command.stderr.splitlines() if l.startswith("encoderx: error")]
  assert "is another model than" in line and "num_layers: 2 vs 3" in line
  assert not (tmp_path / "mixed").exists()
  with pytest.raises(average.AverageError, match="exists and is not an empty directory"):
    average.average([str(run)], str(tmp_path / "last2"), last=1)

"""The optimizer's schedules against hand-computed values, StableAdamW against optimi's
(the reference ModernBERT trains with) step by step, and the one-line errors."""
import math

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from encoderx import config as config_lib
from encoderx import errors, optim


def _optimizer_config(**changes):
  config = config_lib.default_config().optimizer
  config.update(changes)
  return config


# --- schedules ------------------------------------------------------------------------
def test_linear_schedule_is_bert_s():
  schedule = optim.learning_rate_schedule(_optimizer_config(learning_rate=1e-3,
                                                            warmup_steps=10), 110)
  for step, expected in ((0, 0.0), (5, 5e-4), (10, 1e-3), (60, 5e-4), (110, 0.0)):
    assert float(schedule(step)) == pytest.approx(expected, abs=1e-9), step


@pytest.mark.parametrize("shape, at_quarter, at_half", [
    # linear: 1 - x; cosine: (1 + cos(pi x)) / 2; 1-sqrt: 1 - sqrt(x), all then scaled
    # from the peak to decay_to x peak: final + (1 - final) f.
    ("linear", 0.1 + 0.9 * 0.75, 0.1 + 0.9 * 0.5),
    ("cosine", 0.1 + 0.9 * (1 + math.cos(math.pi / 4)) / 2, 0.1 + 0.9 * 0.5),
    ("1-sqrt", 0.1 + 0.9 * (1 - math.sqrt(0.25)), 0.1 + 0.9 * (1 - math.sqrt(0.5)))])
def test_warmup_stable_decay_by_hand(shape, at_quarter, at_half):
  """100 steps: 10 of warmup, 50 stable at the peak, the last 40% decaying to 0.1 x."""
  config = _optimizer_config(schedule="wsd", learning_rate=2e-3, warmup_steps=10,
                             decay_fraction=0.4, decay_shape=shape, decay_to=0.1)
  schedule = optim.learning_rate_schedule(config, 100)
  peak = 2e-3
  expected = {0: 0.0, 4: 0.4 * peak, 10: peak, 35: peak, 59: peak, 60: peak,
              70: at_quarter * peak, 80: at_half * peak, 100: 0.1 * peak}
  for step, value in expected.items():
    assert float(schedule(step)) == pytest.approx(value, rel=1e-6, abs=1e-12), (shape, step)


def test_a_decay_only_run_starts_at_the_peak_and_ends_at_decay_to():
  """ModernBERT's learning-rate-decay run: OneMinusSqrtScheduler over the whole run."""
  config = _optimizer_config(schedule="wsd", learning_rate=3e-4, warmup_steps=0,
                             decay_fraction=1.0, decay_shape="1-sqrt", decay_to=0.001)
  schedule = optim.learning_rate_schedule(config, 400)
  assert float(schedule(0)) == pytest.approx(3e-4)
  assert float(schedule(100)) == pytest.approx(3e-4 * (0.001 + 0.999 * 0.5))
  assert float(schedule(400)) == pytest.approx(3e-7)


@pytest.mark.parametrize("changes, message", [
    (dict(schedule="wsd", warmup_steps=30, decay_fraction=0.8),
     "30 warmup steps and 80 decay steps .* do not fit in train.steps=100"),
    (dict(schedule="wsd", decay_fraction=1.5), "optimizer.decay_fraction': must be in"),
    (dict(schedule="wsd", decay_to=1.0), "optimizer.decay_to"),
    (dict(schedule="step"), "'step' is not one of 'linear', 'wsd'"),
    (dict(decay_shape="exp"), "optimizer.decay_shape"),
    (dict(decouple_lr=True), "applies to stable_adamw only"),
    (dict(name="stableadamw"), "optimizer.name"),
])
def test_bad_settings_are_one_line_errors(changes, message):
  with pytest.raises(errors.ConfigError, match=message) as error:
    optim.validate(_optimizer_config(**{"warmup_steps": 10, **changes}), 100)
  assert "\n" not in str(error.value)


# --- StableAdamW against optimi -----------------------------------------------------------
torch = pytest.importorskip("torch")
optimi = pytest.importorskip("optimi")


def _params(seed=0):
  """A small tree with a decayed kernel, an undecayed bias and LayerNorm, and a tensor
  whose gradients are large enough for the update clipping to act."""
  rng = np.random.default_rng(seed)
  return {"dense": {"kernel": rng.normal(size=(6, 5)).astype(np.float32),
                    "bias": rng.normal(size=(5,)).astype(np.float32)},
          "layer_norm": {"scale": (1 + 0.1 * rng.normal(size=(5,))).astype(np.float32)},
          "embedding": rng.normal(size=(7, 6)).astype(np.float32)}


def _gradients(params, steps, seed=1):
  """Gradients of every step; every third step's 100x larger than the rest, so that
  g² / v̂ jumps and the update clipping (RMS > 1) divides the learning rate."""
  rng = np.random.default_rng(seed)
  return [jax.tree_util.tree_map(
      lambda p, step=step: (rng.normal(size=p.shape) * (100.0 if step % 3 == 2 else 1.0)
                            ).astype(np.float32), params) for step in range(steps)]


@pytest.mark.parametrize("decouple_lr", [False, True])
def test_stable_adamw_equals_optimi_step_by_step(decouple_lr):
  """12 steps, fp32, the same parameters and gradients, weight decay masked off the bias
  and LayerNorm, a schedule that warms up and decays: parameters and both moments
  within 1e-6 relative of optimi.StableAdamW (foreach and not, kahan_sum off: fp32
  parameters never use it) at every step; the update clipping acted."""
  config = _optimizer_config(name="stable_adamw", learning_rate=1e-2, warmup_steps=3,
                             schedule="wsd", decay_fraction=0.5, decay_shape="1-sqrt",
                             decay_to=0.1, b1=0.9, b2=0.98, eps=1e-6, weight_decay=0.1,
                             decouple_lr=decouple_lr, clip_norm=0.0)
  steps = 12
  params = _params()
  grads = _gradients(params, steps)
  optimizer = optim.build(config, steps)
  schedule = optim.learning_rate_schedule(config, steps)
  state = optimizer.init(params)
  update = jax.jit(optimizer.update)
  ours = params

  flat = flax.traverse_util.flatten_dict(params)
  decayed = flax.traverse_util.flatten_dict(optim.decay_mask(params))
  for foreach in (False, True):
    tensors = {path: torch.nn.Parameter(torch.tensor(value)) for path, value in flat.items()}
    reference = optimi.StableAdamW(
        [{"params": [t for p, t in tensors.items() if decayed[p]]},
         {"params": [t for p, t in tensors.items() if not decayed[p]], "weight_decay": 0.0}],
        lr=config.learning_rate, betas=(config.b1, config.b2), eps=config.eps,
        weight_decay=config.weight_decay, decouple_lr=decouple_lr, kahan_sum=False,
        foreach=foreach, triton=False)
    ours, ours_state, worst, clipped = params, state, 0.0, 0
    for step in range(steps):
      for group in reference.param_groups:
        group["lr"] = float(schedule(step))  # what a LambdaLR would set
      for path, tensor in tensors.items():
        tensor.grad = torch.tensor(flax.traverse_util.flatten_dict(grads[step])[path])
      reference.step()
      changes, ours_state = update(grads[step], ours_state, ours)
      ours = optax.apply_updates(ours, changes)
      inner = ours_state[1][0]  # (clip, (stable adamw, schedule))
      for path, tensor in tensors.items():
        theirs = {"param": tensor.detach().numpy(),
                  "mu": reference.state[tensor]["exp_avg"].numpy(),
                  "nu": reference.state[tensor]["exp_avg_sq"].numpy()}
        mine = {"param": flax.traverse_util.flatten_dict(jax.device_get(ours))[path],
                "mu": flax.traverse_util.flatten_dict(jax.device_get(inner.mu))[path],
                "nu": flax.traverse_util.flatten_dict(jax.device_get(inner.nu))[path]}
        for name in theirs:
          scale = max(float(np.abs(theirs[name]).max()), 1e-30)
          worst = max(worst, float(np.abs(mine[name] - theirs[name]).max()) / scale)
      g = flax.traverse_util.flatten_dict(grads[step])[("embedding",)]
      v = flax.traverse_util.flatten_dict(jax.device_get(inner.nu))[("embedding",)]
      clipped += np.sqrt(np.mean(g * g / np.maximum(v, 1e-12))) > 1.0
    print(f"StableAdamW vs optimi (decouple_lr={decouple_lr}, foreach={foreach}): "
          f"{steps} steps, largest relative difference {worst:.1e}; update clipping "
          f"acted at {clipped} steps on the embedding")
    assert worst <= 1e-6
    assert clipped >= 3
  # Weight decay acted, and only where the mask says.
  decoupled = optim.build(_optimizer_config(**{**config.to_dict(), "weight_decay": 0.0}), steps)
  plain, plain_state = params, decoupled.init(params)
  for step in range(steps):
    changes, plain_state = decoupled.update(grads[step], plain_state, plain)
    plain = optax.apply_updates(plain, changes)
  np.testing.assert_allclose(ours["dense"]["bias"], plain["dense"]["bias"], rtol=1e-6)
  assert np.abs(ours["dense"]["kernel"] - plain["dense"]["kernel"]).max() > 1e-5


def test_stable_adamw_trains_a_tiny_run(tiny_config):
  """The trainer builds it, states shard and a few steps lower the loss."""
  from encoderx.train import trainer as trainer_lib
  from encoderx.data import pipeline, tasks
  config = tiny_config()
  config.optimizer.name = "stable_adamw"
  config.optimizer.decouple_lr = True
  config.optimizer.clip_norm = 0.0
  config.optimizer.learning_rate = 3e-3
  config.optimizer.schedule = "wsd"
  config.optimizer.decay_fraction = 0.0
  trainer = trainer_lib.Trainer(config, devices=jax.devices()[:1])
  task = tasks.register_pretraining_task(config)
  (batch,) = pipeline.take_batches(task, "train", 64, 8, 1, seed=3)
  state, step = trainer.init_state(), trainer.train_step(0)
  losses = []
  for _ in range(6):
    state, metrics = step(state, trainer.device_batch(batch))
    losses.append(float(metrics["loss"]))
  assert losses[-1] < losses[0] - 0.2 and losses == sorted(losses, reverse=True), losses


def test_weight_decay_skips_biases_norms_and_a_learned_scale():
  params = {"logit_scale": 1.0, "dense": {"kernel": 1.0, "bias": 1.0},
            "layer_norm": {"scale": 1.0}}
  assert optim.decay_mask(params) == {"logit_scale": False,
                                      "dense": {"kernel": True, "bias": False},
                                      "layer_norm": {"scale": False}}

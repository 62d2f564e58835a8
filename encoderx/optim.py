"""The optimizer: AdamW (BERT), LAMB (ALBERT) or StableAdamW (ModernBERT), a learning-rate
schedule (linear, or warmup-stable-decay with a linear, cosine or 1-sqrt tail), and
global-norm clipping.

`clip_norm` <= 0 turns clipping off. Weight decay skips LayerNorm parameters and biases,
as in BERT (google-research/bert optimization.py excludes "LayerNorm", "layer_norm" and
"bias"), and a contrastive run's learned scale. LAMB is ALBERT's: Adam's update plus
decoupled weight decay, scaled per parameter by the trust ratio ||w|| / ||update||,
except LayerNorm parameters and biases, which ALBERT leaves out of that layer-wise
scaling as out of weight decay (google-research/albert lamb_optimizer.py,
exclude_from_layer_adaptation); optax.lamb, whose steps these are, scales every parameter.

StableAdamW (Wortsman et al. 2023, "Stable and low-precision training for large-scale
vision-language models"; the reference is optimi's `StableAdamW`, warner-benjamin/optimi
optimi/stableadamw.py `_single_param_stableadamw`, which ModernBERT trains with:
AnswerDotAI/ModernBERT main.py `build_optimizer`, "decoupled_stableadamw") is AdamW whose
learning rate is divided, per tensor, by max(1, RMS(g² / max(v, ε²))): Adafactor's
update clipping instead of gradient clipping. `scale_by_stable_adamw` keeps optimi's
state (moments debiased as they are updated, so equal to Adam's bias-corrected m̂ and
v̂), its ε outside the square root, and its weight decay: × lr (optimi's default), or
× lr / peak lr with `decouple_lr` (optimi's fully decoupled weight decay, ModernBERT's).

Schedules (`learning_rate_schedule`): "linear" (BERT): 0 -> peak over warmup_steps,
then linearly to 0 at train.steps. "wsd" (warmup-stable-decay, trapezoidal; ModernBERT
src/scheduler.py `WarmupStableDecayScheduler` and `OneMinusSqrtScheduler`): 0 -> peak
over warmup_steps, flat, then over the last decay_fraction of the steps down to
decay_to x peak along `decay_shape`: "linear", "cosine" or "1-sqrt"
(1 - sqrt(x), Hägele et al. 2024). A decay phase run on its own (ModernBERT's
learning-rate-decay run) is "wsd" with warmup_steps=0 and decay_fraction=1.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import flax
import jax
import jax.numpy as jnp
import ml_collections
import optax

from encoderx import errors

SCHEDULES = ("linear", "wsd")
DECAY_SHAPES = ("linear", "cosine", "1-sqrt")


def config_section() -> ml_collections.ConfigDict:
  """config.optimizer: BERT's AdamW."""
  return ml_collections.ConfigDict(dict(
      # "adamw", "lamb" (ALBERT) or "stable_adamw" (ModernBERT): same schedule, clipping
      # and decay mask.
      name="adamw",
      learning_rate=1e-4,  # the peak
      warmup_steps=10_000,
      # "linear": warmup, then linearly to 0 at train.steps (BERT). "wsd": warmup, stable
      # at the peak, then decay over the last decay_fraction of train.steps to
      # decay_to x the peak, shaped decay_shape ("linear", "cosine", "1-sqrt").
      schedule="linear",
      decay_fraction=0.1,
      decay_shape="linear",
      decay_to=0.0,
      b1=0.9,
      b2=0.999,
      eps=1e-6,
      weight_decay=0.01,
      # stable_adamw: weight decay x learning rate / peak learning rate instead of x
      # learning rate (optimi's decouple_lr: fully decoupled weight decay, ModernBERT's).
      decouple_lr=False,
      clip_norm=1.0,  # <= 0: no clipping (ModernBERT: 0 with stable_adamw)
  ))


def decay_steps(optimizer_config, total_steps: int) -> int:
  """The steps of the wsd schedule's decay tail."""
  return int(round(optimizer_config.decay_fraction * total_steps))


def validate(optimizer_config, total_steps: int) -> None:
  """Checks config.optimizer for a run of `total_steps`; raises errors.ConfigError."""
  config = optimizer_config
  errors.check_choice("optimizer.name", config.name, tuple(OPTIMIZERS))
  errors.check_choice("optimizer.schedule", config.schedule, SCHEDULES)
  errors.check_choice("optimizer.decay_shape", config.decay_shape, DECAY_SHAPES)
  if config.learning_rate <= 0:
    errors.fail("optimizer.learning_rate", f"must be positive, got {config.learning_rate}.")
  if config.schedule == "linear" and not 0 <= config.warmup_steps < total_steps:
    errors.fail("optimizer.warmup_steps", f"{config.warmup_steps} must be >= 0 and below "
                f"train.steps={total_steps}.")
  if config.schedule == "wsd":
    if not 0.0 <= config.decay_fraction <= 1.0:
      errors.fail("optimizer.decay_fraction", f"must be in [0, 1], got "
                  f"{config.decay_fraction}.")
    decay = decay_steps(config, total_steps)
    if config.warmup_steps < 0 or config.warmup_steps + decay > total_steps:
      errors.fail("optimizer.warmup_steps", f"{config.warmup_steps} warmup steps and "
                  f"{decay} decay steps (optimizer.decay_fraction={config.decay_fraction}) "
                  f"do not fit in train.steps={total_steps}: warmup + stable + decay must "
                  "add up to the run.")
    if not 0.0 <= config.decay_to < 1.0:
      errors.fail("optimizer.decay_to", f"must be in [0, 1) (a fraction of the peak), got "
                  f"{config.decay_to}.")
  if config.decouple_lr and config.name != "stable_adamw":
    errors.fail("optimizer.decouple_lr", f"applies to stable_adamw only, not "
                f"{config.name!r}.")
  if not (0.0 <= config.b1 < 1.0 and 0.0 <= config.b2 < 1.0):
    errors.fail("optimizer.b1", f"and optimizer.b2 must be in [0, 1), got {config.b1} and "
                f"{config.b2}.")
  if config.eps < 0 or config.weight_decay < 0:
    errors.fail("optimizer.eps", f"and optimizer.weight_decay must be >= 0, got "
                f"{config.eps} and {config.weight_decay}.")


def decay_curve(shape: str, x, final: float):
  """The decay tail's multiplier of the peak at fraction x in [0, 1] of the tail: from 1
  at x = 0 to `final` at x = 1 (ModernBERT src/scheduler.py: `_linear_schedule`,
  `_cosine_schedule`, `OneMinusSqrtScheduler`)."""
  x = jnp.clip(x, 0.0, 1.0)
  if shape == "linear":
    fraction = 1.0 - x
  elif shape == "cosine":
    fraction = (1.0 + jnp.cos(jnp.pi * x)) / 2.0
  elif shape == "1-sqrt":
    fraction = 1.0 - jnp.sqrt(x)
  else:
    raise ValueError(f"unknown decay shape {shape!r}")
  return final + (1.0 - final) * fraction


def learning_rate_schedule(optimizer_config, total_steps: int,
                           peak: float | None = None) -> optax.Schedule:
  """The learning rate at each update (see the module docstring); `peak` overrides
  optimizer.learning_rate."""
  config = optimizer_config
  peak = config.learning_rate if peak is None else peak
  warmup = config.warmup_steps
  if config.schedule == "linear":
    return optax.join_schedules([
        optax.linear_schedule(0.0, peak, max(warmup, 1)),
        optax.linear_schedule(peak, 0.0, max(total_steps - warmup, 1)),
    ], boundaries=[warmup])
  decay = decay_steps(config, total_steps)
  decay_start = total_steps - decay
  shape, final = config.decay_shape, config.decay_to

  def schedule(count):
    warming = peak * count / max(warmup, 1)
    decaying = peak * decay_curve(shape, (count - decay_start) / max(decay, 1), final)
    return jnp.where(count < warmup, warming,
                     jnp.where(count < decay_start, peak, decaying))
  return schedule


# Parameters that are no weights: a contrastive run's learned (log) scale, which open_clip
# also keeps out of weight decay (decay would pull the scale towards 1).
NOT_DECAYED = ("logit_scale",)


def decay_mask(params) -> dict:
  """True for parameters that weight decay applies to: not biases, not LayerNorm, not
  NOT_DECAYED."""
  flat = flax.traverse_util.flatten_dict(params)
  return flax.traverse_util.unflatten_dict({
      path: not (path[-1].endswith("bias") or path[-1] in NOT_DECAYED
                 or any("layer_norm" in part for part in path))
      for path in flat})


def lamb(learning_rate, b1: float, b2: float, eps: float, weight_decay: float,
         mask, **unused) -> optax.GradientTransformation:
  """optax.lamb's steps, with the trust ratio masked like weight decay (see above)."""
  del unused
  return optax.chain(
      optax.scale_by_adam(b1=b1, b2=b2, eps=eps),
      optax.add_decayed_weights(weight_decay, mask),
      optax.masked(optax.scale_by_trust_ratio(), mask),
      optax.scale_by_learning_rate(learning_rate))


def adamw(learning_rate, b1: float, b2: float, eps: float, weight_decay: float,
          mask, **unused) -> optax.GradientTransformation:
  del unused
  return optax.adamw(learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay,
                     mask=mask)


class StableAdamWState(NamedTuple):
  """optimi StableAdamW's state: the updates done, and the moments, debiased as they
  are updated (optimi's exp_avg and exp_avg_sq: Adam's m̂ and v̂)."""
  count: jax.Array
  mu: Any
  nu: Any


def debias_beta(beta: float, count: jax.Array) -> jax.Array:
  """optimi.utils.debias_beta: beta x (1 - beta^(t-1)) / (1 - beta^t) at update t, so
  that a moving average updated with it is already bias-corrected (0 at t = 1)."""
  power = jnp.power(jnp.float32(beta), count.astype(jnp.float32))
  return (power - beta) / (power - 1.0)


def scale_by_stable_adamw(b1: float, b2: float, eps: float, weight_decay: float = 0.0,
                          mask=None) -> optax.GradientTransformation:
  """StableAdamW's direction before the learning rate: per tensor,
  (m̂ / (sqrt(v̂) + ε) + weight_decay x p) / max(1, sqrt(mean(g² / max(v̂, ε²)))),
  weight decay where `mask` (a tree or a function of the parameters) says so. Followed
  optimi/stableadamw.py `_single_param_stableadamw` (the update clipping divides the
  weight decay too, since optimi decays by the clipped learning rate)."""

  def init(params):
    zeros = lambda: jax.tree_util.tree_map(jnp.zeros_like, params)
    return StableAdamWState(count=jnp.zeros((), jnp.int32), mu=zeros(), nu=zeros())

  def update(grads, state, params=None):
    count = state.count + 1
    beta1, beta2 = debias_beta(b1, count), debias_beta(b2, count)
    mu = jax.tree_util.tree_map(lambda m, g: m + (1.0 - beta1) * (g - m), state.mu, grads)
    nu = jax.tree_util.tree_map(lambda v, g: beta2 * v + (1.0 - beta2) * g * g,
                                state.nu, grads)
    if weight_decay and params is None:
      raise ValueError("scale_by_stable_adamw with weight decay needs the parameters")
    decays = mask(params) if callable(mask) else mask
    if decays is None:
      decays = jax.tree_util.tree_map(lambda _: True, grads)

    def direction(g, m, v, p, decayed):
      rms = jnp.sqrt(jnp.mean(g * g / jnp.maximum(v, eps * eps)))
      step = m / (jnp.sqrt(v) + eps)
      if weight_decay and decayed:
        step = step + weight_decay * p
      return step / jnp.maximum(1.0, rms)

    updates = jax.tree_util.tree_map(direction, grads, mu, nu,
                                     grads if params is None else params, decays)
    return updates, StableAdamWState(count=count, mu=mu, nu=nu)

  return optax.GradientTransformation(init, update)


def stable_adamw(learning_rate, b1: float, b2: float, eps: float, weight_decay: float,
                 mask, decouple_lr: bool = False, peak: float = 1.0
                 ) -> optax.GradientTransformation:
  """StableAdamW at `learning_rate` (a schedule); weight decay x lr, or with
  `decouple_lr` x lr / `peak` (optimi's max_lr, which defaults to the peak lr)."""
  return optax.chain(
      scale_by_stable_adamw(b1, b2, eps, weight_decay / peak if decouple_lr else weight_decay,
                            mask),
      optax.scale_by_learning_rate(learning_rate))


OPTIMIZERS = {"adamw": adamw, "lamb": lamb, "stable_adamw": stable_adamw}


class EmaState(NamedTuple):
  """The wrapped optimizer's state, and the moving average of the parameters it
  updates (train.ema_decay)."""
  inner: Any
  ema: Any


def with_ema(optimizer: optax.GradientTransformation, decay: float
             ) -> optax.GradientTransformation:
  """`optimizer`, also keeping an exponential moving average of the parameters it
  updates: ema <- decay x ema + (1 - decay) x (params + updates) after every update,
  starting from the first parameters (no bias correction), as Keras optimizers'
  `use_ema` do. Kept in the optimizer's state, it is checkpointed and sharded with the
  parameters, and a skipped (non-finite) step leaves it as it was."""

  def init(params):
    return EmaState(inner=optimizer.init(params),
                    ema=jax.tree_util.tree_map(jnp.copy, params))

  def update(updates, state, params=None):
    updates, inner = optimizer.update(updates, state.inner, params)
    new_params = optax.apply_updates(params, updates)
    ema = jax.tree_util.tree_map(lambda e, p: decay * e + (1.0 - decay) * p, state.ema,
                                 new_params)
    return updates, EmaState(inner=inner, ema=ema)

  return optax.GradientTransformation(init, update)


def reset_schedules(opt_state):
  """`opt_state` with the learning-rate schedules' step counts at 0 and everything else
  (moments and their update counts, moving averages) kept: the optimizer state a later
  phase continues (--init_from with init_from_optimizer) under its own schedule."""
  def reset(node):
    if isinstance(node, optax.ScaleByScheduleState):
      return node._replace(count=jnp.zeros_like(node.count))
    return node
  return jax.tree_util.tree_map(reset, opt_state,
                                is_leaf=lambda x: isinstance(x, optax.ScaleByScheduleState))


def build(optimizer_config, total_steps: int, peak_learning_rate: float | None = None,
          ema_decay: float = 0.0) -> optax.GradientTransformation:
  """The configured optimizer; `peak_learning_rate` overrides optimizer.learning_rate;
  `ema_decay` > 0 keeps a moving average of the parameters (with_ema)."""
  peak = (optimizer_config.learning_rate if peak_learning_rate is None
          else peak_learning_rate)
  schedule = learning_rate_schedule(optimizer_config, total_steps, peak)
  clip = optimizer_config.clip_norm
  optimizer = OPTIMIZERS[optimizer_config.name]
  chained = optax.chain(
      optax.clip_by_global_norm(clip) if clip > 0 else optax.identity(),
      optimizer(schedule, b1=optimizer_config.b1, b2=optimizer_config.b2,
                eps=optimizer_config.eps, weight_decay=optimizer_config.weight_decay,
                mask=decay_mask, decouple_lr=optimizer_config.decouple_lr, peak=peak),
  )
  return with_ema(chained, ema_decay) if ema_decay else chained

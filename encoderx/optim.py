"""The optimizer: AdamW (BERT) or LAMB (ALBERT), with linear warmup then linear decay,
and global-norm clipping.

`clip_norm` <= 0 turns clipping off. Weight decay skips LayerNorm parameters and biases,
as in BERT (google-research/bert optimization.py excludes "LayerNorm", "layer_norm" and
"bias"). LAMB is ALBERT's: Adam's update plus decoupled weight decay, scaled per
parameter by the trust ratio ||w|| / ||update||, except LayerNorm parameters and biases,
which ALBERT leaves out of that layer-wise scaling as out of weight decay
(google-research/albert lamb_optimizer.py, exclude_from_layer_adaptation); optax.lamb,
whose steps these are, scales every parameter.
"""
from __future__ import annotations

import flax
import ml_collections
import optax

from encoderx import errors


def config_section() -> ml_collections.ConfigDict:
  """config.optimizer: BERT's AdamW."""
  return ml_collections.ConfigDict(dict(
      name="adamw",  # or "lamb" (ALBERT): same schedule, clipping and decay mask.
      learning_rate=1e-4,
      warmup_steps=10_000,
      b1=0.9,
      b2=0.999,
      eps=1e-6,
      weight_decay=0.01,
      clip_norm=1.0,  # <= 0: no clipping
  ))


def validate(optimizer_config, total_steps: int) -> None:
  """Checks config.optimizer for a run of `total_steps`; raises errors.ConfigError."""
  errors.check_choice("optimizer.name", optimizer_config.name, tuple(OPTIMIZERS))
  if optimizer_config.learning_rate <= 0:
    errors.fail("optimizer.learning_rate",
                f"must be positive, got {optimizer_config.learning_rate}.")
  if optimizer_config.warmup_steps < 0 or optimizer_config.warmup_steps >= total_steps:
    errors.fail("optimizer.warmup_steps", f"{optimizer_config.warmup_steps} must be >= 0 "
                f"and below train.steps={total_steps}.")


def learning_rate_schedule(optimizer_config, total_steps: int,
                           peak: float | None = None) -> optax.Schedule:
  """0 -> peak (default optimizer.learning_rate) over warmup_steps, then linearly to 0
  at total_steps."""
  peak = optimizer_config.learning_rate if peak is None else peak
  warmup = optimizer_config.warmup_steps
  return optax.join_schedules([
      optax.linear_schedule(0.0, peak, max(warmup, 1)),
      optax.linear_schedule(peak, 0.0, max(total_steps - warmup, 1)),
  ], boundaries=[warmup])


def decay_mask(params) -> dict:
  """True for parameters that weight decay applies to: not biases, not LayerNorm."""
  flat = flax.traverse_util.flatten_dict(params)
  return flax.traverse_util.unflatten_dict({
      path: not (path[-1].endswith("bias") or any("layer_norm" in part for part in path))
      for path in flat})


def lamb(learning_rate, b1: float, b2: float, eps: float, weight_decay: float,
         mask) -> optax.GradientTransformation:
  """optax.lamb's steps, with the trust ratio masked like weight decay (see above)."""
  return optax.chain(
      optax.scale_by_adam(b1=b1, b2=b2, eps=eps),
      optax.add_decayed_weights(weight_decay, mask),
      optax.masked(optax.scale_by_trust_ratio(), mask),
      optax.scale_by_learning_rate(learning_rate))


OPTIMIZERS = {"adamw": optax.adamw, "lamb": lamb}


def build(optimizer_config, total_steps: int,
          peak_learning_rate: float | None = None) -> optax.GradientTransformation:
  """The configured optimizer; `peak_learning_rate` overrides optimizer.learning_rate."""
  schedule = learning_rate_schedule(optimizer_config, total_steps, peak_learning_rate)
  clip = optimizer_config.clip_norm
  optimizer = OPTIMIZERS[optimizer_config.name]
  return optax.chain(
      optax.clip_by_global_norm(clip) if clip > 0 else optax.identity(),
      optimizer(schedule, b1=optimizer_config.b1, b2=optimizer_config.b2,
                eps=optimizer_config.eps, weight_decay=optimizer_config.weight_decay,
                mask=decay_mask),
  )

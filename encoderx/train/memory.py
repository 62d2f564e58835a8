"""Whether a run's compiled steps fit in its devices' memory, known before the first step.

The loop compiles the first train step and the evaluation steps ahead of time (XLA's
memory analysis of each: trainer.StepCost) and checks each against the device's memory
here, so that a step that cannot fit stops the run in one line before it trains, not at
its final evaluation after the whole run. A step that fits may still fail to allocate
(fragmentation, buffers outside the steps): the check is necessary, not sufficient.
"""
from __future__ import annotations

import math

import jax

from encoderx import errors
from encoderx.train import trainer as trainer_lib


class DeviceMemoryError(errors.UserError, RuntimeError):
  """A compiled step needs more memory than a device has."""


def device_limit(device: jax.Device) -> int | None:
  """The bytes a device's steps may hold: its allocator's limit (`bytes_limit` of
  memory_stats(): GPU, TPU). None on CPU, which reports no memory statistics: a CPU
  run's arrays share the host's memory with its data pipeline and everything else on the
  machine, which overcommits and swaps, so no figure says what would fail; CPU runs go
  unchecked."""
  stats = device.memory_stats()
  return int(stats["bytes_limit"]) if stats and stats.get("bytes_limit") else None


def bytes_per_device(tree) -> int:
  """The bytes one device holds of a pytree of (sharded) arrays: its largest shards."""
  return sum(
      x.dtype.itemsize * math.prod(x.sharding.shard_shape(x.shape))
      for x in jax.tree_util.tree_leaves(tree) if hasattr(x, "sharding"))


def _size(count: int) -> str:
  return f"{count / 2**30:,.2f} GB" if count >= 2**30 else f"{count / 2**20:,.1f} MB"


def check(what: str, needed: int, advice: str, device: jax.Device, beside: str = "") -> None:
  """A DeviceMemoryError saying `what` needs `needed` bytes per device (`beside` what) and
  `advice`, when that is more than the device's limit (nothing where it has none:
  device_limit)."""
  limit = device_limit(device)
  if limit is not None and needed > limit:
    raise DeviceMemoryError(f"{what} needs {_size(needed)} per device{beside}, more than "
                            f"the {_size(limit)} of {device.platform} device memory. {advice}")


def check_train_step(trainer: trainer_lib.Trainer, cost: trainer_lib.StepCost,
                     rows: int, length: int) -> None:
  """The train step (state, batch, gradients, temporaries) against device memory."""
  check(f"the train step at length {length}, batch {rows}", cost.device_bytes,
        "Use a smaller train.batch_size, more train.grad_accum_steps, model.layout.remat=True "
        "or more devices.", trainer.mesh.local_devices[0])


def check_evaluation_step(trainer: trainer_lib.Trainer, cost: trainer_lib.StepCost,
                          state, weights, rows: int, length: int) -> None:
  """An evaluation step beside the train state that stays resident while it runs (less
  the weights and method state, which the step's own arguments count)."""
  resident = bytes_per_device(state) - bytes_per_device((weights, state.method_state))
  advice = ("Set a smaller eval.batch_size (0: as many tokens as a training micro-batch)."
            if trainer.config.eval.batch_size else
            "Use a smaller train.batch_size or more train.grad_accum_steps (eval.batch_size"
            "=0 evaluates as many tokens as a training micro-batch), or more devices.")
  check(f"the evaluation step at length {length}, batch {rows}",
        cost.device_bytes + max(0, resident), advice, trainer.mesh.local_devices[0],
        beside=" beside the train state")

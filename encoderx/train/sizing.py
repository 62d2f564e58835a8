"""What a run's train steps need before it runs (`python -m encoderx.train ...
--compile_only`): each phase's train step compiled ahead of time, as the loop compiles it,
for the run's state and a batch of its data, and nothing trained or written.

XLA's figures for each (trainer.StepCost: FLOPs, bytes accessed, the memory a device holds)
size a run before a slice is spent on it, and say what a step would hold where running it
is out of the question: a contrastive batch of thousands of texts without gradient
caching, a context length the host cannot hold. The state is abstract (shapes and
shardings only), so not even the weights are allocated; the batch is the data's first.
"""
from __future__ import annotations

import dataclasses

import ml_collections

from encoderx import initialize
from encoderx.data import pipeline
from encoderx.train import feeding
from encoderx.train import memory
from encoderx.train import trainer as trainer_lib


@dataclasses.dataclass(frozen=True)
class StepSize:
  """One compiled train step: the phase's length and global batch, XLA's cost of it, and
  the device memory it has to fit in (None: the device reports none, as CPUs)."""
  seq_length: int
  batch_size: int
  cost: trainer_lib.StepCost
  device_limit: int | None

  def describe(self) -> str:
    limit = ("" if self.device_limit is None else
             f"; the device has {self.device_limit / 2**30:,.2f} GB: " +
             ("fits" if self.cost.device_bytes <= self.device_limit else "DOES NOT FIT"))
    return (f"train step at length {self.seq_length}, batch {self.batch_size} "
            f"{self.cost.describe()}{limit}")


def compile_train_steps(config: ml_collections.ConfigDict, devices=None) -> list[StepSize]:
  """Each distinct (length, batch size) of the run's phases, compiled and measured."""
  config = initialize.resolve(config).config
  trainer = trainer_lib.Trainer(config, devices=devices)
  trainer.method.check_data()
  task = trainer.method.task()
  state = trainer.abstract_state_with_shardings()
  sizes, seen = [], set()
  for phase in trainer.phases:
    if (phase.seq_length, phase.batch_size) in seen:
      continue
    seen.add((phase.seq_length, phase.batch_size))
    batches = pipeline.batch_iterator(
        task, "train", phase.seq_length,
        feeding.local_batch_size(config, phase.batch_size), seed=config.train.seed,
        shard_info=feeding.shard_info(config))
    try:
      batch = feeding.device_batch(trainer, next(batches))
    finally:
      batches.close()
    _, cost = trainer.compile_train_step(state, batch, phase.index)
    sizes.append(StepSize(phase.seq_length, phase.batch_size, cost,
                          memory.device_limit(trainer.mesh.local_devices[0])))
  return sizes

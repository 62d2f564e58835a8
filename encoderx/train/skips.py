"""Steps skipped for non-finite values: when to stop a run, and which checkpoint to keep."""
from __future__ import annotations

import logging

from encoderx.train import trainer as trainer_lib

logger = logging.getLogger("encoderx")


class SkipWatch:
  """Watches the steps that the train step skipped for a non-finite loss or gradient
  norm (the state's counters), when the host waits for the device anyway: at each log
  flush and before each save. Stops the run when more than train.max_skipped_steps were
  skipped in a row, never saves a non-finite state, and names the checkpoint to keep out
  of rotation: the last one saved before skipped steps."""

  def __init__(self, trainer: trainer_lib.Trainer, state, last_checkpoint: int | None,
               kept_step: int | None):
    self.trainer = trainer
    self.limit = trainer.config.train.max_skipped_steps
    self.total_at_last_save = int(state.skipped_total)
    self.last_checkpoint, self.kept_step = last_checkpoint, kept_step

  def check(self, state, step: int) -> None:
    in_a_row = int(state.skipped_in_a_row)
    if in_a_row > self.limit:
      last = (f"its last checkpoint, step {self.last_checkpoint}, holds the state from "
              "before them" if self.last_checkpoint is not None else "no checkpoint was saved")
      raise trainer_lib.NonFiniteError(
          f"steps {step - in_a_row + 1}-{step} ({in_a_row} in a row) had a non-finite loss "
          "or gradient norm and were skipped, more than train.max_skipped_steps="
          f"{self.limit}: training has diverged ({last}). Lower optimizer.learning_rate "
          "(or look at the data of those steps) and resume.")

  def before_save(self, state, step: int) -> int | None:
    """Raises NonFiniteError rather than save a diverged or non-finite state; returns the
    step the new checkpoint keeps out of rotation (None: none)."""
    self.check(state, step)
    if not self.trainer.state_is_finite(state):
      raise trainer_lib.NonFiniteError(
          f"the state after step {step} holds non-finite values and was not saved (the last "
          f"checkpoint is step {self.last_checkpoint}). Lower optimizer.learning_rate and "
          "resume.")
    total = int(state.skipped_total)
    if total > self.total_at_last_save and self.last_checkpoint is not None:
      self.kept_step = self.last_checkpoint
      logger.warning("%d step(s) since step %d were skipped for non-finite values; the "
                     "checkpoint of step %d is kept out of rotation.",
                     total - self.total_at_last_save, self.last_checkpoint,
                     self.last_checkpoint)
    self.total_at_last_save, self.last_checkpoint = total, step
    return self.kept_step

"""orbax checkpoints of a run: train state, data position and what model it is; and the
parameters of its best evaluation.

Each checkpoint step holds four items:
  state             params, optimizer state, step and RNG key (sharded arrays)
  data              the data pipeline's position, so a resumed run continues with the
                    next batch (as process 0 saw it)
  data_per_process  every process's own position (process_<i>-of-<n>.json, written by
                    Grain's orbax handler): streaming processes read different shards
  model             a description of the architecture, checked before anything is restored

orbax writes each step to a temporary directory and renames it when complete, so a run
that dies mid-save leaves the earlier checkpoints intact. A run never writes into a
directory that holds another run's checkpoints unless asked to resume it, and never
resumes a checkpoint of a different model.
"""
from __future__ import annotations

import json
import os

import grain.checkpoint
import orbax.checkpoint as ocp

ITEMS = ("state", "data", "model", "data_per_process")


class CheckpointError(RuntimeError):
  """A checkpoint directory that this run must not use as asked."""


def _differences(stored: dict, current: dict, prefix: str = "") -> list[str]:
  lines = []
  for key in sorted(set(stored) | set(current)):
    a, b = stored.get(key, "<absent>"), current.get(key, "<absent>")
    if isinstance(a, dict) and isinstance(b, dict):
      lines += _differences(a, b, f"{prefix}{key}.")
    elif a != b:
      lines.append(f"{prefix}{key}: checkpoint {a!r}, this run {b!r}")
  return lines


class _ProcessPosition:
  """A process's data position in the shape Grain's orbax CheckpointHandler saves and
  restores (an iterator state as JSON bytes, one file per process)."""

  def __init__(self, position: dict | None = None):
    self.position = position

  def get_state(self) -> bytes:
    return json.dumps(self.position).encode()

  def set_state(self, state: bytes) -> None:
    self.position = json.loads(state)

  def start_prefetch(self) -> None:
    """Nothing to prefetch (the handler calls it after restoring)."""


class Checkpoints:
  """The checkpoints of one run directory."""

  def __init__(self, directory: str, keep: int = 3, async_save: bool = True):
    self.directory = directory
    self.manager = ocp.CheckpointManager(
        directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                             enable_async_checkpointing=async_save),
        item_names=ITEMS)

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def check_can_start(self, description: dict, resume: bool) -> int | None:
    """The step to resume from (None: start fresh); raises CheckpointError if this run
    would overwrite or misread the directory's checkpoints."""
    step = self.latest_step()
    if step is None:
      return None
    stored = self.manager.restore(step, args=ocp.args.Composite(
        model=ocp.args.JsonRestore()))["model"]
    differences = _differences(stored, description)
    if differences:
      raise CheckpointError(
          f"{self.directory} holds checkpoints (latest step {step}) of a different model "
          f"than this config describes: {'; '.join(differences)}. Use another work "
          "directory, or the config that made those checkpoints.")
    if not resume:
      raise CheckpointError(
          f"{self.directory} already holds checkpoints of this model (latest step "
          f"{step}). Pass --resume to continue that run, or choose a new work "
          "directory; encoderx does not overwrite a run's checkpoints.")
    return step

  def save(self, step: int, state, data_position: dict, description: dict) -> None:
    self.manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        data=ocp.args.JsonSave(data_position),
        data_per_process=grain.checkpoint.CheckpointSave(_ProcessPosition(data_position)),
        model=ocp.args.JsonSave(description)))

  def restore(self, step: int, abstract_state) -> tuple[object, dict]:
    """(state, this process's data position) of `step`; `abstract_state` gives shapes and
    shardings. Checkpoints written before positions were kept per process give
    process 0's."""
    restored = self.manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state),
        data=ocp.args.JsonRestore()))
    position = restored["data"]
    if os.path.isdir(os.path.join(self.directory, str(step), "data_per_process")):
      own = _ProcessPosition()
      self.manager.restore(step, args=ocp.args.Composite(
          data_per_process=grain.checkpoint.CheckpointRestore(own)))
      position = own.position
    return restored["state"], position

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()


class BestCheckpoint:
  """The parameters (and method state) of the run's best evaluation by one metric, in
  their own directory (`best/`), one checkpoint kept."""

  def __init__(self, directory: str, metric: str, mode: str = "max"):
    self.metric = metric
    self.manager = ocp.CheckpointManager(
        directory,
        options=ocp.CheckpointManagerOptions(
            max_to_keep=1, best_fn=lambda metrics: metrics[metric], best_mode=mode,
            create=True, enable_async_checkpointing=False),
        item_names=("weights", "metrics"))

  def save(self, step: int, state, metrics: dict) -> None:
    if self.metric not in metrics:
      raise CheckpointError(
          f"config field 'eval.best_metric': the evaluation has no metric "
          f"'{self.metric}'; it reports {', '.join(sorted(metrics))}.")
    if step in self.manager.all_steps():
      return
    weights = {"params": state.params, "method_state": state.method_state}
    self.manager.save(step, args=ocp.args.Composite(
        weights=ocp.args.StandardSave(weights), metrics=ocp.args.JsonSave(metrics)),
        metrics=metrics)

  def best_step(self) -> int | None:
    return self.manager.best_step()

  def restore(self, step: int, abstract_state) -> tuple[object, object, dict]:
    """(params, method state, metrics) of `step`."""
    abstract = {"params": abstract_state.params, "method_state": abstract_state.method_state}
    restored = self.manager.restore(step, args=ocp.args.Composite(
        weights=ocp.args.StandardRestore(abstract), metrics=ocp.args.JsonRestore()))
    weights = restored["weights"]
    return weights["params"], weights["method_state"], restored["metrics"]

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()


def restore_for_inference(workdir: str, description: dict, abstract_state,
                          best_metric: str = "", best_mode: str = "max"):
  """(params, method state) of a run for predictions: its best checkpoint by
  `best_metric` (best/) if it kept one, else its latest; the model must be the one
  `description` describes."""
  checkpoints = Checkpoints(os.path.join(workdir, "checkpoints"))
  try:
    latest = checkpoints.check_can_start(description, resume=True)
    if best_metric and os.path.isdir(os.path.join(workdir, "best")):
      best = BestCheckpoint(os.path.join(workdir, "best"), best_metric, best_mode)
      try:
        if best.best_step() is not None:
          params, method_state, _ = best.restore(best.best_step(), abstract_state)
          return params, method_state
      finally:
        best.close()
    if latest is None:
      raise CheckpointError(f"{workdir} holds no checkpoint to predict with; train first "
                            "(the same command without --predict).")
    state, _ = checkpoints.restore(latest, abstract_state)
    return state.params, state.method_state
  finally:
    checkpoints.close()

"""Checkpoint averaging: the mean of a run's last checkpoints (or of chosen steps, or of
several runs' latest), written as a run that export, --init_from and fine-tuning read
like any other (the command: average/__main__.py).

    from encoderx import average
    average.average(["runs/a"], "runs/a_last4", last=4)

Each checkpoint contributes the run's weights (its parameters, or with train.ema_decay
their moving average: what it exports); the mean is taken in float64 and stored in the
parameters' dtype. The checkpoints must be of one model (the runs' config.model and
method equal; the same parameter shapes): anything else stops with one line. DIR gets
the first run's config.json (train.ema_decay 0: the weights are the parameters),
`averaged_from.json` (the runs and steps) and checkpoints/<newest step>/ holding the
mean parameters (no optimizer state: a start for --init_from, export or fine-tuning,
not a run to --resume). The source runs are only read. Averaging the last checkpoints
of a stable or decaying learning rate is the "LAWA" / model-soup practice (Kaddour 2022;
Sanyal et al. 2023) that mmBERT and Ettin use for their final models.
"""
from __future__ import annotations

import json
import os

import flax
import jax
import numpy as np
import orbax.checkpoint as ocp

from encoderx import checkpoint as checkpoint_lib
from encoderx import errors
from encoderx import files as files_lib
from encoderx import sources



class AverageError(errors.UserError, ValueError):
  """Checkpoints that cannot be averaged, or an output that must not be written."""


def _steps(workdir: str) -> list[int]:
  directory = os.path.join(workdir, "checkpoints")
  if not checkpoint_lib.has_checkpoints(directory):
    raise AverageError(f"'{workdir}' holds no checkpoint (is it a run's work "
                       "directory?).", argument="runs")
  manager = ocp.CheckpointManager(directory, item_names=("state",),
                                  options=ocp.CheckpointManagerOptions(read_only=True))
  try:
    return sorted(manager.all_steps())
  finally:
    manager.close()


def chosen_checkpoints(runs: list[str], last: int = 0, steps: tuple[int, ...] = ()
                       ) -> list[tuple[str, int]]:
  """(run, step) of every checkpoint to average: `steps` of each run, or each run's
  `last` newest (default: 1, the latest)."""
  if last and steps:
    raise AverageError(f"steps {', '.join(map(str, steps))} and the last {last} checkpoints "
                       "exclude each other: give one of the two.", argument="steps")
  chosen = []
  for run in runs:
    available = _steps(run)
    if steps:
      missing = sorted(set(steps) - set(available))
      if missing:
        raise AverageError(f"{run} has no checkpoint of step "
                           f"{', '.join(map(str, missing))} (it has "
                           f"{', '.join(map(str, available))}).", argument="steps")
      chosen += [(run, step) for step in steps]
    else:
      count = last or 1
      if count > len(available):
        raise AverageError(f"{run} holds {len(available)} checkpoints "
                           f"({', '.join(map(str, available))}), fewer than the last "
                           f"{count} to average.", argument="last")
      chosen += [(run, step) for step in available[-count:]]
  return chosen


def _model_of(config) -> dict:
  return {"method": config.method, **config.model.to_dict()}


def mean_weights(checkpoints: list[tuple[str, int]]):
  """(the first run's config, the mean of the checkpoints' weights in the runs' own
  layout). Raises AverageError when they are not of one model."""
  configs = {run: sources.run_config(os.path.join(run, "config.json"))
             for run, _ in checkpoints}
  first_run = checkpoints[0][0]
  first = configs[first_run]
  for run, config in configs.items():
    differences = [f"{key}: {value!r} vs {_model_of(config).get(key)!r}"
                   for key, value in _model_of(first).items()
                   if _model_of(config).get(key) != value]
    if differences:
      raise AverageError(f"{run} is another model than {first_run} "
                         f"({'; '.join(differences[:5])}): only checkpoints of one model "
                         "average.")
  total, reference = None, None
  for run, step in checkpoints:
    _, weights = sources.run_weights(run, step, configs[run])
    flat = flax.traverse_util.flatten_dict(weights)
    if reference is None:
      reference = {path: (value.shape, value.dtype) for path, value in flat.items()}
      total = {path: np.zeros(value.shape, np.float64) for path, value in flat.items()}
    shapes = {path: (value.shape, value.dtype) for path, value in flat.items()}
    if shapes != reference:
      raise AverageError(f"{run} step {step}: its parameters differ in names or shapes "
                         f"from {first_run}'s: only checkpoints of one model average.")
    for path, value in flat.items():
      total[path] += value
  mean = {path: (value / len(checkpoints)).astype(reference[path][1])
          for path, value in total.items()}
  return first, flax.traverse_util.unflatten_dict(mean)


def _output_directory(output: str) -> str:
  directory = files_lib.path(output)
  if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
    raise AverageError(f"'{directory}' exists and is not an empty directory; "
                       "name a new one (nothing is overwritten).", argument="output")
  return str(directory)


def average(runs: list[str], output: str, last: int = 0, steps: tuple[int, ...] = ()
            ) -> tuple[str, list[tuple[str, int]]]:
  """Writes the mean of the chosen checkpoints to `output` as a run (see the module
  docstring); returns (its checkpoint directory, the checkpoints averaged)."""
  runs = [str(files_lib.path(run)) for run in runs]
  output = _output_directory(output)
  checkpoints = chosen_checkpoints(runs, last, steps)
  config, mean = mean_weights(checkpoints)
  config.train.ema_decay = 0.0  # the weights are now the parameters
  config.init_from = ""
  config.init_from_optimizer = False
  step = max(step for _, step in checkpoints)
  files_lib.path(output).mkdir(parents=True, exist_ok=True)
  files_lib.write_atomically(os.path.join(output, "config.json"),
                             config.to_json_best_effort(indent=2))
  files_lib.write_atomically(os.path.join(output, "averaged_from.json"), json.dumps(
      {"checkpoints": [{"run": run, "step": s} for run, s in checkpoints]}, indent=2))
  manager = ocp.CheckpointManager(os.path.join(output, "checkpoints"), item_names=("state",),
                                  options=ocp.CheckpointManagerOptions(
                                      enable_async_checkpointing=False))
  try:
    manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(
        {"params": jax.tree_util.tree_map(np.asarray, mean)})))
    manager.wait_until_finished()
  finally:
    manager.close()
  return os.path.join(output, "checkpoints", str(step)), checkpoints

"""orbax checkpoints of a run: train state, data position and what the run is; and the
parameters of its best evaluation.

Each checkpoint step holds four items:
  state             params, optimizer state, step, RNG key, skip counters (sharded arrays)
  data              the data pipeline's position, so a resumed run continues with the
                    next batch (as process 0 saw it)
  data_per_process  every process's own position (process_<i>-of-<n>.json, written by
                    Grain's orbax handler): streaming processes read different shards
  model             a description of the run (Trainer.describe): the architecture, and
                    under "training" the config sections that decide what it trains on
                    and toward
  checksums         a checksum of every array of `state` and of the data and model
                    items (encoderx/checksum.py), taken at save

What guards a run's checkpoints:
- orbax writes each step to a temporary directory and renames it when complete, so a run
  that dies mid-save leaves the earlier checkpoints intact; the unfinished directory is
  removed when the next run opens the work directory (`remove_unfinished`, logged).
- A checkpoint is verified when restored: orbax's own checks, then the checksums. A
  damaged one is reported (which items, arrays and files), moved to
  <workdir>/damaged_checkpoints/, and the newest good one before it is resumed.
- A run never writes into a directory that holds another run's checkpoints unless asked
  to resume; it never resumes a different model, nor, unless allowed, one trained on
  another data or objective config (the differences are listed).
- A checkpoint named by a later one's `kept_step` metric (the last one saved before a
  stretch of non-finite steps, see train/skips.py) is kept out of the keep-N rotation.
- A save that fails (a full disk) is a CheckpointError naming the checkpoints still
  intact.
"""
from __future__ import annotations

import json
import logging
import os
import time

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers

from encoderx import errors
from encoderx import checksum
from encoderx import config as config_lib
from encoderx import distributed
from encoderx import files as files_lib

logger = logging.getLogger("encoderx")

ITEMS = ("state", "data", "model", "data_per_process", "checksums")
# The description's part that --allow_config_change lets a resumed run change.
TRAINING = "training"
DAMAGED_DIRECTORY = "damaged_checkpoints"
# Checkpoint metric: a step that this checkpoint keeps out of rotation.
KEPT_STEP = "kept_step"


# What orbax and tensorstore raise when a checkpoint cannot be written (tensorstore
# reports a full disk as a ValueError "RESOURCE_EXHAUSTED ... No space left on device").
_WRITE_ERRORS = (OSError, ValueError, RuntimeError)


def _grain_checkpoint():
  """grain's checkpoint handlers, imported where positions are saved or read: the
  accelerator bench (launch/gpu_bench.py) builds train steps on hosts without grain."""
  import grain.checkpoint  # pylint: disable=g-import-not-at-top
  return grain.checkpoint


class CheckpointError(errors.UserError, RuntimeError):
  """A checkpoint directory that this run must not use as asked, or cannot use."""


class NothingToResume(CheckpointError):
  """A run to resume whose work directory holds no checkpoint."""
  argument, remedy = "resume", "allow_fresh_start"


class _Damaged(Exception):
  """A checkpoint that cannot be read, or that reads back other than it was written."""


def _on_every_process(read):
  """read()'s result; or, when it raised _Damaged on any process, _Damaged on every one
  (naming the processes that failed): a checkpoint that one process cannot read is damaged
  for all of them, so that they all go on with the same step and meet at the same
  collectives. Every process must call it at the same point."""
  problem = result = None
  try:
    result = read()
  except _Damaged as error:
    problem = str(error)
  reports = distributed.exchange(problem)
  failed = [index for index, report in enumerate(reports) if report is not None]
  if not failed:
    return result
  if len(reports) == 1:
    raise _Damaged(problem)
  raise _Damaged("; ".join(f"process {index} of {len(reports)}: {reports[index]}"
                           for index in failed))


def _differences(stored: dict, current: dict, prefix: str = "",
                 absent=lambda path: "<absent>") -> list[str]:
  """'path: checkpoint A, this run B' for each field that differs; `absent(path)` is
  what a field missing on one side stands for."""
  lines = []
  for key in sorted(set(stored) | set(current)):
    path = f"{prefix}{key}"
    a = stored[key] if key in stored else absent(path)
    b = current[key] if key in current else absent(path)
    if isinstance(a, dict) and isinstance(b, dict):
      lines += _differences(a, b, f"{path}.", absent)
    elif a != b:
      lines.append(f"{path}: checkpoint {a!r}, this run {b!r}")
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


def _default_value(path: str):
  """A training description leaves out fields at their defaults (config.changed_fields):
  the default of 'section.field...'."""
  node = config_lib.default_config()
  for part in path.split("."):
    if part not in node:
      return "<absent>"
    node = node[part]
  return _as_stored(node.to_dict() if hasattr(node, "to_dict") else node)


def _as_stored(value):
  """`value` as it reads back from JSON (tuples become lists)."""
  if isinstance(value, dict):
    return {k: _as_stored(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_as_stored(v) for v in value]
  return value


def _reason(error: BaseException) -> str:
  """The first line of an error from orbax or tensorstore, for a one-line report."""
  lines = [line.strip() for line in str(error).splitlines() if line.strip()]
  return f"{type(error).__name__}: {lines[0] if lines else ''}"[:400]


def _listing(paths: list[str], most: int = 5) -> str:
  shown = ", ".join(paths[:most])
  return shown + (f" and {len(paths) - most} more" if len(paths) > most else "")


def _missing_array_files(directory: str) -> list[str]:
  """The files of the arrays' OCDBT database (orbax's store, `directory`) that its index
  names but that are missing or shorter than the index says, found from the index alone
  (B-tree nodes, no array data). Checked before restoring: orbax's restore stops at the
  first array it cannot read and abandons the reads still in flight, whose coroutines
  each print an "Exception ignored ... Traceback" block with a TensorStore spec when they
  are collected (tens of them). A checkpoint without an OCDBT manifest (or whose index
  itself does not read) is left to the restore."""
  import tensorstore as ts  # pylint: disable=g-import-not-at-top
  root = files_lib.path(directory)
  if not (root / "manifest.ocdbt").exists():
    return []
  url = str(root) if files_lib.is_remote(directory) else root.resolve().as_uri()
  missing, sizes = [], {}

  def readable(location: str) -> bool:
    """'btreenode:BASE:d/NAME:OFFSET:LENGTH' (or 'value:...'): its bytes are there."""
    prefix, offset, length = location.rsplit(":", 2)
    _, base, name = prefix.split(":", 2)
    relative = base + name
    if relative not in sizes:
      file = root / relative
      sizes[relative] = file.stat().length if file.exists() else -1
    if sizes[relative] < int(offset) + int(length):
      if relative not in missing:
        missing.append(relative)
      return False
    return True

  try:
    store = ts.KvStore.open(url.rstrip("/") + "/").result()
    version = ts.ocdbt.dump(store).result()["versions"][-1]
    nodes = [version["root"]["location"]] if "location" in version["root"] else []
    while nodes:
      location = nodes.pop()
      if not readable(location):
        continue
      for entry in ts.ocdbt.dump(store, location).result()["entries"]:
        for value in entry.values():
          if isinstance(value, str) and value.startswith("btreenode:"):
            nodes.append(value)
          elif isinstance(value, str) and value.startswith("value:"):
            readable(value)
  except (ValueError, KeyError, OSError) as error:  # an index that does not read
    logger.debug("OCDBT index of %s not checked: %s", directory, _reason(error))
    return []
  return missing


class _KeepMarked(checkpoint_managers.PreservationPolicy):
  """Keeps every checkpoint that some checkpoint's KEPT_STEP metric names."""

  def should_preserve(self, checkpoints, *, context):
    del context
    kept = {int(info.metrics[KEPT_STEP]) for info in checkpoints
            if info.metrics and info.metrics.get(KEPT_STEP) is not None}
    return [info.step in kept for info in checkpoints]


def has_checkpoints(directory: str) -> bool:
  """Whether `directory` holds a finished checkpoint (damaged or not)."""
  return files_lib.path(directory).is_dir() and bool(
      ocp.path.step.standard_name_format().find_all(directory))


class Checkpoints:
  """The checkpoints of one run directory."""

  def __init__(self, directory: str, keep: int = 3, async_save: bool = True,
               read_only: bool = False):
    self.directory = str(files_lib.path(directory))  # orbax takes gs:// itself
    self.read_only = read_only  # never saves, nor moves a damaged checkpoint aside
    self._requested = []  # steps asked to be saved, in order
    policy = checkpoint_managers.AnyPreservationPolicy(
        [checkpoint_managers.LatestN(n=keep), _KeepMarked()])
    self.manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(
            create=not read_only, preservation_policy=policy,
            enable_async_checkpointing=async_save),
        item_names=ITEMS)

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def remove_unfinished(self) -> None:
    """Removes the temporary directories of saves that never finished (a crash or a
    kill mid-save). Only for the run that holds the work directory's lock: another
    run's save in progress looks the same."""
    unfinished = [str(p.get()) for p in ocp.path.step.all_temporary_paths(self.directory)]
    for path in unfinished:
      files_lib.path(path).rmtree(missing_ok=True)
    if unfinished:
      logger.warning("removed %d unfinished checkpoint(s) left by a run that stopped while "
                     "saving: %s", len(unfinished), ", ".join(unfinished))

  # --- starting a run ---------------------------------------------------------------------
  def refuse_new_run(self, description: dict) -> None:
    """Raises CheckpointError: a run that was not asked to resume must not write here."""
    step = self.latest_step()
    try:
      stored = self._json_items(step)["model"]
    except _Damaged:
      stored = None
    if stored is not None:
      self._check_model(step, stored, description)
    raise CheckpointError(
        f"{self.directory} already holds checkpoints of this model (latest step "
        f"{step}). Pass --resume to continue that run, or choose a new work "
        "directory; encoderx does not overwrite a run's checkpoints.")

  def _check_model(self, step: int, stored: dict, description: dict) -> None:
    # An older checkpoint's model fields are flat (model.local_attention): migrated.
    model = config_lib.migrate_fields({k: v for k, v in stored.items() if k != TRAINING})
    current = {k: v for k, v in _as_stored(description).items() if k != TRAINING}
    differences = _differences(model, current)
    if differences:
      raise CheckpointError(
          f"{self.directory} holds checkpoints (latest step {step}) of a different model "
          f"than this config describes: {'; '.join(differences)}. Use another work "
          "directory, or the config that made those checkpoints.")

  def _check_training(self, step: int, stored: dict, description: dict,
                      allow_change: bool) -> None:
    if TRAINING not in description:
      return  # e.g. predictions: only the model matters
    if TRAINING not in stored:
      logger.warning("checkpoint %d does not record its data and objective config (written "
                     "by an older encoderx); resuming without comparing them.", step)
      return
    differences = _differences(config_lib.migrate_fields(stored[TRAINING]),
                               _as_stored(description[TRAINING]), absent=_default_value)
    if not differences:
      return
    if not allow_change:
      raise CheckpointError(
          f"the checkpoint of step {step} in {self.directory} was trained on another "
          f"config: {'; '.join(differences)}. Resume with the config that made it, or "
          "pass --allow_config_change to continue with this one.")
    logger.warning("resuming step %d with a changed config (--allow_config_change): %s",
                   step, "; ".join(differences))

  def restore_latest(self, abstract_state, description: dict, allow_config_change=False):
    """(step, state, data position, kept step or None) of the newest checkpoint that
    verifies, for `--resume`. Damaged newer checkpoints are reported and moved aside;
    raises CheckpointError for another model or config, or when none verifies."""
    damaged = []
    for step in sorted(self.manager.all_steps(), reverse=True):
      try:
        items = _on_every_process(lambda: self._json_items(step))
        self._check_model(step, items["model"], description)
        self._check_training(step, items["model"], description, allow_config_change)
        state = _on_every_process(lambda: self._read_state(step, abstract_state))
        self._verify_state(step, state, items.get("checksums"))
      except _Damaged as error:
        logger.warning("checkpoint %d is damaged: %s", step, error)
        damaged.append((step, str(error)))
        continue
      if damaged and not self.read_only:
        self._move_aside([s for s, _ in damaged])
        logger.warning("using step %d, the newest checkpoint that verifies (the newer "
                       "damaged ones were moved to %s)", step, self._damaged_directory())
      metrics = self.manager.metrics(step) or {}
      return step, state, self._own_position(step, items["data"]), metrics.get(KEPT_STEP)
    raise CheckpointError(
        f"no checkpoint in {self.directory} can be resumed; every one is damaged: "
        + "; ".join(f"step {s}: {problem}" for s, problem in damaged)
        + ". Start a new run in another work directory (or --init_from one of them with "
        "a checkpoint that reads).")

  # --- reading and verifying ----------------------------------------------------------------
  def _step_directory(self, step: int) -> str:
    return os.path.join(self.directory, str(step))

  def _json_items(self, step: int) -> dict:
    """{'data', 'model', 'checksums' (None for checkpoints from before checksums)},
    verified against the checksums."""
    checksums = files_lib.path(self._step_directory(step)) / "checksums"
    names = ("data", "model") + (("checksums",) if checksums.is_dir() else ())
    try:
      items = dict(self.manager.restore(step, args=ocp.args.Composite(
          **{name: ocp.args.JsonRestore() for name in names})))
    except Exception as error:  # pylint: disable=broad-except
      raise _Damaged(f"its JSON items ({', '.join(names)}) cannot be read "
                     f"({_reason(error)})") from None
    stored = items.setdefault("checksums", None)
    if stored is not None:
      wrong = [name for name in ("data", "model")
               if stored.get(name) != checksum.json_item(items[name])]
      if wrong:
        raise _Damaged("items " + ", ".join(
            os.path.join(self._step_directory(step), name) for name in wrong)
            + " differ from their checksums at save")
    return items

  def _read_state(self, step: int, abstract_state):
    state_directory = os.path.join(self._step_directory(step), "state")
    missing = _missing_array_files(state_directory)
    if missing:
      raise _Damaged(f"{state_directory} cannot be read: its array files "
                     f"{_listing(missing)} are missing or cut short")
    try:
      return self.manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract_state)))["state"]
    except Exception as error:  # pylint: disable=broad-except
      raise _Damaged(f"{os.path.join(self._step_directory(step), 'state')} cannot be "
                     f"read: {_reason(error)} (a damaged file, or a checkpoint of another "
                     "encoderx version)") from None

  def _verify_state(self, step: int, state, stored_checksums: dict | None) -> None:
    """Raises _Damaged unless `state` matches its checksums at save. The checksums are of
    the global arrays (one collective), so every process gets the same answer."""
    if stored_checksums is not None:
      wrong = checksum.differences(stored_checksums["state"], checksum.arrays(state))
      if wrong:
        raise _Damaged(
            f"{len(wrong)} array(s) of {os.path.join(self._step_directory(step), 'state')} "
            f"differ from their checksums at save: {_listing(wrong)}")

  def _own_position(self, step: int, position: dict) -> dict:
    """This process's data position at `step`; checkpoints written before positions were
    kept per process give process 0's (`position`)."""
    if not (files_lib.path(self._step_directory(step)) / "data_per_process").is_dir():
      return position
    own = _ProcessPosition()
    self.manager.restore(step, args=ocp.args.Composite(
        data_per_process=_grain_checkpoint().CheckpointRestore(own)))
    return own.position

  def _damaged_directory(self) -> str:
    return os.path.join(os.path.dirname(self.directory), DAMAGED_DIRECTORY)

  def _move_aside(self, steps: list[int]) -> None:
    """Damaged checkpoints go where orbax no longer sees them (a resumed run will save
    those steps again), and nothing is deleted. Process 0 moves them (the checkpoints are
    shared); the others wait for it, and all fail if it could not."""
    problem = None
    if jax.process_index() == 0:
      damaged = files_lib.path(self._damaged_directory())
      stamp = time.strftime("%Y%m%d-%H%M%S")
      try:
        damaged.mkdir(parents=True, exist_ok=True)
        for step in steps:
          files_lib.path(self._step_directory(step)).rename(damaged / f"{step}-{stamp}")
      except OSError as error:
        problem = (f"damaged checkpoints (steps {', '.join(map(str, steps))}) could not be "
                   f"moved from {self.directory} to {damaged}: {_reason(error)}. Move them "
                   "yourself and resume again.")
    problem = distributed.exchange(problem)[0]
    if problem is not None:
      raise CheckpointError(problem)
    self.manager.reload()

  # --- writing ------------------------------------------------------------------------------
  def save(self, step: int, state, data_position: dict, description: dict,
           kept_step: int | None = None) -> None:
    """Saves (asynchronously, if so configured) with checksums of everything saved.
    `kept_step` keeps that earlier checkpoint out of rotation."""
    sums = {"state": checksum.arrays(state), "data": checksum.json_item(data_position),
            "model": checksum.json_item(description)}
    try:
      self.manager.save(step, args=ocp.args.Composite(
          state=ocp.args.StandardSave(state),
          data=ocp.args.JsonSave(data_position),
          data_per_process=_grain_checkpoint().CheckpointSave(_ProcessPosition(data_position)),
          model=ocp.args.JsonSave(description),
          checksums=ocp.args.JsonSave(sums)),
          metrics=None if kept_step is None else {KEPT_STEP: kept_step})
    except _WRITE_ERRORS as error:
      raise self._write_error(step, error) from None
    self._requested.append(step)

  def _write_error(self, step: int | None, error: Exception) -> CheckpointError:
    """A failed save, named with the steps that failed (an asynchronous save fails at the
    next save or at close) and those still intact."""
    finished = set(self.manager.all_steps())
    failed = sorted({s for s in self._requested[-1:] + [step] if s is not None}
                    - finished)
    reason = ("No space left on device (the disk is full)"
              if "No space left on device" in str(error) else _reason(error))
    return CheckpointError(
        f"could not write the checkpoint of step {', '.join(map(str, failed)) or '?'} in "
        f"{self.directory}: {reason}. The earlier checkpoints are intact (steps "
        f"{', '.join(map(str, sorted(finished))) or 'none'}); free space (or fix the disk) "
        "and continue with --resume.")

  def close(self) -> None:
    try:
      self.manager.wait_until_finished()
    except _WRITE_ERRORS as error:
      raise self._write_error(None, error) from None
    finally:
      self.manager.close()


class BestCheckpoint:
  """The parameters (and method state) of the run's best evaluation by one metric, in
  their own directory (`best/`), one checkpoint kept."""

  def __init__(self, directory: str, metric: str, mode: str = "max"):
    self.metric = metric
    self.manager = ocp.CheckpointManager(
        str(files_lib.path(directory)),
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
                          best_metric: str = "", best_mode: str = "max",
                          weights=lambda state: state.params):
  """(params, method state) of a run for predictions: its best checkpoint by
  `best_metric` (best/) if it kept one, else `weights(state)` of its latest that
  verifies; the model must be the one `description` describes (its data and objective
  config may differ)."""
  if best_metric and files_lib.path(workdir).joinpath("best").is_dir():
    best = BestCheckpoint(os.path.join(workdir, "best"), best_metric, best_mode)
    try:
      if best.best_step() is not None:
        params, method_state, _ = best.restore(best.best_step(), abstract_state)
        return params, method_state
    finally:
      best.close()
  directory = os.path.join(workdir, "checkpoints")
  if not has_checkpoints(directory):
    raise CheckpointError(f"{workdir} holds no checkpoint to predict with; train first "
                          "(the same command without --predict).")
  checkpoints = Checkpoints(directory, read_only=True)
  try:
    model_only = {k: v for k, v in description.items() if k != TRAINING}
    _, state, _, _ = checkpoints.restore_latest(abstract_state, model_only)
    return weights(state), state.method_state
  finally:
    checkpoints.close()

"""The training loop, for every training method: `run`, `evaluate`, `predict`.

`run` trains as a config says in a work directory: config.json, TensorBoard metrics
(train/ and eval/ under tensorboard/), orbax checkpoints (checkpoints/) and, when
config.eval.best_metric is set, the parameters of the best evaluation (best/). It shows a
progress bar, saves a checkpoint and returns at the next step boundary when SIGINT or
SIGTERM asks it to stop (train/stop.py), continues exactly where it stopped with
`resume=True`, and ends with a held-out evaluation. The command line is
encoderx/train/__main__.py.
"""
from __future__ import annotations

import contextlib
import itertools
import logging
import os
from typing import Iterator

import jax
import ml_collections
import numpy as np
import seqio
from tqdm.auto import tqdm

from encoderx import errors
from encoderx import checkpoint as checkpoint_lib
from encoderx import distributed
from encoderx import files as files_lib
from encoderx import host_allocator
from encoderx import initialize
from encoderx.train import trainer as trainer_lib
from encoderx import workdir as workdir_lib
from encoderx.data import buckets, pipeline
from encoderx.train import feeding
from encoderx.train import memory
from encoderx.train import progress
from encoderx.train import skips as skips_lib
from encoderx.train import stop as stop_lib

logger = logging.getLogger("encoderx")

# Errors that come from what the user gave: every process of a run agrees on them
# (distributed.agreement) and the command line prints them in one line.
USER_ERRORS = (errors.UserError,)


def _length(batch: dict, default: int) -> int:
  """The length axis of a batch's input_ids (`default` without them)."""
  return batch["input_ids"].shape[1] if "input_ids" in batch else default


def _joined(batches: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
  """Batches read in a stream's unit, as one (a batch-size warmup's larger steps)."""
  if len(batches) == 1:
    return batches[0]
  return {name: np.concatenate([b[name] for b in batches]) for name in batches[0]}


def _evaluation_batches(trainer: trainer_lib.Trainer, task: seqio.Task,
                        phase: trainer_lib.Phase) -> Iterator[dict[str, np.ndarray]]:
  """What an evaluation at `phase`'s length reads, before any cut to length buckets:
  `eval.batches` batches of the validation split (the same examples at every evaluation
  of a run), or, with eval.batches=0, every example of it once."""
  config = trainer.config
  batch_size = feeding.local_batch_size(config, trainer.evaluation_batch_size(phase.seq_length))
  batches = pipeline.evaluation_batches(
      task, "validation", phase.seq_length, batch_size, count=config.eval.batches,
      seed=config.train.seed, shard_info=feeding.shard_info(config))
  if not config.eval.batches:  # each process's shard has its own number of batches
    batches = _padded_to_every_process(batches, lambda: next(pipeline.whole_split(
        task, "validation", phase.seq_length, batch_size, config.train.seed)))
  return batches


def _evaluation_key(config) -> jax.Array:
  """The key of an evaluation's first batch (batch i: fold_in(key, i)), e.g. its masks."""
  return jax.random.key(config.train.seed + 1)


def evaluate(trainer: trainer_lib.Trainer, task: seqio.Task, state,
             phase: trainer_lib.Phase) -> dict[str, float]:
  """The method's held-out metrics over the batches of _evaluation_batches (the same
  examples and masks at every evaluation of a run)."""
  config = trainer.config
  # Cut to finetune.length_buckets after the padding to every process (one process only).
  batches = (buckets.cut(batch, config.finetune.length_buckets, phase.seq_length)
             for batch in _evaluation_batches(trainer, task, phase))
  evaluate_step = trainer.evaluate_step(phase.index)
  key = _evaluation_key(config)
  weights = trainer.weights(state)
  outputs = [evaluate_step(weights, state.method_state, feeding.device_batch(trainer, batch),
                           jax.random.fold_in(key, index))
             for index, batch in enumerate(batches)]
  return trainer.methods[phase.index].summarize_evaluation(jax.device_get(outputs))


def _compile_evaluations(trainer: trainer_lib.Trainer, task: seqio.Task, state) -> None:
  """Compiles, before the first train step, the evaluation step of each length the run
  evaluates at (the last phase's; with eval.every_steps every phase's) for its first
  batch, at full length, logs XLA's figures and stops in one line where one does not fit
  in device memory beside the train state (train/memory.py)."""
  config = trainer.config
  evaluated = trainer.phases if config.eval.every_steps else trainer.phases[-1:]
  by_length = {phase.seq_length: phase for phase in evaluated}  # the last of each length
  weights = trainer.weights(state)
  for length, phase in by_length.items():
    batches = _evaluation_batches(trainer, task, phase)
    try:
      first = next(batches, None)
    finally:
      batches.close()
    if first is None:  # an empty split: nothing to evaluate, nothing to compile
      continue
    batch = feeding.device_batch(trainer, first)
    rows = trainer.evaluation_batch_size(length)
    _, cost = trainer.compile_evaluate_step(
        weights, state.method_state, batch, jax.random.fold_in(_evaluation_key(config), 0),
        phase.index)
    logger.info("evaluation step at length %d, batch %d %s", length, rows,
                cost.describe("weights, batch"))
    memory.check_evaluation_step(trainer, cost, state, weights, rows, length)


def _padded_to_every_process(batches, split_batch) -> Iterator[dict[str, np.ndarray]]:
  """A whole split's `batches` (this process's shard of it), then batches of padding
  rows (zeros, `example_weight` 0.0) for as long as another process has batches left:
  every process runs the same evaluation steps, the most any of them needs (one
  all-gather per batch; one process: `batches` as they are). `split_batch()` gives a
  batch of the split, the padding's shape when this process's shard is empty."""
  last = None
  for batch in itertools.chain(batches, itertools.repeat(None)):
    if not distributed.any_process(batch is not None):
      return
    if batch is None:
      batch = {name: np.zeros_like(value)
               for name, value in (last if last is not None else split_batch()).items()}
    last = batch
    yield batch


def _write_config(config, workdir: str) -> None:
  files_lib.write_atomically(os.path.join(workdir, "config.json"),
                             config.to_json_best_effort(indent=2))


def run(config: ml_collections.ConfigDict, workdir: str, resume: bool = False,
        stop_at_step: int | None = None, show_progress: bool = True,
        devices=None, allow_config_change: bool = False,
        allow_fresh_start: bool = False, progress_label: str = "") -> dict:
  """Trains as `config` says (its method, data and schedule), in `workdir`.

  `stop_at_step` stops there as a preemption would (checkpoint saved, no evaluation),
  to be continued with `resume=True`, which refuses a work directory without checkpoints
  unless `allow_fresh_start`, and a checkpoint trained on another data or objective
  config unless `allow_config_change`. `devices` (default: all) form the mesh;
  `progress_label` names the progress bar (default: the method's name).
  Returns {'history': [{'step', 'loss', ...}, ...] (one per log interval),
  'eval': {...held-out metrics...}, 'step': last step, 'stopped': bool,
  'params': the trained parameters, 'method_state': the method's state}.
  With several processes, every user error before the first step fails on every
  process with the same message (distributed.agreement), checked in phases: the config,
  data and work directory; the checkpoint restored (or refused); the first batch.
  """
  with contextlib.ExitStack() as held:
    with distributed.agreement(USER_ERRORS):
      init = initialize.resolve(config)  # what the run takes from config.init_from
      config = init.config
      trainer = trainer_lib.Trainer(config, devices=devices)
      for field in trainer.method.host_batch_fields():
        if jax.process_count() > 1:  # each process would reshape its own rows its own way
          errors.fail(field, "reshapes the batches of one process only; this run has "
                      f"{jax.process_count()}.", "Turn it off (() or False).")
      checkpoint_dir = os.path.join(str(files_lib.path(workdir)), "checkpoints")
      if (resume and not allow_fresh_start
          and not checkpoint_lib.has_checkpoints(checkpoint_dir)):
        raise checkpoint_lib.NothingToResume(
            f"{files_lib.path(workdir)} holds no checkpoint to resume. Check the path; to "
            "start a new run where there is none (a launch script that always resumes), "
            "allow a fresh start.")
      # The data before the work directory: bad data stops a run that has written nothing.
      trainer.method.check_data()
      task = trainer.method.task()
      workdir = workdir_lib.prepare(workdir)
      if jax.process_index() == 0:
        held.enter_context(workdir_lib.Lock(workdir))
    return _run_in(trainer, init, task, workdir, resume, stop_at_step, show_progress,
                   allow_config_change, progress_label)


def _latest_step(checkpoints: checkpoint_lib.Checkpoints) -> int | None:
  """The newest checkpoint's step, which every process must see the same."""
  steps = distributed.exchange(checkpoints.latest_step())
  if len(set(steps)) > 1:
    seen = ", ".join(f"process {i}: {'none' if s is None else f'step {s}'}"
                     for i, s in enumerate(steps))
    raise checkpoint_lib.CheckpointError(
        f"the processes see different checkpoints in {checkpoints.directory} ({seen}). "
        "Every worker must see the same work directory: a gs:// bucket or a shared file "
        "system, not each its own disk.")
  return steps[0]


def _run_in(trainer: trainer_lib.Trainer, init: initialize.InitSource, task: seqio.Task,
            workdir: str, resume: bool, stop_at_step: int | None, show_progress: bool,
            allow_config_change: bool, progress_label: str = "") -> dict:
  """run() in a work directory that this run has locked, its data checked."""
  from clu import metric_writers  # pylint: disable=g-import-not-at-top

  config = trainer.config
  description = trainer.describe()
  checkpoints = checkpoint_lib.Checkpoints(os.path.join(workdir, "checkpoints"),
                                           keep=config.checkpoint.keep,
                                           async_save=config.checkpoint.async_save)
  best = None
  if config.eval.best_metric:
    best = checkpoint_lib.BestCheckpoint(os.path.join(workdir, "best"),
                                         config.eval.best_metric, config.eval.best_mode)
  if jax.process_index() == 0:
    checkpoints.remove_unfinished()
    host_allocator.warn_if_slow_for(jax.default_backend())
  stop = stop_lib.StopRequest()
  history, eval_metrics, position = [], {}, {}
  try:
    start_step = kept_step = None
    latest = _latest_step(checkpoints)
    # Restoring reads the shared checkpoint with collectives: it fails on every process
    # or on none, and the processes agree on the message.
    with distributed.agreement(USER_ERRORS):
      if latest is None:
        state = initialize.initial_state(trainer, init)
        logger.info("starting a new run in %s%s", workdir,
                    " (none to resume there: a fresh start, as allowed)" if resume else "")
      elif not resume:
        checkpoints.refuse_new_run(description)
      else:
        start_step, state, position, kept_step = checkpoints.restore_latest(
            trainer.abstract_state_with_shardings(), description, allow_config_change)
        logger.info("resuming %s from step %d", workdir, start_step)
    skips = skips_lib.SkipWatch(trainer, state, start_step, kept_step)
    if jax.process_index() == 0:
      _write_config(config, workdir)
    writer = metric_writers.create_default_writer(
        os.path.join(workdir, "tensorboard"), just_logging=jax.process_index() > 0,
        asynchronous=True)

    def save(step, state, position):
      checkpoints.save(step, state, position, description,
                       kept_step=skips.before_save(state, step))

    def evaluate_and_log(state, phase, step) -> dict:
      metrics = evaluate(trainer, task, state, phase)
      writer.write_scalars(step, {f"eval/{k}": v for k, v in metrics.items()})
      if best is not None:
        best.save(step, state.replace(params=trainer.weights(state)), metrics)
      return metrics

    step = int(state.step)
    with stop.installed(), tqdm(total=config.train.steps, initial=step, unit="step",
                                disable=not show_progress or jax.process_index() > 0,
                                desc=progress_label or config.method,
                                dynamic_ncols=True) as bar:
      batches = stream = None
      evaluations_compiled = False
      try:
        for phase in trainer.phases:
          if step >= phase.end:
            continue
          if phase.stream != stream:  # phases of one length continue one stream
            if batches is not None:
              batches.close()
              batches = None
            stream = phase.stream
            unit = trainer_lib.stream_unit(trainer.phases, stream)
            start = position if position.get("phase") == stream else None
            with distributed.agreement(USER_ERRORS):  # the data's errors, to the first batch
              batches = pipeline.batch_iterator(
                  task, "train", phase.seq_length, feeding.local_batch_size(config, unit),
                  seed=config.train.seed + 1000 * stream, shard_info=feeding.shard_info(config),
                  position=start, group_lengths=config.finetune.length_buckets
                  if config.finetune.group_by_length else ())
              feed = itertools.chain([next(batches)], batches)
          train_steps = {}  # by the batch's shapes: one, or one per length bucket
          meter = progress.Meter(phase.batch_size * phase.seq_length)
          while step < phase.end and not stop.stopping:
            batch = feeding.device_batch(trainer, feeding.host_batch(
                trainer, _joined([next(feed) for _ in range(phase.batch_size // unit)]),
                phase.seq_length, phase.index))
            shapes = buckets.shapes(batch)
            if shapes not in train_steps:  # compiled ahead of time, its cost logged
              train_steps[shapes], cost = trainer.compile_train_step(state, batch,
                                                                     phase.index)
              logger.info("train step at length %d, batch %d %s",
                          _length(batch, phase.seq_length), phase.batch_size,
                          cost.describe())
              # Before any step trains. Every process computes the same figures, so
              # each stops with the same error (no agreement: reading whole splits to
              # compile the evaluations enters collectives).
              memory.check_train_step(trainer, cost, phase.batch_size,
                                      _length(batch, phase.seq_length))
              if not evaluations_compiled:
                _compile_evaluations(trainer, task, state)
                evaluations_compiled = True
            state, metrics = train_steps[shapes](state, batch)
            step += 1
            bar.update(1)
            position = {"phase": stream, **batches.position.to_dict()}
            meter.add(metrics)
            log_step = meter.first or step % config.train.log_every == 0 or step == phase.end
            if log_step:
              means = meter.flush()
              writer.write_scalars(step, means)
              history.append({"step": step, **means})
              bar.set_postfix(progress.postfix(means))
              skips.check(state, step)
            if step == stop_at_step:
              stop.stopping = True
            stop.update(agree=log_step)
            if step % config.checkpoint.every_steps == 0 or step == config.train.steps:
              save(step, state, position)
            if (config.eval.every_steps and step % config.eval.every_steps == 0
                and step < config.train.steps):
              evaluation = evaluate_and_log(state, phase, step)  # main() prints the last
              logger.info("evaluation at step %d: %s", step, progress.format_metrics(evaluation))
          if stop.stopping:
            break
      finally:
        if batches is not None:
          batches.close()
      if stop.stopping and checkpoints.latest_step() != step:
        save(step, state, position)

    if not stop.stopping:
      eval_metrics = evaluate_and_log(state, trainer.phases[-1], step)
    writer.flush()
  finally:
    checkpoints.close()
    if best is not None:
      best.close()
  return {"history": history, "eval": eval_metrics, "step": step,
          "stopped": stop.stopping, "params": trainer.weights(state),
          "method_state": state.method_state}


def predict(config: ml_collections.ConfigDict, workdir: str, input_path: str,
            output_path: str = "", devices=None) -> tuple[int, str]:
  """Writes the predictions of the run in `workdir` (its best checkpoint, else its
  latest) for the examples of `input_path` to `output_path` (default: the method's
  prediction file in `workdir`); returns their number and the path.

  With several processes, every process reads the whole file in global batches and
  feeds the rows its devices hold (the files to predict are small): all run the same
  steps, and the predictions come back each row once, in input order.
  """
  with distributed.agreement(USER_ERRORS):
    config = initialize.resolve_config(config)
    trainer = trainer_lib.Trainer(config, devices=devices)
    workdir = str(files_lib.path(workdir))
    rows, batches = trainer.method.prediction_batches(
        input_path, trainer.evaluation_batch_size(config.data.seq_length))
  with distributed.agreement(USER_ERRORS):  # see run(): fails on every process or none
    params, method_state = checkpoint_lib.restore_for_inference(
        workdir, trainer.describe(), trainer.abstract_state_with_shardings(),
        config.eval.best_metric, config.eval.best_mode, trainer.weights)
  predict_step = trainer.predict_step()
  outputs = [jax.device_get(predict_step(params, method_state,
                                         feeding.device_batch(trainer, b, whole=True)))
             for b in batches]
  predictions = {name: np.concatenate([o[name] for o in outputs])[:len(rows)]
                 for name in outputs[0]} if outputs else {}
  output_path = output_path or os.path.join(workdir, trainer.method.prediction_file)
  return trainer.method.write_predictions(rows, predictions, output_path), output_path

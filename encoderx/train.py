"""The training loop and its command line, for every training method.

    python -m encoderx.train --config=configs/bert_tiny.py --workdir=runs/tiny \
        [--config.train.steps=200] [--resume] [--init_from=RUN_DIR | hf:HF_DIR] \
        [--predict=FILE [--predict_output=FILE]]
    python -m encoderx.train --gin_file=configs/gin/bert_tiny.gin --workdir=runs/tiny \
        [--gin_bindings='train.steps = 200']   (the same schema in gin: gin_config.py)

Writes to the work directory: config.json, TensorBoard metrics (train/ and eval/ under
tensorboard/), orbax checkpoints (checkpoints/) and, when config.eval.best_metric is set,
the parameters of the best evaluation (best/). Progress is a bar with step, loss, the
method's accuracies and tokens/s; the run ends with a held-out evaluation.

SIGINT (Ctrl-C) or SIGTERM (preemption) stops the run at the next step boundary after
saving a checkpoint (a run of several processes: all of them, at the next log step, after
a signal to any one); `--resume` continues it exactly where it stopped.
"""
from __future__ import annotations

import contextlib
import itertools
import logging
import os
import signal
import sys
import threading
import time
from typing import Iterator

import jax
import ml_collections
import numpy as np
import seqio
from tqdm.auto import tqdm

from encoderx import errors
from encoderx import checkpoint as checkpoint_lib
from encoderx import config as config_lib
from encoderx import distributed
from encoderx import files as files_lib
from encoderx import host_allocator
from encoderx import initialize
from encoderx import trainer as trainer_lib
from encoderx import workdir as workdir_lib
from encoderx.data import corpus, labelled, pipeline, vocabulary

logger = logging.getLogger("encoderx")

# Errors that come from what the user gave: the command line prints their message, not a
# traceback (encoderx/errors.py).
USER_ERRORS = (errors.UserError,)


class _StopRequest:
  """Set by SIGINT/SIGTERM; the loop saves a checkpoint and returns at the next step.

  With several processes a signal may reach only one of them (SIGTERM to one worker):
  they agree at the steps where the host waits for the device anyway (the log steps,
  the same steps on every process), and all stop after the first of those at or after
  the request, with one checkpoint saved together.
  """

  def __init__(self):
    self.requested = False  # this process was asked to stop
    self.stopping = False  # the run stops after this step (the same on every process)

  def update(self, agree: bool) -> bool:
    """Whether the run stops after this step; `agree`: every process checks now."""
    if jax.process_count() == 1:
      self.stopping = self.stopping or self.requested
    elif agree and not self.stopping:
      self.stopping = distributed.any_process(self.requested)
    return self.stopping

  @contextlib.contextmanager
  def installed(self):
    if threading.current_thread() is not threading.main_thread():
      yield
      return
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def handle(signum, frame):
      if self.requested:  # a second Ctrl-C stops at once
        previous[signal.SIGINT](signum, frame)
      self.requested = True
      logger.warning("stop requested: saving a checkpoint at the end of this step%s",
                     " (the next log step, with the other processes)"
                     if jax.process_count() > 1 else "")

    for sig in previous:
      signal.signal(sig, handle)
    try:
      yield
    finally:
      for sig, handler in previous.items():
        signal.signal(sig, handler)


def _by_rows(config) -> bool:
  """data.process_split=rows: every process reads the whole global stream."""
  return config.data.process_split == "rows" and jax.process_count() > 1


def _shard_info(config) -> seqio.ShardInfo | None:
  if jax.process_count() == 1 or _by_rows(config):
    return None
  return seqio.ShardInfo(index=jax.process_index(), num_shards=jax.process_count())


def _local_batch_size(config, global_batch: int) -> int:
  """The batch size this process's iterator yields (rows mode: the global one)."""
  if global_batch % jax.process_count():
    raise errors.ConfigError(
        f"batch size {global_batch} is not divisible by the {jax.process_count()} hosts.")
  return global_batch if _by_rows(config) else global_batch // jax.process_count()


def _device_batch(trainer: trainer_lib.Trainer, batch: dict[str, np.ndarray],
                  whole: bool = False):
  """This process's batch as global arrays; in rows mode, or with `whole`, `batch` is the
  global batch, of which this process keeps the rows its devices hold."""
  if whole or _by_rows(trainer.config):
    rows = trainer.process_rows(len(next(iter(batch.values()))))
    batch = {name: value[rows] for name, value in batch.items()}
  return trainer.device_batch(batch)


def evaluate(trainer: trainer_lib.Trainer, task: seqio.Task, state,
             phase: trainer_lib.Phase) -> dict[str, float]:
  """The method's held-out metrics: over `eval.batches` batches of the validation split
  (the same examples and masks at every evaluation of a run), or, with eval.batches=0,
  over every example of it once."""
  config = trainer.config
  batch_size = _local_batch_size(config, config.eval.batch_size)
  batches = pipeline.evaluation_batches(
      task, "validation", phase.seq_length, batch_size, count=config.eval.batches,
      seed=config.train.seed, shard_info=_shard_info(config))
  if not config.eval.batches:  # each process's shard has its own number of batches
    batches = _padded_to_every_process(batches, lambda: next(pipeline.whole_split(
        task, "validation", phase.seq_length, batch_size, config.train.seed)))
  evaluate_step = trainer.evaluate_step(phase.index)
  key = jax.random.key(config.train.seed + 1)
  outputs = [evaluate_step(state.params, state.method_state, _device_batch(trainer, batch),
                           jax.random.fold_in(key, index))
             for index, batch in enumerate(batches)]
  return trainer.methods[phase.index].summarize_evaluation(jax.device_get(outputs))


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


class _Meter:
  """Means of the step metrics since the last flush, and tokens/s over those steps.

  The first interval of a phase is its first step alone, which includes compilation:
  it is reported (the baseline that learning is measured from) without a speed.
  """

  def __init__(self, tokens_per_step: int):
    self.tokens_per_step = tokens_per_step
    self.first = True
    self.pending = []
    self.since = time.perf_counter()

  def add(self, metrics: dict) -> None:
    self.pending.append(metrics)

  def flush(self) -> dict:
    values = jax.device_get(self.pending)
    means = {k: float(np.mean([v[k] for v in values])) for k in values[0]}
    now = time.perf_counter()
    if not self.first:
      means["tokens_per_second"] = self.tokens_per_step * len(values) / (now - self.since)
    self.first, self.pending, self.since = False, [], now
    return means


def _postfix(metrics: dict) -> dict:
  """The progress bar's fields: the loss, every accuracy the method reports, tokens/s."""
  shown = {"loss": f"{metrics['loss']:.3f}"}
  for name, value in metrics.items():
    if name.endswith("accuracy"):
      shown[name.removesuffix("uracy")] = f"{value:.3f}"
  if "tokens_per_second" in metrics:
    shown["tok/s"] = f"{metrics['tokens_per_second']:,.0f}"
  return shown


class _SkipWatch:
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


def run(config: ml_collections.ConfigDict, workdir: str, resume: bool = False,
        stop_at_step: int | None = None, show_progress: bool = True,
        devices=None, allow_config_change: bool = False,
        allow_fresh_start: bool = False) -> dict:
  """Trains as `config` says (its method, data and schedule), in `workdir`.

  `stop_at_step` stops there as a preemption would (checkpoint saved, no evaluation),
  to be continued with `resume=True`, which refuses a work directory without checkpoints
  unless `allow_fresh_start`, and a checkpoint trained on another data or objective
  config unless `allow_config_change`. `devices` (default: all) form the mesh.
  Returns {'history': [{'step', 'loss', ...}, ...] (one per log interval),
  'eval': {...held-out metrics...}, 'step': last step, 'stopped': bool,
  'params': the trained parameters, 'method_state': the method's state}.
  With several processes, every user error before the first step fails on every
  process with the same message (distributed.agreement), checked in phases: the config,
  data and work directory; the checkpoint restored (or refused); the first batch.
  """
  with contextlib.ExitStack() as held:
    with distributed.agreement(USER_ERRORS):
      config = initialize.resolve_config(config)
      trainer = trainer_lib.Trainer(config, devices=devices)
      checkpoint_dir = os.path.join(str(files_lib.path(workdir)), "checkpoints")
      if (resume and not allow_fresh_start
          and not checkpoint_lib.has_checkpoints(checkpoint_dir)):
        raise checkpoint_lib.CheckpointError(
            f"--resume: {files_lib.path(workdir)} holds no checkpoint to resume. Check the "
            "path; to start a new run where there is none (a launch script that always "
            "passes --resume), add --allow_fresh_start.")
      workdir = workdir_lib.prepare(workdir)
      if jax.process_index() == 0:
        held.enter_context(workdir_lib.Lock(workdir))
      trainer.method.check_data()
      task = trainer.method.task()
    return _run_in(trainer, task, workdir, resume, stop_at_step, show_progress,
                   allow_config_change)


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


def _run_in(trainer: trainer_lib.Trainer, task: seqio.Task, workdir: str, resume: bool,
            stop_at_step: int | None, show_progress: bool, allow_config_change: bool) -> dict:
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
  stop = _StopRequest()
  history, eval_metrics, position = [], {}, {}
  try:
    start_step = kept_step = None
    latest = _latest_step(checkpoints)
    # Restoring reads the shared checkpoint with collectives: it fails on every process
    # or on none, and the processes agree on the message.
    with distributed.agreement(USER_ERRORS):
      if latest is None:
        state = initialize.initial_state(trainer)
        logger.info("starting a new run in %s%s", workdir,
                    " (--resume: no checkpoint there; --allow_fresh_start)" if resume else "")
      elif not resume:
        checkpoints.refuse_new_run(description)
      else:
        start_step, state, position, kept_step = checkpoints.restore_latest(
            trainer.abstract_state_with_shardings(), description, allow_config_change)
        logger.info("resuming %s from step %d", workdir, start_step)
    skips = _SkipWatch(trainer, state, start_step, kept_step)
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
        best.save(step, state, metrics)
      return metrics

    step = int(state.step)
    with stop.installed(), tqdm(total=config.train.steps, initial=step, unit="step",
                                disable=not show_progress or jax.process_index() > 0,
                                desc=config.method,
                                dynamic_ncols=True) as bar:
      for phase in trainer.phases:
        if step >= phase.end:
          continue
        start = position if position.get("phase") == phase.index else None
        batches = None
        try:
          with distributed.agreement(USER_ERRORS):  # the data's errors, to the first batch
            batches = pipeline.batch_iterator(
                task, "train", phase.seq_length,
                _local_batch_size(config, config.train.batch_size),
                seed=config.train.seed + 1000 * phase.index, shard_info=_shard_info(config),
                position=start)
            feed = itertools.chain([next(batches)], batches)
          train_step = None
          meter = _Meter(config.train.batch_size * phase.seq_length)
          while step < phase.end and not stop.stopping:
            batch = _device_batch(trainer, next(feed))
            if train_step is None:  # compiled ahead of time, its cost logged
              train_step, cost = trainer.compile_train_step(state, batch, phase.index)
              logger.info("train step at length %d %s", phase.seq_length, cost.describe())
            state, metrics = train_step(state, batch)
            step += 1
            bar.update(1)
            position = {"phase": phase.index, **batches.position.to_dict()}
            meter.add(metrics)
            log_step = meter.first or step % config.train.log_every == 0 or step == phase.end
            if log_step:
              means = meter.flush()
              writer.write_scalars(step, means)
              history.append({"step": step, **means})
              bar.set_postfix(_postfix(means))
              skips.check(state, step)
            if step == stop_at_step:
              stop.stopping = True
            stop.update(agree=log_step)
            if step % config.checkpoint.every_steps == 0 or step == config.train.steps:
              save(step, state, position)
            if (config.eval.every_steps and step % config.eval.every_steps == 0
                and step < config.train.steps):
              evaluation = evaluate_and_log(state, phase, step)  # main() prints the last
              logger.info("evaluation at step %d: %s", step, _format_eval(evaluation))
        finally:
          if batches is not None:
            batches.close()
        if stop.stopping:
          break
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
          "stopped": stop.stopping, "params": state.params,
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
    rows, batches = trainer.method.prediction_batches(input_path, config.eval.batch_size)
  with distributed.agreement(USER_ERRORS):  # see run(): fails on every process or none
    params, method_state = checkpoint_lib.restore_for_inference(
        workdir, trainer.describe(), trainer.abstract_state_with_shardings(),
        config.eval.best_metric, config.eval.best_mode)
  predict_step = trainer.predict_step()
  outputs = [jax.device_get(predict_step(params, method_state,
                                         _device_batch(trainer, b, whole=True)))
             for b in batches]
  predictions = {name: np.concatenate([o[name] for o in outputs])[:len(rows)]
                 for name in outputs[0]} if outputs else {}
  output_path = output_path or os.path.join(workdir, trainer.method.prediction_file)
  return trainer.method.write_predictions(rows, predictions, output_path), output_path


def _config_from_flags(flags_) -> ml_collections.ConfigDict:
  """--config (with its --config.<field> overrides; default: the schema's defaults), then
  the gin files and bindings on top, then --init_from."""
  if flags_.config is None and not flags_.gin_file:
    raise errors.ConfigError("no config: give --config=configs/NAME.py or "
                                 "--gin_file=configs/gin/NAME.gin.")
  config = flags_.config if flags_.config is not None else config_lib.default_config()
  if flags_.gin_file or flags_.gin_bindings:
    from encoderx import gin_config  # pylint: disable=g-import-not-at-top
    config = gin_config.apply(config, flags_.gin_file or (), flags_.gin_bindings or ())
  if flags_.init_from:
    config.init_from = flags_.init_from
  return config


def _format_eval(metrics: dict) -> str:
  return "  ".join(f"{k}={v:.4f}" for k, v in sorted(metrics.items()))


class _OrbaxFailureLogs(logging.Filter):
  """Drops the tracebacks that orbax (and asyncio, for orbax's tasks) log from background
  threads when a checkpoint cannot be written or read: the same failure reaches the run
  as an exception, which the command line reports in one line."""

  def filter(self, record):
    return not (record.levelno >= logging.ERROR
                and "orbax" in f"{record.pathname} {record.getMessage()}")


def main(argv) -> None:
  from absl import flags  # pylint: disable=g-import-not-at-top
  del argv
  flags_ = flags.FLAGS
  from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top
  # orbax, clu and TensorFlow log every save at INFO; show only warnings from them.
  absl_logging.set_verbosity(absl_logging.WARNING)
  logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
  logger.setLevel(logging.INFO)
  for name in ("absl", "asyncio"):
    logging.getLogger(name).addFilter(_OrbaxFailureLogs())
  try:
    if distributed.initialize(flags_.coordinator_address, flags_.num_processes,
                              flags_.process_id) and jax.process_index() > 0:
      logger.setLevel(logging.WARNING)  # process 0 reports the run
    with distributed.agreement(USER_ERRORS):  # a per-process flag or gin file
      config = _config_from_flags(flags_)
    if flags_.predict:
      count, output = predict(config, flags_.workdir, flags_.predict,
                              flags_.predict_output)
      print(f"wrote {count} predictions to {output}")
      return
    result = run(config, flags_.workdir, resume=flags_.resume,
                 stop_at_step=flags_.stop_at_step,
                 allow_config_change=flags_.allow_config_change,
                 allow_fresh_start=flags_.allow_fresh_start)
  except USER_ERRORS as error:
    print(f"encoderx: error: {error}", file=sys.stderr)
    sys.exit(2)
  except distributed.ProcessFailed as error:  # another process's log has the traceback
    print(f"encoderx: error: {error}", file=sys.stderr)
    sys.exit(1)
  if jax.process_index() > 0:
    return  # process 0 reports
  if result["stopped"]:
    print(f"stopped at step {result['step']}; checkpoint saved in {flags_.workdir}. "
          "Continue with the same command and --resume.")
    return
  print(f"held-out evaluation after {result['step']} steps: {_format_eval(result['eval'])}")
  print(f"work directory: {flags_.workdir} (TensorBoard: tensorboard --logdir "
        f"{os.path.join(flags_.workdir, 'tensorboard')})")


def _parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, with a bad `--config.<field>` reported in one line (naming the
  field) instead of the traceback ml_collections raises."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  for argument in argv[1:]:
    if argument.startswith("--config="):
      path = argument.removeprefix("--config=").split(":")[0]  # path[:argument]
      if not os.path.isfile(path):
        print(f"encoderx: error: no config file '{path}' (looked from {os.getcwd()}).",
              file=sys.stderr)
        sys.exit(2)
  try:
    return flags.FLAGS(argv)
  except (flags.Error, KeyError, AttributeError, TypeError, ValueError) as error:
    overrides = [a[len("--"):].split("=")[0] for a in argv[1:] if a.startswith("--config.")]
    unknown = [config_lib.unknown_field(o.removeprefix("config.")) for o in overrides]
    message = next((u for u in unknown if u), " ".join(str(error).split()))
    print(f"encoderx: error: {message}", file=sys.stderr)
    sys.exit(2)


def cli() -> None:
  from absl import app, flags  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  config_flags.DEFINE_config_file("config", None, "Path to an ml_collections config file.",
                                  lock_config=True)
  flags.DEFINE_string("workdir", None, "Directory for checkpoints and metrics.")
  flags.DEFINE_bool("resume", False, "Continue the run whose checkpoints are in --workdir.")
  flags.DEFINE_bool("allow_config_change", False, "With --resume: continue a checkpoint "
                    "even though this config's data or objective fields differ from the "
                    "ones it was trained with (the differences are logged).")
  flags.DEFINE_bool("allow_fresh_start", False, "With --resume: start a new run when the "
                    "work directory holds no checkpoint (instead of stopping).")
  flags.DEFINE_integer("stop_at_step", None, "Stop (with a checkpoint) after this step; "
                       "continue later with --resume.")
  flags.DEFINE_string("init_from", "", "Start from the parameters of another run (its work "
                      "or checkpoint directory) or of a Hugging Face model directory "
                      "(hf:DIR); sets config.init_from.")
  flags.DEFINE_string("predict", "", "Instead of training: write the predictions of the "
                      "run in --workdir for the examples of this file.")
  flags.DEFINE_string("predict_output", "", "Where --predict writes (default: the "
                      "method's predictions file in --workdir, e.g. predictions.tsv).")
  flags.DEFINE_multi_string("gin_file", None, "A gin file of config bindings (configs/gin/; "
                            "encoderx/gin_config.py), applied after --config; repeatable.")
  flags.DEFINE_multi_string("gin_bindings", None, "A gin binding, e.g. "
                            "'train.steps = 100', applied after the gin files; repeatable.")
  flags.DEFINE_string("coordinator_address", "", "A run of several processes (GPU / CPU "
                      "clusters; a TPU VM needs none of these): process 0's HOST:PORT; "
                      "default $JAX_COORDINATOR_ADDRESS. encoderx/distributed.py.")
  flags.DEFINE_integer("num_processes", None, "A run of several processes: how many; "
                       "default $JAX_NUM_PROCESSES.")
  flags.DEFINE_integer("process_id", None, "A run of several processes: this one's index, "
                       "0 to num_processes - 1; default $JAX_PROCESS_ID.")
  flags.mark_flags_as_required(["workdir"])
  app.run(main, flags_parser=_parse_flags)


if __name__ == "__main__":
  cli()

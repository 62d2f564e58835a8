"""The GLUE dev table of an encoder: every task fine-tuned over seeds (and a grid), each
scored with its official metric, the medians in one table (the command:
glue/__main__.py).

    from encoderx import glue
    result = glue.sweep("hf:DIR", "runs/glue", recipe, data_dir="GLUE_DIR")

`data_dir` (--data) is a directory in GLUE's own layout (CoLA/train.tsv,
MNLI/dev_matched.tsv ..., as GLUE's download script writes it); `use_tfds` (--tfds)
reads TFDS's glue/<task> (downloaded on first use). Each task trains with the classify
method (STS-B: similarity) from `--init_from`, with the recipe's learning rate x batch
size x epochs grid and its other fields (`config_section`; configs/glue.py has the
papers' grids), once per seed, each in a run directory of its own:
OUTPUT/runs/<task>/<grid point>/seed<N>. The dev sets are evaluated at the end of each
run (MNLI: matched and mismatched); each run's figures go to its glue_result.json, its
checkpoints are then deleted (unless --keep_checkpoints). Run again, the same command
resumes an interrupted sweep: finished runs are read back, an unfinished one continues
from its last checkpoint. The table (encoderx/evaluation/glue.py: medians over seeds,
the best grid point of each task) is printed and written to OUTPUT/results.md and
OUTPUT/results.json. Progress: a bar over the runs (task, grid point, seed) above each
run's bar of steps.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import types

import jax
import ml_collections
from tqdm.auto import tqdm

from encoderx import errors, initialize, sources, train
from encoderx import config as config_lib
from encoderx import files as files_lib
from encoderx.train import trainer as trainer_lib
from encoderx.data import glue as glue_data
from encoderx.evaluation import glue as glue_metrics

logger = logging.getLogger("encoderx")
RESULT_FILE = "glue_result.json"
# What an output directory holds a sweep of: a later command must agree on these.
SWEEP_FILE = "sweep.json"


class GlueError(errors.UserError):
  """A sweep that cannot run as asked (the message says why and what to do)."""


def config_section() -> ml_collections.ConfigDict:
  """The recipe (--recipe; configs/glue.py's `default`): the grid, seeds and the
  fine-tuning fields of every run. BERT's GLUE set-up (Devlin et al. 2019, section 4.1
  and run_classifier.py) with a grid of two learning rates and three seeds."""
  return ml_collections.ConfigDict(dict(
      tasks="cola,sst2,mrpc,stsb,qqp,mnli,qnli,rte",  # --tasks overrides
      seeds=(0, 1, 2),  # --seeds overrides; the table reports the median over them
      # The grid: every learning rate x batch size x epochs, each over the seeds.
      learning_rates=(2e-5, 5e-5),
      batch_sizes=(32,),
      epochs=(3.0,),
      warmup_fraction=0.1,  # of the run's steps, then linear decay to 0
      weight_decay=0.01,
      adam_eps=1e-6,
      adam_b2=0.999,
      clip_norm=1.0,
      seq_length=128,
      # Each batch cut to the shortest of these lengths holding its longest example
      # (finetune.length_buckets; those under seq_length apply): the same figures on fewer
      # padded tokens. One process only: a sweep over several runs without them.
      length_buckets=(32, 64, 96),
      pooling="pooler",  # finetune.pooling: BERT's pooler, or "first_token"
      classifier_dropout=0.1,
      shuffle_buffer=100_000,  # examples; at least a task's size shuffles it whole
      max_steps=0,  # > 0: at most this many steps a run (quick tries; not the recipe)
      eval_batch_size=128,
      checkpoint_every_steps=1000,
  ))


@dataclasses.dataclass(frozen=True)
class Run:
  """One fine-tuning run of the sweep."""
  task: str
  point: dict  # learning_rate, batch_size, epochs
  seed: int
  directory: str

  @property
  def label(self) -> str:
    return f"{self.task} {glue_metrics.point_name(self.point)} seed {self.seed}"


# --- the recipe --------------------------------------------------------------------------
def parse_tasks(spec: str) -> list[str]:
  tasks = [t.strip().lower() for t in spec.split(",") if t.strip()]
  unknown = [t for t in tasks if t not in glue_data.TASKS]
  if unknown or not tasks:
    raise GlueError(f"{', '.join(map(repr, unknown)) or 'no task given'}; GLUE's tasks "
                    f"here: {','.join(glue_data.TASKS)}.", argument="tasks")
  return list(dict.fromkeys(tasks))


def parse_seeds(spec) -> list[int]:
  values = spec.split(",") if isinstance(spec, str) else list(spec)
  try:
    seeds = [int(str(s).strip()) for s in values if str(s).strip()]
  except ValueError:
    raise GlueError(f"{spec!r} is not a comma-separated list of integers.",
                    argument="seeds") from None
  if not seeds:
    raise GlueError("give at least one seed.", argument="seeds")
  return list(dict.fromkeys(seeds))


def validate(recipe) -> None:
  """Checks the recipe's values (a ConfigError naming the field)."""
  def positive(field, values):
    if not values or any(v <= 0 for v in values):
      errors.fail(f"recipe.{field}", f"must be one or more positive values, got {values}.")
  positive("learning_rates", recipe.learning_rates)
  positive("batch_sizes", recipe.batch_sizes)
  positive("epochs", recipe.epochs)
  positive("seq_length", [recipe.seq_length])
  errors.check_fraction("recipe.warmup_fraction", recipe.warmup_fraction)
  errors.check_fraction("recipe.classifier_dropout", recipe.classifier_dropout)
  errors.check_choice("recipe.pooling", recipe.pooling, ("pooler", "first_token"))
  if recipe.max_steps < 0:
    errors.fail("recipe.max_steps", f"must be >= 0, got {recipe.max_steps}.")


def grid(recipe) -> list[dict]:
  return [{"learning_rate": float(lr), "batch_size": int(bs), "epochs": float(ep)}
          for lr in recipe.learning_rates for bs in recipe.batch_sizes
          for ep in recipe.epochs]


def run_steps(recipe, point: dict, train_examples: int) -> int:
  """The run's steps: its epochs over the training split (capped by max_steps)."""
  steps = max(1, math.ceil(point["epochs"] * train_examples / point["batch_size"]))
  return min(steps, recipe.max_steps) if recipe.max_steps else steps


def run_config(recipe, task: glue_data.Task, files: dict[str, str], point: dict,
               seed: int, init_from: str, train_examples: int) -> ml_collections.ConfigDict:
  """The fine-tuning run of `task` at a grid point and seed: the classify (STS-B:
  similarity) method on the task's files, as configs/finetune.py's variants set it up,
  with the recipe's fields."""
  config = config_lib.default_config()
  config.method = task.method
  config.init_from = init_from
  dev = task.dev_splits[0].name
  config.finetune.train_file, config.finetune.dev_file = files["train"], files[dev]
  config.finetune.text_column, config.finetune.label_column = (glue_data.TEXT,
                                                               glue_data.LABEL)
  config.finetune.text_pair_column = glue_data.TEXT_PAIR if task.pair else ""
  config.finetune.labels = task.labels
  config.finetune.pooling = recipe.pooling
  config.finetune.classifier_dropout = recipe.classifier_dropout
  config.data.seq_length = recipe.seq_length
  config.data.shuffle_buffer = recipe.shuffle_buffer
  config.finetune.length_buckets = tuple(
      length for length in recipe.length_buckets
      if length < recipe.seq_length) if jax.process_count() == 1 else ()
  steps = run_steps(recipe, point, train_examples)
  optimizer = config.optimizer
  optimizer.learning_rate = point["learning_rate"]
  optimizer.warmup_steps = int(recipe.warmup_fraction * steps)
  optimizer.weight_decay, optimizer.eps = recipe.weight_decay, recipe.adam_eps
  optimizer.b2, optimizer.clip_norm = recipe.adam_b2, recipe.clip_norm
  config.train.steps, config.train.batch_size = steps, point["batch_size"]
  config.train.seed = seed
  config.train.log_every = min(50, steps)
  config.eval.batches, config.eval.batch_size = 0, recipe.eval_batch_size  # whole dev
  config.eval.every_steps, config.eval.best_metric = 0, ""  # the final model's figures
  config.checkpoint.every_steps, config.checkpoint.keep = recipe.checkpoint_every_steps, 1
  return config


# --- data --------------------------------------------------------------------------------
def prepare_data(tasks: list[str], output: str, data_dir: str = "", use_tfds: bool = False,
                 tfds_data_dir: str = "") -> dict[str, tuple[dict[str, str], int]]:
  """Reads every task's splits (all checked before anything trains) and writes them in
  the methods' form under OUTPUT/data/<task>/: {task: ({split: file}, training examples)}."""
  if bool(data_dir) == use_tfds:
    raise GlueError("give the data: a directory in GLUE's own layout (DIR/CoLA/train.tsv "
                    "...) or TFDS's glue/<task>, one of the two.", argument="data",
                    remedy="tfds")
  prepared = {}
  for name in tasks:
    task = glue_data.TASKS[name]
    splits = (glue_data.read_tfds(task, tfds_data_dir) if use_tfds
              else glue_data.read_directory(task, data_dir))
    files = glue_data.write_examples(splits, os.path.join(output, "data", name))
    logger.info("%s: %s", name, ", ".join(f"{split} {len(examples)}"
                                          for split, examples in splits.items()))
    prepared[name] = (files, len(splits["train"]))
  return prepared


# --- the sweep ---------------------------------------------------------------------------
def _check_sweep(output: str, init_from: str, recipe) -> None:
  """Records what OUTPUT holds a sweep of; a later sweep there must agree (tasks and
  seeds may change: runs are kept by task and seed)."""
  fields = {k: v for k, v in recipe.to_dict().items() if k not in ("tasks", "seeds")}
  described = json.loads(json.dumps({"init_from": init_from, "recipe": fields}))
  path = os.path.join(output, SWEEP_FILE)
  if files_lib.exists(path):
    before = json.loads(files_lib.read_text(path))
    if before != described:
      changed = [k for k in ("init_from",) if before.get(k) != described[k]] + [
          f"recipe.{k}" for k in fields if before["recipe"].get(k) != described["recipe"][k]]
      raise GlueError(f"{output} holds a sweep with other settings "
                      f"({', '.join(changed)}); choose another output directory, or repeat "
                      "its settings to resume it.", argument="output")
  else:
    files_lib.write_atomically(path, json.dumps(described, indent=2))


def plan(tasks: list[str], seeds: list[int], recipe, output: str) -> list[Run]:
  return [Run(task, point, seed, os.path.join(output, "runs", task,
                                              glue_metrics.point_name(point), f"seed{seed}"))
          for task in tasks for point in grid(recipe) for seed in seeds]


def evaluate_split(config, result: dict, dev_file: str, devices=None) -> dict[str, float]:
  """The method's metrics of a run's final parameters (`result` of train.run) on another
  dev file (MNLI's mismatched set)."""
  config = config.copy_and_resolve_references()
  config.finetune.dev_file = dev_file
  trainer = trainer_lib.Trainer(initialize.resolve_config(config), devices=devices)
  state = types.SimpleNamespace(params=result["params"], method_state=result["method_state"])
  return train.evaluate(trainer, trainer.method.task(), state, trainer.phases[-1])


def _finished(run: Run, settings: dict) -> dict | None:
  path = os.path.join(run.directory, RESULT_FILE)
  if not files_lib.exists(path):
    return None
  result = json.loads(files_lib.read_text(path))
  if result["settings"] != settings:
    raise GlueError(f"{path} is of a run with other settings; delete it or choose another "
                    "output directory.", argument="output")
  return result


def train_run(run: Run, config, files: dict[str, str], settings: dict,
              show_progress: bool, keep_checkpoints: bool, devices=None) -> dict | None:
  """Trains (or resumes) one run and writes its glue_result.json; None if it was stopped
  (SIGINT / SIGTERM: its checkpoint saved)."""
  result = train.run(config, run.directory, resume=True, allow_fresh_start=True,
                     show_progress=show_progress, devices=devices, progress_label=run.label)
  if result["stopped"]:
    return None
  task = glue_data.TASKS[run.task]
  metrics = {task.dev_splits[0].name: result["eval"]}
  for split in task.dev_splits[1:]:
    metrics[split.name] = evaluate_split(config, result, files[split.name], devices)
  record = {"task": run.task, "point": run.point, "seed": run.seed,
            "steps": result["step"], "settings": settings, "metrics": metrics}
  if jax.process_index() == 0:  # every process has the figures; one writes them
    files_lib.write_atomically(os.path.join(run.directory, RESULT_FILE),
                               json.dumps(record, indent=2))
    checkpoints = files_lib.path(run.directory) / "checkpoints"
    if not keep_checkpoints and checkpoints.exists():
      checkpoints.rmtree()
  return record


def sweep(init_from: str, output: str, recipe=None, tasks: list[str] | None = None,
          seeds: list[int] | None = None, data_dir: str = "", use_tfds: bool = False,
          tfds_data_dir: str = "", show_progress: bool = True,
          keep_checkpoints: bool = False, devices=None) -> dict:
  """Runs (or resumes) the sweep and writes its table; returns {'table', 'runs',
  'stopped'} (the table None when stopped). See the module doc."""
  recipe = config_section() if recipe is None else recipe
  validate(recipe)
  tasks = parse_tasks(recipe.tasks) if tasks is None else parse_tasks(",".join(tasks))
  seeds = parse_seeds(recipe.seeds if seeds is None else seeds)
  if not init_from:
    raise GlueError("name the encoder (a run's work directory or hf:DIR).",
                    argument="init_from")
  sources.open_source(init_from)  # a bad source fails before any data is read
  output = str(files_lib.path(output))
  prepared = prepare_data(tasks, output, data_dir, use_tfds, tfds_data_dir)
  for name, (_, examples) in prepared.items():
    if examples < max(recipe.batch_sizes):
      raise GlueError(f"{name} has {examples} training examples, fewer than a batch of "
                      f"{max(recipe.batch_sizes)} (recipe.batch_sizes).")
  _check_sweep(output, init_from, recipe)
  runs, records = plan(tasks, seeds, recipe, output), []
  with tqdm(total=len(runs), desc="glue", unit="run", dynamic_ncols=True,
            disable=not show_progress or jax.process_index() > 0) as bar:
    for run in runs:
      bar.set_description(f"glue {run.label}")
      files, examples = prepared[run.task]
      config = run_config(recipe, glue_data.TASKS[run.task], files, run.point, run.seed,
                          init_from, examples)
      settings = {"init_from": init_from, "steps": config.train.steps,
                  "optimizer": config.optimizer.to_dict(), "seq_length": recipe.seq_length}
      record = _finished(run, settings)
      if record is not None:
        logger.info("%s: finished before, read from %s", run.label, run.directory)
      else:
        record = train_run(run, config, files, settings, show_progress, keep_checkpoints,
                           devices)
        if record is None:
          return {"table": None, "runs": records, "stopped": run.label}
      records.append(record)
      bar.update(1)
  table = glue_metrics.summarize(records)
  if jax.process_index() == 0:
    files_lib.write_atomically(os.path.join(output, "results.json"), json.dumps(
        {"init_from": init_from, "recipe": recipe.to_dict(), "table": table,
         "runs": records}, indent=2))
    files_lib.write_atomically(os.path.join(output, "results.md"),
                               glue_metrics.markdown(table))
  return {"table": table, "runs": records, "stopped": None}

"""The config schema: every field encoderx reads, its default, and validation.

Each section is declared by the code that reads it, and assembled here:

    model               encoderx/models/model_config.py (ModelConfig, its groups)
    data                encoderx/data/fields.py
    optimizer           encoderx/optim.py
    mesh                encoderx/sharding.py
    objective, rtd,     the training methods (methods/registry.py): each method's
    finetune, qa, ...   `config_fields()`, e.g. methods/qa.py declares `qa`
    train, eval,        here: the core of a run (trainer, loop, checkpoints) reads them
    checkpoint

Config files (configs/<family>.py:<variant>) start from `default_config()` and change
fields. The returned ConfigDict is locked, so a misspelt field in a config file or on the
command line fails at once with the field's name; `validate()` then checks values and sizes
(each section's own checks live with its declaration) before anything is built or
compiled. Fields that moved (encoderx/moved.py) keep working where old configs are read
(`migrate_fields`: config.json of older runs, their checkpoints' descriptions) and are
refused, naming the new field, where a user writes them.
"""
from __future__ import annotations

import copy
import difflib
import functools

import ml_collections

from encoderx import errors, moved
from encoderx import optim, sharding
from encoderx.data import fields as data_fields
from encoderx.hf import families
from encoderx.methods import registry
from encoderx.models import attention_kernels, model_config


def _core_sections() -> dict[str, ml_collections.ConfigDict]:
  """The sections the core of a run reads: the trainer and loop (train, eval) and its
  checkpoints (checkpoint)."""
  return dict(
      train=ml_collections.ConfigDict(dict(
          steps=1_000_000,
          batch_size=256,  # global batch, per optimizer update.
          grad_accum_steps=1,  # micro-batches per update; batch_size must divide by it.
          seed=0,
          log_every=100,
          # Final fraction of the steps run at long_seq_length (BERT: 0.1 at 512).
          long_fraction=0.0,
          long_seq_length=512,
          # Batch-size warmup (ModernBERT): (until_step, global batch size) pieces, each
          # size for the steps before until_step; then batch_size. One compiled step per
          # size; the data stream and its checkpointed position continue across them.
          # configs/common.py: batch_size_warmup() builds ModernBERT's ramp.
          batch_size_schedule=(),
          # > 0: keep an exponential moving average of the parameters in the train state
          # (checkpointed), ema = decay x ema + (1 - decay) x params after every update;
          # evaluations, export and --init_from then use it (0: off).
          ema_decay=0.0,
          # Steps in a row whose loss or gradient norm is not finite (NaN/inf) that are
          # skipped, leaving the state as it was, before the run stops with an error
          # naming them; 0: stop at the first.
          max_skipped_steps=10,
      )),
      eval=ml_collections.ConfigDict(dict(
          batches=20,  # held-out batches per evaluation; 0: the whole split.
          # Global batch of evaluations and predictions; 0: as many rows as hold the
          # tokens of a training micro-batch at the evaluation's length (train.batch_size
          # / train.grad_accum_steps rows at data.seq_length), so that an evaluation never
          # holds more than training does (Trainer.evaluation_batch_size).
          batch_size=0,
          every_steps=0,  # 0: only at the end of the run.
          # A metric of the evaluation (e.g. "accuracy") to keep the best checkpoint by,
          # in best/ of the work directory; "": no best checkpoint.
          best_metric="",
          best_mode="max",  # or "min".
      )),
      checkpoint=ml_collections.ConfigDict(dict(
          every_steps=1000,
          keep=3,
          async_save=True,
      )),
  )


def _schema() -> ml_collections.ConfigDict:
  """The schema for the methods registered now (a method registered later adds its
  sections)."""
  return _schema_of(tuple(registry.REGISTRY.items()))


@functools.cache
def _schema_of(methods: tuple) -> ml_collections.ConfigDict:
  del methods  # the cache key: registry.config_fields() reads the registry itself
  config = ml_collections.ConfigDict()
  # The training method (methods/registry.py): "pretrain" (MLM with optional NSP / SOP /
  # SBO), "electra" (replaced-token detection), "xlnet" (permutation language modelling
  # with memory), or fine-tuning: "classify", "similarity", "tag", "qa", "simcse".
  config.method = "pretrain"
  # Parameters to start from (fresh init when empty): a work directory or checkpoint
  # directory of another run, or "hf:<Hugging Face model directory>". The encoder's
  # fields (config.model but dropout, dtypes, scan and remat) and the vocabulary
  # (config.data.vocab) are taken from it. Same as the --init_from flag.
  config.init_from = ""
  # With init_from a run (not hf:): also take its optimizer state (the moments and their
  # update counts, train.ema_decay's average; the schedule restarts): ModernBERT's
  # context extension and decay phases continue the optimizer. It needs the same
  # method, model, heads, scan layout, optimizer and train.ema_decay.
  config.init_from_optimizer = False
  config.model = model_config.config_section()
  config.data = data_fields.config_section()
  config.optimizer = optim.config_section()
  for name, section in {**registry.config_fields(), **_core_sections()}.items():
    config[name] = section
  config.mesh = sharding.config_section()
  return config


def default_config() -> ml_collections.ConfigDict:
  """Every field encoderx reads, with BERT-base defaults; locked against new fields."""
  config = copy.deepcopy(_schema())
  config.lock()
  return config


def _became_group(old: str, new: str) -> bool:
  """A field that became a group of the same name ('model.attention' ->
  'model.attention.variant'): only its old leaf value moved, not the fields under it."""
  return new.startswith(old + ".")


def _moved(path: str) -> str | None:
  """The field `path` (or a field under it) became, or None."""
  for old, new in moved.MOVED["field"].items():
    if path == old or (path.startswith(old + ".") and not _became_group(old, new)):
      return new + path[len(old):]
  return None


def _unknown_fields(config, schema, prefix=""):
  """Every field of `config` that `schema` lacks, as messages."""
  for key in config.keys():
    name = f"{prefix}{key}"
    if key not in schema:
      new_path = _moved(name)
      close = difflib.get_close_matches(key, list(schema.keys()), n=1)
      hint = (f" (it is now '{new_path}')" if new_path else
              f" (did you mean '{prefix}{close[0]}'?)" if close else "")
      yield f"unknown field '{name}'{hint}"
    elif isinstance(schema[key], ml_collections.ConfigDict):
      if not isinstance(config[key], ml_collections.ConfigDict):
        moved = _moved(name)
        yield (f"field '{name}' is now '{moved}'" if moved else
               f"field '{name}' must be a group of fields, got {config[key]!r}")
      else:
        yield from _unknown_fields(config[key], schema[key], prefix=f"{name}.")


def unknown_field(path: str) -> str | None:
  """'model.hiden_size' -> a message naming the unknown part (None if the field exists)."""
  new_path = _moved(path)
  if new_path:
    return f"config field '{path}' is now '{new_path}' (docs/migration.md)"
  node, parts = _schema(), path.split(".")
  for depth, part in enumerate(parts):
    if not isinstance(node, ml_collections.ConfigDict) or part not in node:
      options = list(node.keys()) if isinstance(node, ml_collections.ConfigDict) else []
      close = difflib.get_close_matches(part, options, n=1)
      hint = f" (did you mean '{'.'.join(parts[:depth] + close)}'?)" if close else ""
      return f"unknown config field '{path}'{hint}"
    node = node[part]
  return None


def migrate_fields(values: dict) -> dict:
  """A nested dict of config values (an older run's config.json, a checkpoint's training
  description) with the fields that moved (moved.MOVED) at their new paths."""
  values = copy.deepcopy(values)
  # A field that became a group moves first, so that the group's other fields find it.
  for old, new in sorted(moved.MOVED["field"].items(), key=lambda item: not _became_group(*item)):
    *old_parents, old_name = old.split(".")
    parent = values
    for part in old_parents:
      parent = parent.get(part) if isinstance(parent, dict) else None
    if (not isinstance(parent, dict) or old_name not in parent
        or isinstance(parent[old_name], dict)):  # absent, or already the new group
      continue
    value = parent.pop(old_name)
    *new_parents, new_name = new.split(".")
    target = values
    for part in new_parents:
      target = target.setdefault(part, {})
    target[new_name] = value
  return values


def changed_fields(config: ml_collections.ConfigDict, section: str) -> dict:
  """The fields of `config.<section>` that differ from the defaults (nested), as plain
  values: what a description of the run records, so that a field added later, at its
  default, changes nothing."""
  def changed(node, default):
    result = {}
    for key in node.keys():
      value = node[key]
      if isinstance(value, ml_collections.ConfigDict):
        inner = changed(value, default[key] if key in default else {})
        if inner:
          result[key] = inner
      elif key not in default or value != default[key]:
        result[key] = list(value) if isinstance(value, tuple) else value
    return result
  return changed(config[section], _schema()[section])


def _validate_run(config) -> None:
  """The core's own sections, and what spans sections (lengths against positions)."""
  model, data, train = config.model, config.data, config.train
  errors.check_positive(config, "train.steps", "train.batch_size", "train.grad_accum_steps",
                        "train.log_every", "checkpoint.every_steps", "checkpoint.keep")
  longest = max(data.seq_length, train.long_seq_length if train.long_fraction else 0)
  positions = model.embeddings
  if ((positions.position == "absolute" or model.heads.enhanced_mask_decoder)
      and longest + positions.position_offset > positions.max_positions):
    offset = (f" + model.embeddings.position_offset={positions.position_offset}"
              if positions.position_offset else "")
    errors.fail("data.seq_length" if longest == data.seq_length else "train.long_seq_length",
                f"{longest}{offset} exceeds model.embeddings.max_positions="
                f"{positions.max_positions}.")
  errors.check_fraction("train.long_fraction", train.long_fraction)
  lengths = {"data.seq_length": data.seq_length}
  if train.long_fraction:
    lengths["train.long_seq_length"] = train.long_seq_length
  attention_kernels.validate(model, lengths)
  if train.max_skipped_steps < 0:
    errors.fail("train.max_skipped_steps", f"must be >= 0, got {train.max_skipped_steps}.")
  if train.batch_size % train.grad_accum_steps:
    errors.fail("train.batch_size", f"{train.batch_size} is not divisible by "
                f"train.grad_accum_steps={train.grad_accum_steps}.")
  _validate_batch_size_schedule(train)
  if not 0.0 <= train.ema_decay < 1.0:
    errors.fail("train.ema_decay", f"must be in [0, 1) (0: no moving average), got "
                f"{train.ema_decay}.")
  if config.eval.batch_size < 0:
    errors.fail("eval.batch_size", f"must be >= 0, got {config.eval.batch_size}.",
                "Use 0 (a training micro-batch's tokens) or a number of rows.")
  if config.eval.batches < 0:
    errors.fail("eval.batches", f"must be >= 0 (0: the whole split), got "
                f"{config.eval.batches}.")
  errors.check_choice("eval.best_mode", config.eval.best_mode, ("max", "min"))
  if config.init_from_optimizer and (not config.init_from
                                     or config.init_from.startswith("hf:")):
    errors.fail("init_from_optimizer", "needs init_from to name a run (its work "
                f"directory or RUN/checkpoints/STEP), got {config.init_from!r}.")


def _validate_batch_size_schedule(train) -> None:
  """(until_step, batch size) pieces with increasing ends before train.steps, sizes
  positive, at most train.batch_size and divisible by train.grad_accum_steps."""
  field, schedule = "train.batch_size_schedule", train.batch_size_schedule
  if not schedule:
    return
  try:
    pieces = [(int(end), int(size)) for end, size in schedule]
  except (TypeError, ValueError):
    errors.fail(field, f"must be (until_step, batch_size) pairs, got {schedule!r}.")
  ends = [end for end, _ in pieces]
  if any(b <= a for a, b in zip([0] + ends, ends)) or ends[-1] >= train.steps:
    errors.fail(field, f"the pieces' ends {ends} must increase from above 0 and stay "
                f"below train.steps={train.steps} (train.batch_size runs the rest).")
  for _, size in pieces:
    if not 0 < size <= train.batch_size:
      errors.fail(field, f"batch size {size} must be positive and at most "
                  f"train.batch_size={train.batch_size}.")
    if size % train.grad_accum_steps:
      errors.fail(field, f"batch size {size} is not divisible by "
                  f"train.grad_accum_steps={train.grad_accum_steps}.")


def validate(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Checks every field a run depends on; raises errors.ConfigError naming the first bad
  one. Each section is checked by the code that declares it, the method's fields by the
  method's `validate`."""
  problems = list(_unknown_fields(config, _schema()))
  if problems:
    raise errors.ConfigError("; ".join(problems))
  errors.check_choice("method", config.method, tuple(registry.REGISTRY))
  model_config.validate(config.model)
  errors.check_choice("model.family", config.model.family, families.names())
  data_fields.validate(config.data)
  _validate_run(config)
  optim.validate(config.optimizer, config.train.steps)
  sharding.validate(config.mesh)
  registry.method_class(config.method).validate(config)
  if (config.finetune.length_buckets
      and not registry.method_class(config.method).cuts_to_buckets):
    errors.fail("finetune.length_buckets", f"the {config.method} method reads every batch "
                "at data.seq_length; length buckets are for fine-tuning.", "Set it to ().")
  return config

"""Where a run's first parameters come from.

Weights enter a run three ways: fresh initialization; resuming (the whole state of the
same run, encoderx/checkpoint.py); and `config.init_from` (the train command's
--init_from), parameters only, from

    RUN_DIR or RUN_DIR/checkpoints/STEP   another encoderx run (its latest checkpoint, or
                                          that step)
    hf:HF_DIR                             a Hugging Face model directory (config.json,
                                          model.safetensors or pytorch_model.bin, and the
                                          tokenizer's files); a sentence-transformers
                                          one's pooling, normalization and prompts too
                                          (hf/st_directory.py, for encoderx.embed, as an
                                          embedding run's own: Source.sentence_embedding)

`resolve(config)` reads the source once and returns what the run takes from it
(`InitSource`): the config with the source's encoder fields and vocabulary, and the
source, whose weights `initial_state` loads into the run's first state.

The source decides the architecture: the run takes its encoder's fields (config.model,
but for dropout, dtypes, scan and remat, which stay the run's, and for a rotary source
the rotary theta and the length: a context extension's) and its vocabulary
(config.data.vocab). With `config.init_from_optimizer` (a run as the source) the
run also continues the source's optimizer state (moments, their update counts, the
moving average of the weights) under its own, restarted, schedule: ModernBERT's
context extension and decay phases (AnswerDotAI/ModernBERT main.py: `load_path` with
`reset_time` and `restart_override`). Then the source's encoder is taken whole, each head of the run that
the source has with the same shapes is taken, and the run's other heads start fresh.
What the source has and the run does not use (e.g. pretraining heads when fine-tuning)
is listed; an encoder weight that does not fit is an error, since the encoder is what
the run is meant to start from.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os

import flax
import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

from encoderx import errors
from encoderx import config as config_lib
from encoderx import files as files_lib
from encoderx import optim
from encoderx.data import fields as data_fields
from encoderx.methods import registry as method_registry
from encoderx.hf import directory as hf_directory
from encoderx.hf import st_directory
from encoderx.models import embeddings, encoder, model_config

logger = logging.getLogger("encoderx")

HF_PREFIX = "hf:"
# Model fields a run keeps from its own config when it starts from another's weights
# (the source's vocabulary padding is dropped and the run's added: vocab_multiple).
RUN_MODEL_FIELDS = ("hidden_dropout", "attention.dropout", "attention.kernel", "dtype",
                    "param_dtype", "layout.scan", "layout.remat", "vocab_multiple")
# And, for a rotary run from a rotary source, the fields no weight depends on that a
# context extension changes (ModernBERT: 1,024 -> 8,192 tokens, global theta 10,000 -> 160,000).
ROTARY_RUN_FIELDS = ("embeddings.rope_theta", "embeddings.local_rope_theta",
                     "embeddings.max_positions")
# Parameters of the encoder proper; everything else (pooler, heads) may be new or unused.
ENCODER_SCOPES = (("encoder_model", "embeddings"), ("encoder_model", "encoder"))


class InitError(errors.UserError, ValueError):
  """An init_from source that cannot be read, or whose weights do not fit the run."""
  argument = "init_from"


@dataclasses.dataclass
class Source:
  """Where init_from points: its architecture, vocabulary and parameters."""
  name: str
  model: dict  # config.model fields by path ('attention.window': model_config.flat)
  vocab: dict  # config.data.vocab fields
  # () -> transferable params (unscanned, without vocabulary padding rows), numpy arrays
  load_params: callable
  notes: tuple[str, ...] = ()
  # (the run's abstract optimizer state, with shardings) -> the source's (a run only)
  load_optimizer_state: callable = None
  # () -> how the source embeds texts (hf/st_directory.py's SentenceEmbedding): a
  # sentence-transformers directory's modules, an embedding run's head (its pooling,
  # normalization, prompts, length); None for any other model. Read when embedding, so
  # that a module encoderx cannot reproduce does not stop a run that only starts from
  # the encoder.
  sentence_embedding: callable = lambda: None


@dataclasses.dataclass(frozen=True)
class InitSource:
  """What a run takes from config.init_from (`resolve`): the run's config with the
  source's encoder fields and vocabulary, and the source whose weights the first state
  loads (None: a fresh start)."""
  config: ml_collections.ConfigDict
  source: Source | None


def run_config(path: str) -> ml_collections.ConfigDict:
  """A run's config.json on the current schema (moved fields at their new place, fields it
  lacks at their defaults; fields the schema no longer has, from older versions,
  skipped)."""
  stored = config_lib.migrate_fields(json.loads(files_lib.read_text(path)))
  config = config_lib.default_config()

  def fill(node, values):
    for key, value in values.items():
      if key not in node:
        continue
      if isinstance(node[key], ml_collections.ConfigDict):
        fill(node[key], value)
      else:
        node[key] = tuple(value) if isinstance(value, list) else value

  fill(config, stored)
  data_fields.migrate_vocab(config.data.vocab)
  return config


def _unscanned(params, model):
  if model.layout.scan:
    return encoder.unstack_layers(params, model.num_layers)
  return params


def _run_source(path: str) -> Source:
  given = files_lib.path(path)
  path = str(given)
  if not given.exists():
    raise InitError(f"'{path}' does not exist.")
  step = None
  if given.joinpath("config.json").is_file():
    workdir = path
  elif given.name.isdigit() and given.parent.name == "checkpoints":
    workdir, step = str(given.parent.parent), int(given.name)
  else:
    raise InitError(
        f"'{path}' is neither a run's work directory (with config.json) nor "
        "one of its checkpoints (WORKDIR/checkpoints/STEP); a Hugging Face model "
        f"directory is given as {HF_PREFIX}DIR.")
  config = run_config(os.path.join(workdir, "config.json"))

  def load_params():
    source_method = method_registry.build(config)
    _, params = run_weights(workdir, step, config, source_method)
    params = _unscanned(source_method.transferable_params(params), config.model)
    return embeddings.resize_vocabulary(params, source_method.model_config.vocab_size)

  def load_optimizer_state(abstract_opt_state):
    try:
      return restore_state(workdir, step, {"opt_state": abstract_opt_state})[1]["opt_state"]
    except (ValueError, KeyError, TypeError) as error:
      raise InitError(
          f"the optimizer state of {workdir} does not fit this run's "
          f"(init_from_optimizer needs the same method, model, heads, scan layout, "
          f"optimizer and train.ema_decay): {' '.join(str(error).split())[:300]}") from None

  def sentence_embedding():
    return st_directory.of_run_head(run_description(workdir, step), config.data.seq_length)

  return Source(name=workdir, model=model_config.flat(config.model),
                vocab=dict(config.data.vocab),
                load_params=load_params, load_optimizer_state=load_optimizer_state,
                sentence_embedding=sentence_embedding)


def _read_checkpoint(workdir: str, step: int | None, items: dict) -> tuple[int, dict]:
  """(the step, the items of that checkpoint of the run in `workdir` that `items` names,
  {name: its orbax restore args}); step None: its latest. Reads only: never writes into
  the run."""
  checkpoints = os.path.join(workdir, "checkpoints")
  manager = ocp.CheckpointManager(checkpoints, item_names=tuple(items),
                                  options=ocp.CheckpointManagerOptions(read_only=True))
  try:
    chosen = step if step is not None else manager.latest_step()
    if chosen is None or chosen not in manager.all_steps():
      raise InitError(f"{checkpoints} holds no checkpoint"
                      + (f" of step {step}." if step is not None else "."))
    return chosen, manager.restore(chosen, args=ocp.args.Composite(**items))
  finally:
    manager.close()


def restore_state(workdir: str, step: int | None, item: dict) -> tuple[int, dict]:
  """(the step, the parts of that checkpoint's train state that `item` names: a tree of
  ShapeDtypeStructs with shardings) of the run in `workdir`; step None: its latest.
  Reads only: never writes into the run."""
  chosen, restored = _read_checkpoint(workdir, step, {"state": ocp.args.PyTreeRestore(
      item=item, partial_restore=True,
      restore_args=ocp.checkpoint_utils.construct_restore_args(item))})
  logger.info("init_from: %s of step %d of %s", "/".join(item), chosen, workdir)
  return chosen, restored["state"]


def run_description(workdir: str, step: int | None) -> dict:
  """What the run in `workdir` was at that checkpoint (step None: its latest), as it
  recorded it (checkpoint.py's `model` item, Trainer.describe): its method, model and
  the method's describe_head() (pooling, prompts, labels ...). Read rather than
  rebuilt, so that no method is built (a classifier's labels read from its train file)."""
  return _read_checkpoint(workdir, step, {"model": ocp.args.JsonRestore()})[1]["model"]


def run_weights(workdir: str, step: int | None, config=None, method=None
                ) -> tuple[int, dict]:
  """(the step, the weights of that checkpoint of the run in `workdir`, as numpy arrays
  in the run's own layout: its parameters, or with train.ema_decay their moving average,
  kept by each update's optimizer, optim.with_ema); step None: the latest."""
  config = config or run_config(os.path.join(workdir, "config.json"))
  method = method or method_registry.build(config)
  abstract = flax.linen.unbox(jax.eval_shape(method.init, jax.random.key(0))["params"])
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  target = jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), abstract)
  if not config.train.ema_decay:
    chosen, restored = restore_state(workdir, step, {"params": target})
    return chosen, jax.device_get(restored["params"])
  updates = method.updates
  chosen, restored = restore_state(workdir, step, {"opt_state": {
      u.name: {"ema": _groups(target, u.groups)} for u in updates}})
  params = {}
  for u in updates:
    params.update(restored["opt_state"][u.name]["ema"])
  return chosen, jax.device_get(params)


def _groups(params: dict, groups: tuple[str, ...] | None) -> dict:
  """The parameter groups (top-level keys) an optimizer update trains; None: all."""
  return params if groups is None else {k: v for k, v in params.items() if k in groups}


def _hf_source(path: str) -> Source:
  name = str(files_lib.path(path))
  if not files_lib.path(name).is_dir():
    raise InitError(f"'{name}' is not a directory.")
  directory = files_lib.local_copy(name)  # safetensors and torch read local files only
  try:
    family, fields = hf_directory.read_config(directory)
    vocab = hf_directory.vocab_fields(directory, family)
    hf_directory.check_weights(directory)  # cut short: stop before the run builds anything
    vocab["path"] = vocab["path"].replace(directory, name, 1)  # the run reads `name`
  except hf_directory.HfDirectoryError as error:
    raise InitError(str(error)) from None

  def load_params():
    model = model_config.ModelConfig.from_config(model_config.nested(fields))
    try:
      params, unused = hf_directory.convert(hf_directory.read_state_dict(directory),
                                            model, family,
                                            hf_directory.architecture(directory))
    except hf_directory.HfDirectoryError as error:
      raise InitError(str(error)) from None
    if unused:
      logger.info("init_from: Hugging Face weights with no use here: %s", ", ".join(unused))
    return params

  return Source(name=f"{HF_PREFIX}{name} ({family})", model=fields, vocab=vocab,
                load_params=load_params,
                sentence_embedding=lambda: st_directory.read(directory))


def open_source(spec: str) -> Source:
  if spec.startswith(HF_PREFIX):
    return _hf_source(spec.removeprefix(HF_PREFIX))
  return _run_source(spec)


def resolve(config: ml_collections.ConfigDict) -> InitSource:
  """What the run of `config` takes from config.init_from, in one pass: the source opened
  (its config, vocabulary and where its weights are; nothing loaded yet) and checked
  against the config, and the config with the source's encoder fields and vocabulary.
  A fresh start (no init_from) takes nothing."""
  if not config.init_from:
    return InitSource(config, None)
  source = open_source(config.init_from)
  _check_vocabulary(config, source)
  return InitSource(_with_source_fields(config, source), source)


def resolve_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The config with config.init_from's encoder fields and vocabulary (unchanged when
  it starts fresh): `resolve(config).config`."""
  return resolve(config).config


def _with_source_fields(config, source: Source) -> ml_collections.ConfigDict:
  """A copy of `config` with the source's encoder fields (but RUN_MODEL_FIELDS, and a
  rotary run's ROTARY_RUN_FIELDS) and its vocabulary."""
  resolved = config.copy_and_resolve_references()
  changed = []
  # A rotary run from a rotary source keeps its own thetas and length (a context
  # extension); another run (a fine-tuning config's) takes the source's.
  rotary = (source.model.get("embeddings.position") == config.model.embeddings.position
            == "rotary")
  kept = RUN_MODEL_FIELDS + (ROTARY_RUN_FIELDS if rotary else ())
  run_fields = model_config.flat(resolved.model)
  for field, value in source.model.items():
    if field not in kept and field in run_fields:
      if run_fields[field] != value:
        changed.append(f"model.{field}={value!r}")
      *groups, name = field.split(".")
      section = resolved.model
      for group in groups:
        section = section[group]
      section[name] = value
  for field, value in source.vocab.items():
    resolved.data.vocab[field] = value
  logger.info("init_from %s: taking its encoder's fields%s and vocabulary %s",
              source.name, f" ({', '.join(changed)})" if changed else "",
              source.vocab["path"])
  return resolved


def _check_vocabulary(config, source: Source) -> None:
  """A config that names its vocabulary's layout (data.vocab.layout: ModernBERT's,
  EuroBERT's, DeBERTa's) pretrains its family: a source with another vocabulary is a
  model of another family, refused in one line rather than trained under this config's
  choices (fine-tuning configs name none and take any family)."""
  layout = config.data.vocab.get("layout", "")
  theirs = (source.vocab["kind"], data_fields.vocab_layout(source.vocab))
  if layout and theirs != (config.data.vocab.kind, layout):
    raise InitError(
        f"{source.name} is a {source.model.get('family', '?')} model (a "
        f"{theirs[0]} vocabulary, layout {theirs[1] or '-'!r}); this config "
        f"(model.family={config.model.family!r}) trains {config.data.vocab.kind} "
        f"vocabularies of the {layout!r} layout: start from a {config.model.family} model "
        f"or use configs/{source.model.get('family', 'bert').split('-')[0]}.py.")


def _is_encoder(path: tuple[str, ...]) -> bool:
  return any(path[:len(scope)] == scope for scope in ENCODER_SCOPES)


@dataclasses.dataclass
class MergeReport:
  taken: list[str]
  fresh: list[str]  # the run's parameters the source lacks (or has in another shape)
  unused: list[str]  # the source's parameters the run lacks

  def summary(self) -> str:
    def heads(paths):
      return ", ".join(sorted({p.split("/")[0] if not p.startswith("encoder_model/")
                               else "/".join(p.split("/")[:2]) for p in paths}))
    return (f"took {len(self.taken)} tensors; initialized fresh: {heads(self.fresh) or '-'}"
            f"; unused from the source: {heads(self.unused) or '-'}")


def merge(run_params, source_params) -> tuple[dict, MergeReport]:
  """The run's (transferable) parameters with every one the source has in the same shape
  taken from it. Raises InitError when an encoder parameter is missing, unexpected or of
  another shape."""
  run = flax.traverse_util.flatten_dict(run_params)
  source = flax.traverse_util.flatten_dict(source_params)
  merged, report, problems = {}, MergeReport([], [], []), []
  for path, value in run.items():
    name = "/".join(path)
    theirs = source.get(path)
    if theirs is not None and np.shape(theirs) == np.shape(value):
      merged[path] = np.asarray(theirs, dtype=value.dtype)
      report.taken.append(name)
      continue
    merged[path] = value
    report.fresh.append(name)
    if _is_encoder(path):
      problems.append(f"missing {name}" if theirs is None else
                      f"{name}: shape {np.shape(theirs)} != {np.shape(value)}")
  for path in source.keys() - run.keys():
    name = "/".join(path)
    report.unused.append(name)
    if _is_encoder(path):
      problems.append(f"unexpected {name}")
  if problems:
    raise InitError("the source's encoder does not fit this run's: "
                    + "; ".join(sorted(problems)))
  return flax.traverse_util.unflatten_dict(merged), report


def initial_state(trainer, init: InitSource | None = None):
  """A fresh train state of `trainer` (built from `init.config`): initialized, or with the
  parameters of `init.source` (default: `resolve(trainer.config)`)."""
  config = trainer.config
  source = (init or resolve(config)).source
  if source is None:
    return trainer.init_state()
  fresh = jax.device_get(trainer.init_params())
  method = trainer.method
  run_params = _unscanned(method.transferable_params(fresh), config.model)
  source_params = embeddings.resize_vocabulary(source.load_params(),
                                               method.model_config.padded_vocab_size)
  merged, report = merge(run_params, source_params)
  if config.model.layout.scan:
    merged = encoder.stack_layers(merged)
  logger.info("init_from %s: %s", source.name, report.summary())
  state = trainer.init_state(method.with_transferable_params(fresh, merged))
  if config.init_from_optimizer:
    opt_state = source.load_optimizer_state(trainer.abstract_state_with_shardings().opt_state)
    # The moments (and their update counts) carry on; the schedule starts over.
    state = state.replace(opt_state=optim.reset_schedules(opt_state))
    logger.info("init_from %s: its optimizer state too (the schedule restarts)", source.name)
  return state

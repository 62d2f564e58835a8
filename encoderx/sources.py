"""Reading where a run's first parameters come from, into a `Source`.

`config.init_from` (the train command's --init_from; encoderx.embed's, export's and
retrieval's sources too) names

    RUN_DIR or RUN_DIR/checkpoints/STEP   another encoderx run (its latest checkpoint, or
                                          that step): `RunSource`
    hf:HF_DIR                             a Hugging Face model directory (config.json,
                                          model.safetensors or pytorch_model.bin, and the
                                          tokenizer's files); a sentence-transformers
                                          one's pooling, normalization and prompts too
                                          (hf/st_directory.py): `HfSource`

`open_source(spec)` reads what decides a run's shape (the source's architecture, as
config.model fields, and its vocabulary, as config.data.vocab's) and checks that its
weights can be read; the weights themselves, a run's optimizer state and how the source
embeds texts are read when asked for. A Source never looks at the run it will start:
applying one to a run is encoderx/initialize.py's. A run's own files are read here too
(`run_config`, `run_weights`, `run_description`, `restore_state`), for averaging and
export.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os

import flax
import jax
import ml_collections
import orbax.checkpoint as ocp

from encoderx import errors
from encoderx import config as config_lib
from encoderx import files as files_lib
from encoderx.data import fields as data_fields
from encoderx.methods import registry as method_registry
from encoderx.hf import directory as hf_directory
from encoderx.hf import st_directory
from encoderx.models import embeddings, encoder, model_config

logger = logging.getLogger("encoderx")

HF_PREFIX = "hf:"


class InitError(errors.UserError, ValueError):
  """An init_from source that cannot be read, or whose weights do not fit the run."""
  argument = "init_from"


@dataclasses.dataclass(frozen=True)
class Source:
  """Where init_from points: its architecture and vocabulary, its weights on request."""
  name: str
  model: dict  # config.model fields by path ('attention.window': model_config.flat)
  vocab: dict  # config.data.vocab fields
  vocab_layout: str  # the vocabulary's layout (data/fields.py vocab_layout)

  def load_params(self) -> dict:
    """The transferable parameters (unscanned, without vocabulary padding rows), numpy
    arrays."""
    raise NotImplementedError

  def sentence_embedding(self) -> st_directory.SentenceEmbedding | None:
    """How the source embeds texts: a sentence-transformers directory's modules, an
    embedding run's head (its pooling, normalization, prompts, length); None for any
    other model. Read when embedding, so that a module encoderx cannot reproduce does
    not stop a run that only starts from the encoder."""
    return None


@dataclasses.dataclass(frozen=True)
class RunSource(Source):
  """An encoderx run: its work directory, a step (None: its latest) and its config."""
  workdir: str = ""
  step: int | None = None
  config: ml_collections.ConfigDict = None

  def load_params(self) -> dict:
    method = method_registry.build(self.config)
    _, params = run_weights(self.workdir, self.step, self.config, method)
    params = unscanned(method.transferable_params(params), self.config.model)
    return embeddings.resize_vocabulary(params, method.model_config.vocab_size)

  def load_optimizer_state(self, abstract_opt_state):
    """The run's optimizer state in the layout of `abstract_opt_state` (another run's,
    with shardings)."""
    try:
      return restore_state(self.workdir, self.step,
                           {"opt_state": abstract_opt_state})[1]["opt_state"]
    except (ValueError, KeyError, TypeError) as error:
      raise InitError(
          f"the optimizer state of {self.workdir} does not fit this run's "
          f"(init_from_optimizer needs the same method, model, heads, scan layout, "
          f"optimizer and train.ema_decay): {' '.join(str(error).split())[:300]}") from None

  def sentence_embedding(self):
    return st_directory.of_run_head(run_description(self.workdir, self.step),
                                    self.config.data.seq_length)


@dataclasses.dataclass(frozen=True)
class HfSource(Source):
  """A Hugging Face model directory of `family`, read from `directory` (a local copy of a
  remote one)."""
  directory: str = ""
  family: str = ""

  def load_params(self) -> dict:
    model = model_config.ModelConfig.from_config(model_config.nested(self.model))
    try:
      params, unused = hf_directory.convert(hf_directory.read_state_dict(self.directory),
                                            model, self.family,
                                            hf_directory.architecture(self.directory))
    except hf_directory.HfDirectoryError as error:
      raise InitError(str(error)) from None
    if unused:
      logger.info("init_from: Hugging Face weights with no use here: %s", ", ".join(unused))
    return params

  def sentence_embedding(self):
    return st_directory.read(self.directory)


def open_source(spec: str) -> Source:
  """The source `spec` names (a run's directory or checkpoint, or hf:DIR), read as far as
  its architecture and vocabulary. Raises InitError when it cannot be."""
  hf = spec.startswith(HF_PREFIX)
  given = files_lib.path(spec.removeprefix(HF_PREFIX))
  return _hf_source(given) if hf else _run_source(given)


def _run_source(given) -> RunSource:
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
  return RunSource(name=workdir, model=model_config.flat(config.model),
                   vocab=dict(config.data.vocab),
                   vocab_layout=data_fields.vocab_layout(config.data.vocab),
                   workdir=workdir, step=step, config=config)


def _hf_source(given) -> HfSource:
  name = str(given)
  if not given.is_dir():
    raise InitError(f"'{name}' is not a directory.")
  directory = files_lib.local_copy(name)  # safetensors and torch read local files only
  try:
    family, fields = hf_directory.read_config(directory)
    vocab = hf_directory.vocab_fields(directory, family)
    hf_directory.check_weights(directory)  # cut short: stop before the run builds anything
  except hf_directory.HfDirectoryError as error:
    raise InitError(str(error)) from None
  vocab["path"] = vocab["path"].replace(directory, name, 1)  # the run reads `name`
  return HfSource(name=f"{HF_PREFIX}{name} ({family})", model=fields, vocab=vocab,
                  vocab_layout=data_fields.vocab_layout(vocab), directory=directory,
                  family=family)


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


def unscanned(params: dict, model) -> dict:
  """`params` of a model of config.model `model` with one entry per layer (a scanned
  model's stack taken apart)."""
  if model.layout.scan:
    return encoder.unstack_layers(params, model.num_layers)
  return params


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
  try:
    return _read_checkpoint(workdir, step, {"model": ocp.args.JsonRestore()})[1]["model"]
  except KeyError:  # orbax: the checkpoint has no such item
    raise InitError(f"{workdir}'s checkpoints record no description of the run (an "
                    "averaged run's hold its weights only), so how it embeds texts is "
                    "not known.") from None


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

"""Where a run's first parameters come from: applying config.init_from to a run.

Weights enter a run three ways: fresh initialization; resuming (the whole state of the
same run, encoderx/checkpoint.py); and `config.init_from` (the train command's
--init_from), parameters only, from another run or a Hugging Face directory, read by
encoderx/sources.py into a `sources.Source`.

`resolve(config)` is the one pass over the source: it opens it, checks it against the
config and returns what the run takes from it (`InitSource`): the config with the
source's encoder fields and vocabulary, and the source, whose weights `initial_state`
loads into the run's first state.

The source decides the architecture: the run takes its encoder's fields (config.model,
but for dropout, dtypes, scan and remat, which stay the run's, and for a rotary source
the rotary theta and the length: a context extension's) and its vocabulary
(config.data.vocab). A method that trains sentence embeddings (contrastive) also takes
the pooling and prompts of a source that embeds texts (a sentence-transformers
directory, an embedding run), as its take_sentence_embedding says. With
`config.init_from_optimizer` (a run as the source) the
run also continues the source's optimizer state (moments, their update counts, the
moving average of the weights) under its own, restarted, schedule: ModernBERT's
context extension and decay phases (AnswerDotAI/ModernBERT main.py: `load_path` with
`reset_time` and `restart_override`). Then the source's encoder is taken whole, each
head of the run that the source has with the same shapes is taken, and the run's other
heads start fresh. What the source has and the run does not use (e.g. pretraining heads
when fine-tuning) is listed; an encoder weight that does not fit is an error, since the
encoder is what the run is meant to start from.
"""
from __future__ import annotations

import dataclasses
import logging

import flax
import jax
import ml_collections
import numpy as np

from encoderx import optim, sources
from encoderx.hf import st_directory
from encoderx.methods import registry as method_registry
from encoderx.models import embeddings, encoder, model_config

logger = logging.getLogger("encoderx")

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


@dataclasses.dataclass(frozen=True)
class InitSource:
  """What a run takes from config.init_from (`resolve`): the run's config with the
  source's encoder fields and vocabulary, and the source whose weights the first state
  loads (None: a fresh start)."""
  config: ml_collections.ConfigDict
  source: sources.Source | None


def resolve(config: ml_collections.ConfigDict) -> InitSource:
  """What the run of `config` takes from config.init_from, in one pass: the source opened
  (its config, vocabulary and where its weights are; nothing loaded yet) and checked
  against the config, and the config with the source's encoder fields and vocabulary.
  A fresh start (no init_from) takes nothing."""
  if not config.init_from:
    return InitSource(config, None)
  source = sources.open_source(config.init_from)
  _check_vocabulary(config, source)
  config = _with_source_fields(config, source)
  _take_sentence_embedding(config, source)
  return InitSource(config, source)


def resolve_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The config with config.init_from's encoder fields and vocabulary (unchanged when
  it starts fresh): `resolve(config).config`."""
  return resolve(config).config


def _with_source_fields(config, source: sources.Source) -> ml_collections.ConfigDict:
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


def _take_sentence_embedding(config, source: sources.Source) -> None:
  """A method that trains sentence embeddings takes the pooling and prompts of a source
  that embeds texts (a sentence-transformers directory, an embedding run), as the
  method's take_sentence_embedding decides. A way of embedding encoderx does not
  reproduce (a Dense module, max pooling), or a run that recorded none (an averaged
  run), leaves the run's, with a warning: the run still starts from the encoder."""
  method = method_registry.method_class(config.method)
  if not method.trains_sentence_embeddings:
    return  # the source's way of embedding is not even read
  try:
    embedding = source.sentence_embedding()
  except (st_directory.StDirectoryError, sources.InitError) as error:
    logger.warning("init_from %s: its sentence embedding is not taken (%s); the run's "
                   "pooling and prompts stay", source.name, error)
    return
  if embedding is None:
    return
  pooling = st_directory.MODE_POOLINGS.get(embedding.pooling, embedding.pooling)
  changed = method.take_sentence_embedding(config, pooling, embedding.prompts)
  if changed:
    logger.info("init_from %s: taking its sentence embedding (%s)", source.name,
                ", ".join(changed))


def _check_vocabulary(config, source: sources.Source) -> None:
  """A config that names its vocabulary's layout (data.vocab.layout: ModernBERT's,
  EuroBERT's, DeBERTa's) pretrains its family: a source with another vocabulary is a
  model of another family, refused in one line rather than trained under this config's
  choices (fine-tuning configs name none and take any family)."""
  layout = config.data.vocab.get("layout", "")
  theirs = (source.vocab["kind"], source.vocab_layout)
  if layout and theirs != (config.data.vocab.kind, layout):
    raise sources.InitError(
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
  taken from it. Raises sources.InitError when an encoder parameter is missing,
  unexpected or of another shape."""
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
    raise sources.InitError("the source's encoder does not fit this run's: "
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
  run_params = sources.unscanned(method.transferable_params(fresh), config.model)
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

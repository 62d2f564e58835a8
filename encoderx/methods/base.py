"""What a training method is to the trainer (methods/registry.py picks one by name).

The trainer and its loop (encoderx/train/: trainer.py, loop.py) keep what every run shares:
mesh and shardings, jit, gradient accumulation, optimizers, schedule and clipping,
checkpoints, resume, signals, logs and progress. Everything else (the models, their
inputs, losses and metrics) is a `Method`, chosen by `config.method`:

    pretrain    MLM with optional NSP / SOP / SBO terms (BERT, RoBERTa, ALBERT, SpanBERT)
    electra     replaced-token detection: generator + discriminator (ELECTRA, DeBERTa-v3)
    xlnet       permutation language modelling with memory (XLNet)
    classify    single-sentence and sentence-pair classification (fine-tuning)
    tag         token classification (NER, POS) from CoNLL files or TFDS
    qa          extractive question answering (SQuAD v1.1 / v2.0)
    similarity  sentence-pair regression (STS-B)
    simcse      contrastive sentence embeddings (SimCSE, unsupervised or supervised)
    contrastive embedding models as sentence-transformers trains them (MNRL over the
                global batch, GradCache, Matryoshka, prompts)
    rerank      cross-encoder rerankers of (query, document) pairs (binary, listwise,
                distillation from a teacher's scores)

Methods live in encoderx/methods/, one module each, and declare the config sections they
read (`config_fields`): the schema (encoderx/config.py) is assembled from them. The core
imports none of them: the registry holds import paths and loads the module a config
names (`registry.register` adds one from outside the package).

One train step, all inside one jax.jit:

    batch = method.prepare(batch, key, step)       # e.g. masking, on the whole batch
    denominators = method.denominators(batch)      # loss divisors, on the whole batch
    for update in method.updates:                  # usually one
      loss, output = method.loss(params, state, micro_batch, key, denominators,
                                 update, carry)    # per micro-batch, gradients added
      params[update.groups] <- update's optimizer

Loss sums are divided by denominators counted on the whole batch, so that gradient
accumulation over micro-batches gives exactly the gradient of the whole batch.
"""
from __future__ import annotations

import abc
import dataclasses
from typing import Any, ClassVar

import flax
import jax
import ml_collections

from encoderx import errors
from encoderx.data import buckets
from encoderx.models import model_config as model_config_lib

def model_config(config: ml_collections.ConfigDict, vocabulary) -> model_config_lib.ModelConfig:
  """`config.model` resolved against the vocabulary (vocab_size 0: the vocabulary's)."""
  resolved = model_config_lib.ModelConfig.from_config(config.model, vocabulary.vocab_size)
  if resolved.vocab_size < vocabulary.vocab_size:
    raise errors.ConfigError(
        f"config field 'model.vocab_size': {resolved.vocab_size} is smaller than the "
        f"vocabulary's {vocabulary.vocab_size} tokens ({config.data.vocab.path}). Set it "
        "to 0 to use the vocabulary's size.")
  return resolved


def describe_model(model: model_config_lib.ModelConfig) -> dict:
  """A model's fields for checkpoint descriptions: those at their default value are left
  out (so that a checkpoint written before a field was added still matches), and so are
  dropout (a run may change it) and the family (it names the model for export, and runs
  older than the field are resumed by configs that set it); grouped as config.model is."""
  defaults = model_config_lib.flat(model_config_lib.ModelConfig())
  return model_config_lib.nested({
      path: value for path, value in model_config_lib.flat(model).items()
      if value != defaults[path]
      and path not in ("hidden_dropout", "attention.dropout", "family")})


@dataclasses.dataclass(frozen=True)
class Update:
  """One optimizer update of the train step.

  The gradient of the method's loss for this update, taken with respect to the parameter
  groups `groups` (top-level keys of the parameters; None: all of them), applied by the
  update's own optimizer (its own state; peak learning rate `learning_rate`, None:
  config.optimizer.learning_rate). Updates run in order, each seeing the parameters the
  earlier ones produced (DeBERTa-v3's decoupled generator and discriminator steps).
  """
  name: str = "all"
  groups: tuple[str, ...] | None = None
  learning_rate: float | None = None


@flax.struct.dataclass
class LossOutput:
  """What `Method.loss` returns besides the loss.

  sums   metric sums over the micro-batch (added over micro-batches; `summarize` turns
         them into means)
  state  the method state after this micro-batch (the state it was given if unchanged)
  carry  anything a later update's loss needs from this one for the same micro-batch
         (e.g. the generator's samples); None if nothing
  """
  sums: Any
  state: Any
  carry: Any = None


class Method(abc.ABC):
  """A training method. Subclasses set `name` and implement the abstract methods."""
  name: ClassVar[str]
  # Where --predict writes by default, in the work directory.
  prediction_file: ClassVar[str] = "predictions.tsv"
  # True when the method state holds one row per example ([batch, ...] leaves, e.g. a
  # memory of the previous segment): gradient accumulation then splits it with the batch.
  per_example_state: ClassVar[bool] = False
  # The config sections that decide what the method trains on and toward (its data, its
  # objective): a run resumed with any of their fields changed is refused unless
  # --allow_config_change (the checkpoint records them, see Trainer.describe).
  config_sections: ClassVar[tuple[str, ...]] = ("data",)
  # True when the method's batches may be cut to finetune.length_buckets (their padding is
  # masked everywhere: encoderx/data/buckets.py).
  cuts_to_buckets: ClassVar[bool] = False

  def __init__(self, config: ml_collections.ConfigDict):
    self.config = config

  @property
  def updates(self) -> tuple[Update, ...]:
    """The optimizer updates of one train step, in order (default: one, all params)."""
    return (Update(),)

  @classmethod
  def config_fields(cls) -> dict[str, ml_collections.ConfigDict]:
    """The config sections this method declares (section name -> its fields with their
    defaults): encoderx/config.py's schema is the core's sections plus every registered
    method's. Methods that share a section return the same one."""
    return {}

  @classmethod
  def validate(cls, config: ml_collections.ConfigDict) -> None:
    """Checks the config fields this method reads; raises errors.ConfigError."""

  # A method that trains sentence embeddings (contrastive) takes a source's way of
  # embedding texts when it starts from one (initialize.py): take_sentence_embedding.
  trains_sentence_embeddings = False

  @classmethod
  def take_sentence_embedding(cls, config: ml_collections.ConfigDict, pooling: str,
                              prompts: dict) -> list[str]:
    """Sets the config's pooling (finetune.pooling's name) and prompts (name -> prefix)
    to a source's as the method sees fit; returns the fields changed. Called only where
    trains_sentence_embeddings."""
    raise NotImplementedError(cls.__name__)

  # --- data ------------------------------------------------------------------------------
  @abc.abstractmethod
  def task(self):
    """The registered seqio Task whose 'train' and 'validation' splits feed the run (its
    output features are read at the phase's sequence length)."""

  def check_data(self) -> None:
    """Reads what it must to fail on bad input before anything compiles (user errors)."""

  # --- parameters ------------------------------------------------------------------------
  @abc.abstractmethod
  def init(self, key: jax.Array) -> dict:
    """{'params': ..., 'state': ...} created from `key`, leaves logically partitioned
    (nn.LogicallyPartitioned, e.g. from nn.with_logical_partitioning) so that the trainer
    can shard them; 'state' may be omitted."""

  # encoderx/export: the Hugging Face classes (Head names, encoderx/hf/) that
  # hold this method's parameters, by preference; empty: the family's most complete one.
  export_heads: tuple[str, ...] = ()

  def export_fields(self) -> dict:
    """Fields the exported model's config.json carries for the method's head (labels)."""
    return {}

  def reference_loss(self) -> str:
    """The loss as the reference library names it, for an exported model's card (e.g.
    sentence-transformers' 'MultipleNegativesRankingLoss'); '' where none is named."""
    return ""

  def transferable_params(self, params) -> dict:
    """The parameters another run can start from (`--init_from`), in the common layout:
    {'encoder_model': encoder, <head name>: head, ...}."""
    return params

  def with_transferable_params(self, params, transferable: dict):
    """`params` with the transferable part replaced (inverse of transferable_params)."""
    del params
    return transferable

  # --- the train step --------------------------------------------------------------------
  def host_batch(self, batch: dict, seq_length: int, rows_multiple: int = 1) -> dict:
    """A training batch as the train step takes it, made on the host from the pipeline's
    (numpy): cut to finetune.length_buckets (encoderx/data/buckets.py). `rows_multiple`:
    the data-parallel devices, which a batch's rows must fill evenly."""
    del rows_multiple  # cutting keeps the rows
    return buckets.cut(batch, self.config.finetune.length_buckets, seq_length)

  def host_batch_fields(self) -> tuple[str, ...]:
    """The config fields set that make `host_batch` reshape a process's own batch: with
    several processes each would reshape its rows its own way, so a run refuses them."""
    return ("finetune.length_buckets",) if self.config.finetune.length_buckets else ()

  def prepare(self, batch: dict, key: jax.Array, step: jax.Array | None = None) -> dict:
    """The whole global batch as the model needs it (masking, corruption), pure JAX.
    `step` is the train step (a traced int32: what changes over a run, such as the
    masking rate, is a function of it); None in evaluation."""
    del key, step
    return batch

  def denominators(self, batch: dict) -> Any:
    """What loss sums are divided by, counted on the whole prepared batch."""
    del batch
    return {}

  @abc.abstractmethod
  def loss(self, params, state, batch: dict, key: jax.Array, denominators, update: Update,
           carry) -> tuple[jax.Array, LossOutput]:
    """The loss of `update` on a (micro-)batch: sums / denominators, so that adding the
    micro-batches' losses gives the whole batch's. `key` is this micro-batch's (dropout);
    `carry` is what the previous update returned for it (None for the first)."""

  def summarize(self, sums) -> dict[str, jax.Array]:
    """Step metrics (means) from the sums of a whole batch."""
    return {}

  # --- evaluation ------------------------------------------------------------------------
  @abc.abstractmethod
  def evaluate(self, params, state, batch: dict, key: jax.Array) -> Any:
    """Evaluation outputs of one batch (jitted). Batches of a whole split come padded to
    full size, with `example_weight` 0.0 on the padding rows."""

  @abc.abstractmethod
  def summarize_evaluation(self, outputs: list) -> dict[str, float]:
    """Held-out metrics from the outputs of every evaluated batch (on the host)."""

  # --- phases, identity ------------------------------------------------------------------
  def for_phase(self, phase) -> "Method":
    """The method as a training phase runs it (`phase.long`: BERT's long-sequence
    phase)."""
    del phase
    return self

  def describe(self) -> dict:
    """What a checkpoint must agree on to be resumed by this config (JSON-able)."""
    return {}

  # --- predictions (optional) ------------------------------------------------------------
  def predict(self, params, state, batch: dict) -> dict:
    """Per-example predictions of one batch (jitted)."""
    raise NotImplementedError(f"method '{self.name}' does not predict")

  def prediction_batches(self, path: str, batch_size: int):
    """(rows, padded batches of the file's examples) for `--predict`: a row per batch
    row (an example, or a window of one), in order."""
    raise NotImplementedError(f"method '{self.name}' does not predict")

  def write_predictions(self, rows: list, predictions: dict, path: str) -> int:
    """Writes the predictions ({name: [rows, ...]}) for `rows` to `path`; returns how
    many examples it wrote."""
    raise NotImplementedError(f"method '{self.name}' does not predict")

"""Replaced-token detection: ELECTRA, and DeBERTa-v3's RTD as the same method with options.

A generator (an MLM encoder, `config.rtd.generator_depth` x the layers and
`generator_width` x the hidden size, heads and FFN of `config.model`) predicts the
positions MLM masked (`config.objective.mlm`; ELECTRA's 15%, 85% [MASK] / 15% kept, no
random token); a token is sampled at each from its softmax (objectives/rtd.py); the
discriminator (`config.model`) reads the batch with the samples in place and learns which
tokens were replaced:

    loss = objective.weights.mlm x generator MLM + rtd.rtd_lambda x discriminator BCE

the BCE over every non-padding token (google-research/electra run_pretraining.py
`PretrainingModel`, `get_generator_config`; configure_pretraining.py for the defaults).
Both models are the encoder's own `PretrainingModel` (heads 'mlm' and 'rtd'); no copy of
the stack. Parameters: {'generator': {encoder_model, mlm_head}, 'discriminator':
{encoder_model, rtd_head[, embedding_deltas]}}.

Embedding sharing (`rtd.embedding_sharing`):
- "shared" (ELECTRA, one `electra/embeddings` scope in model/modeling.py): the token,
  position and type embeddings and the embedding LayerNorm are the generator's, used by
  both models; each projects them to its own width when that differs from the embedding
  size (`encoder_model/embeddings/projection`). Both losses train them when joint.
- "gdes" (DeBERTa-v3, gradient-disentangled embedding sharing; microsoft/DeBERTa
  DeBERTa/apps/tasks/rtd_task.py `RTDModel`, `register_discriminator_fw_hook`): the
  discriminator's word (and absolute position) embedding is stop_gradient(the
  generator's) + its own `embedding_deltas`, initialized at zero; its other embedding
  parameters are its own. The generator is trained by MLM only.

Training (`rtd.training`): "joint" (ELECTRA) is one optimizer update of the summed loss;
"decoupled" (DeBERTa's `decoupled_training`, rtd_task.py `get_decoupled_loss_fn`) is two
updates in the one jitted step: the generator's (MLM) then the discriminator's
(rtd_lambda x BCE) on the batch corrupted by the generator's samples, passed as the
update's `carry`, each with its own optimizer state and optionally its own peak learning
rate (`rtd.discriminator_learning_rate`). Under "shared" the discriminator's update does
not change the shared embeddings (they belong to the generator's group), as DeBERTa's
plain sharing in decoupled training.

Export and fine-tuning use the discriminator alone (`transferable_params`: under "gdes"
its word embedding is the generator's + the delta).
"""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import ml_collections

from encoderx import errors
from encoderx.methods import base as method_lib
from encoderx import objectives as objectives_lib
from encoderx.methods import pretrain
from encoderx.models import model_config
from encoderx.models import pretraining
from encoderx.objectives import rtd

GENERATOR, DISCRIMINATOR = "generator", "discriminator"
EMBEDDING_SHARING = ("shared", "gdes")
TRAINING = ("joint", "decoupled")
# The embedding parameters ELECTRA's two models share; each keeps its own projection.
SHARED_EMBEDDINGS = ("word_embeddings", "position_embeddings", "token_type_embeddings",
                     "layer_norm")
# The tables GDES shares through a delta (DeBERTa: word and position embeddings).
GDES_EMBEDDINGS = ("word_embeddings", "position_embeddings")
DELTAS = "embedding_deltas"


def generator_sizes(model, rtd_config) -> dict[str, int]:
  """The generator's layers, hidden size, heads and FFN size: the discriminator's (a
  ModelConfig or config.model) scaled by rtd.generator_depth and generator_width.
  ELECTRA's own rule (heads = hidden / 64, FFN = 4 x hidden) gives the same sizes at
  its configs' fractions: small 256 -> 64 wide, 1 head; base 768 -> 256, 4 heads."""
  width = rtd_config.generator_width
  return dict(num_layers=max(1, round(model.num_layers * rtd_config.generator_depth)),
              hidden_size=round(model.hidden_size * width),
              num_heads=max(1, round(model.num_heads * width)),
              intermediate_size=max(1, round(model.intermediate_size * width)))


def generator_config(model: model_config.ModelConfig, rtd_config) -> model_config.ModelConfig:
  """The generator's ModelConfig: the discriminator's with generator_sizes; the same
  embedding size (the tables are shared)."""
  return dataclasses.replace(model, **generator_sizes(model, rtd_config))


def _embeddings(params: dict) -> dict:
  return params["encoder_model"].get("embeddings", {})


def _with_embeddings(params: dict, embeddings: dict) -> dict:
  """`params` with these embedding parameters (none left: no 'embeddings' entry, since
  optax and flax drop empty subtrees)."""
  encoder_model = {k: v for k, v in params["encoder_model"].items() if k != "embeddings"}
  if embeddings:
    encoder_model["embeddings"] = embeddings
  return {**params, "encoder_model": encoder_model}


def config_section() -> ml_collections.ConfigDict:
  """config.rtd: a small generator, trained by MLM (config.objective.mlm), fills the masked
  positions with samples; the discriminator (config.model) learns which tokens were
  replaced."""
  return ml_collections.ConfigDict(dict(
      # The generator's layers, and its hidden size, heads and FFN size, as fractions of
      # the discriminator's (ELECTRA: depth 1, width 1/4 small, 1/3 base; DeBERTa-v3:
      # depth 1/2, width 1).
      generator_depth=1.0,
      generator_width=0.25,
      # loss = objective.weights.mlm x generator MLM + rtd_lambda x discriminator binary
      # cross-entropy over every non-padding token (ELECTRA 50, DeBERTa-v3 10).
      rtd_lambda=50.0,
      # "shared" (ELECTRA): one token, position and type embedding and embedding
      # LayerNorm, trained by both losses. "gdes" (DeBERTa-v3, gradient-disentangled):
      # the discriminator's word (and absolute position) embedding is stop_gradient(the
      # generator's) + its own delta initialized at zero, its other embedding parameters
      # its own; the generator is trained by MLM only.
      embedding_sharing="shared",
      # "joint" (ELECTRA): one optimizer update of the summed loss. "decoupled" (DeBERTa's
      # decoupled_training): the generator's update (MLM), then the discriminator's
      # (rtd_lambda x BCE) on the batch the generator corrupted, each with its own
      # optimizer state.
      training="joint",
      # The discriminator's peak learning rate when decoupled; 0: optimizer.learning_rate.
      discriminator_learning_rate=0.0,
  ))


class ReplacedTokenDetection(method_lib.Method):
  """ELECTRA's generator + discriminator (see the module docstring)."""
  name = "electra"
  config_sections = ("data", "objective", "rtd")

  @classmethod
  def config_fields(cls):
    return {"objective": objectives_lib.config_section(), "rtd": config_section()}

  def __init__(self, config, max_predictions: int | None = None):
    from encoderx.data import tasks  # pylint: disable=g-import-not-at-top
    super().__init__(config)
    self.vocabulary = tasks.build_vocabulary(config.data.vocab)
    # The discriminator's: what export, fine-tuning and --init_from see.
    self.model_config = method_lib.model_config(config, self.vocabulary)
    self.generator_config = generator_config(self.model_config, config.rtd)
    (self.mlm,) = objectives_lib.build(config.objective, self.vocabulary, max_predictions)
    self.generator = pretraining.PretrainingModel(self.generator_config, heads=("mlm",))
    self.discriminator = pretraining.PretrainingModel(self.model_config, heads=("rtd",))
    self.sharing = config.rtd.embedding_sharing
    self.mlm_weight = float(config.objective.weights.mlm)
    self.rtd_lambda = float(config.rtd.rtd_lambda)

  @classmethod
  def validate(cls, config) -> None:
    rtd_config, fail = config.rtd, errors.fail
    pretrain.validate_data(config)
    pretrain.validate_mlm(config)
    if tuple(config.objective.names) != ("mlm",):
      fail("objective.names", f"is {tuple(config.objective.names)}; the electra method's "
           "generator is trained by MLM alone.", "Set it to ('mlm',).")
    if config.data.builder == "sentence_pairs":
      fail("data.builder", "'sentence_pairs' builds NSP/SOP pairs, which electra does not "
           "train.", "Use 'doc_sentences' or 'full_sentences'.")
    if config.objective.weights.mlm < 0 or rtd_config.rtd_lambda < 0:
      fail("objective.weights.mlm" if config.objective.weights.mlm < 0 else
           "rtd.rtd_lambda", "must be >= 0.")
    errors.check_choice("rtd.embedding_sharing", rtd_config.embedding_sharing,
                            EMBEDDING_SHARING)
    errors.check_choice("rtd.training", rtd_config.training, TRAINING)
    for field in ("generator_depth", "generator_width"):
      if not 0.0 < rtd_config[field] <= 1.0:
        fail(f"rtd.{field}", f"must be in (0, 1], got {rtd_config[field]}.")
    sizes = generator_sizes(config.model, rtd_config)
    if sizes["hidden_size"] < 1 or sizes["hidden_size"] % sizes["num_heads"]:
      fail("rtd.generator_width", f"{rtd_config.generator_width} of model.hidden_size="
           f"{config.model.hidden_size} and model.num_heads={config.model.num_heads} gives "
           f"a generator of hidden size {sizes['hidden_size']} with {sizes['num_heads']} "
           "heads, which does not divide.", "Choose a fraction that keeps both whole.")
    if rtd_config.discriminator_learning_rate < 0 or (
        rtd_config.discriminator_learning_rate and rtd_config.training != "decoupled"):
      fail("rtd.discriminator_learning_rate", "must be >= 0, and is used only by "
           "rtd.training='decoupled' (joint training has one learning rate).")

  # --- data ------------------------------------------------------------------------------
  def task(self):
    from encoderx.data import tasks  # pylint: disable=g-import-not-at-top
    return tasks.register_pretraining_task(self.config)

  def check_data(self) -> None:
    pretrain.check_corpus(self.config)

  # --- parameters ------------------------------------------------------------------------
  def init(self, key: jax.Array) -> dict:
    """Both models initialized; the discriminator's shared embedding parameters removed
    ("shared") or replaced by zero deltas ("gdes")."""
    generator_key, discriminator_key = jax.random.split(key)
    generator = self.generator.init({"params": generator_key, "dropout": generator_key},
                                    pretraining.init_batch(1, 8, max_predictions=2))["params"]
    discriminator = self.discriminator.init(
        {"params": discriminator_key, "dropout": discriminator_key},
        pretraining.init_batch(1, 8))["params"]
    embeddings = dict(_embeddings(discriminator))
    deltas = {}
    for name in self._shared_names(embeddings):
      table = embeddings.pop(name)
      if self.sharing == "gdes":
        box = table["embedding"]
        deltas[name] = box.replace_boxed(jnp.zeros_like(box.unbox()))
    discriminator = _with_embeddings(discriminator, embeddings)
    if deltas:
      discriminator[DELTAS] = deltas
    return {"params": {GENERATOR: generator, DISCRIMINATOR: discriminator}}

  def _shared_names(self, embeddings: dict) -> list[str]:
    """The embedding parameters (present in `embeddings`) that come from the generator."""
    names = SHARED_EMBEDDINGS if self.sharing == "shared" else GDES_EMBEDDINGS
    return [name for name in names if name in embeddings]

  def discriminator_params(self, params, stop_gradient: bool = True) -> dict:
    """The discriminator's whole parameters {encoder_model, rtd_head}: its own with the
    generator's shared embeddings ("shared") or stop_gradient(generator's) + delta
    ("gdes"; `stop_gradient=False` outside differentiation, e.g. on numpy arrays)."""
    generator_embeddings = _embeddings(params[GENERATOR])
    own = dict(params[DISCRIMINATOR])
    deltas = own.pop(DELTAS, {})
    embeddings = dict(_embeddings(own))
    if self.sharing == "shared":
      embeddings.update({name: generator_embeddings[name]
                         for name in self._shared_names(generator_embeddings)})
    else:
      for name, delta in deltas.items():
        table = generator_embeddings[name]["embedding"]
        embeddings[name] = {"embedding": (jax.lax.stop_gradient(table) if stop_gradient
                                          else table) + delta}
    return _with_embeddings(own, embeddings)

  def transferable_params(self, params) -> dict:
    """The discriminator alone: what export, fine-tuning and --init_from take."""
    return self.discriminator_params(params, stop_gradient=False)

  def with_transferable_params(self, params, transferable: dict):
    """A discriminator's parameters put back: its shared embedding parameters become the
    generator's (under "gdes" with zero deltas, so that transferable_params gives them
    back exactly); the generator's layers and head stay as they are."""
    embeddings = dict(_embeddings(transferable))
    generator_embeddings = dict(_embeddings(params[GENERATOR]))
    deltas = {}
    for name in self._shared_names(embeddings):
      generator_embeddings[name] = embeddings.pop(name)
      if self.sharing == "gdes":
        deltas[name] = jnp.zeros_like(generator_embeddings[name]["embedding"])
    discriminator = _with_embeddings(transferable, embeddings)
    if deltas:
      discriminator[DELTAS] = deltas
    return {GENERATOR: _with_embeddings(params[GENERATOR], generator_embeddings),
            DISCRIMINATOR: discriminator}

  @property
  def updates(self) -> tuple[method_lib.Update, ...]:
    rtd_config = self.config.rtd
    if rtd_config.training == "joint":
      return (method_lib.Update(),)
    return (method_lib.Update(GENERATOR, groups=(GENERATOR,)),
            method_lib.Update(DISCRIMINATOR, groups=(DISCRIMINATOR,),
                              learning_rate=rtd_config.discriminator_learning_rate or None))

  # --- the train step --------------------------------------------------------------------
  def prepare(self, batch: dict, key: jax.Array, step: jax.Array | None = None) -> dict:
    """The generator's input: MLM masking (`objective.mlm`) of the whole batch."""
    return self.mlm.prepare(batch, key, step)

  def denominators(self, batch: dict) -> dict:
    return {"mlm": self.mlm.denominator(batch), "rtd": rtd.token_count(batch)}

  @staticmethod
  def _rngs(key):
    return None if key is None else {"dropout": key}

  def generate(self, params, batch: dict, dropout_key, sample_key) -> tuple[dict, dict]:
    """(the generator's MLM terms with 'sampled_correct', the discriminator's input:
    {'input_ids', 'rtd_labels'} [batch, length]). No dropout when `dropout_key` is None."""
    outputs = self.generator.apply({"params": params[GENERATOR]}, batch,
                                   deterministic=dropout_key is None,
                                   rngs=self._rngs(dropout_key))
    sampled = rtd.sample(outputs["mlm_logits"], sample_key)
    terms = {**self.mlm.terms(outputs, batch), **rtd.sample_terms(sampled, batch)}
    return terms, rtd.replace_with_samples(batch, sampled)

  def discriminate(self, params, batch: dict, corrupted: dict, dropout_key) -> dict:
    """The discriminator's terms on the corrupted batch (no dropout when the key is None)."""
    inputs = {**batch, "input_ids": corrupted["input_ids"]}
    logits = self.discriminator.apply({"params": self.discriminator_params(params)}, inputs,
                                      deterministic=dropout_key is None,
                                      rngs=self._rngs(dropout_key))["rtd_logits"]
    return rtd.terms(logits, corrupted["rtd_labels"], rtd.token_weights(batch))

  def loss(self, params, state, batch, key, denominators, update, carry):
    """Joint: both terms. Decoupled: the generator's update returns the corrupted batch
    as its carry; the discriminator's reads it."""
    generator_key, sample_key, discriminator_key = jax.random.split(key, 3)
    sums, loss = {}, 0.0
    if update.name != DISCRIMINATOR:
      sums["mlm"], carry = self.generate(params, batch, generator_key, sample_key)
      loss = self.mlm_weight * sums["mlm"]["loss_sum"] / denominators["mlm"]
    if update.name != GENERATOR:
      sums["rtd"] = self.discriminate(params, batch, carry, discriminator_key)
      loss += self.rtd_lambda * sums["rtd"]["loss_sum"] / denominators["rtd"]
    return loss, method_lib.LossOutput(sums=sums, state=state,
                                       carry=carry if update.name == GENERATOR else None)

  def summarize(self, sums) -> dict:
    return {**pretrain.summarize_terms(sums), **rtd.summarize(sums)}

  # --- evaluation ------------------------------------------------------------------------
  def evaluate(self, params, state, batch, key):
    """Both models' sums on a batch masked and sampled with `key`, without dropout."""
    del state
    prepare_key, sample_key = jax.random.split(key)
    batch = self.prepare(batch, prepare_key)
    mlm_terms, corrupted = self.generate(params, batch, None, sample_key)
    return {"mlm": mlm_terms, "rtd": self.discriminate(params, batch, corrupted, None)}

  def summarize_evaluation(self, outputs: list) -> dict[str, float]:
    totals = jax.tree_util.tree_map(lambda *xs: sum(xs), *outputs)
    metrics = {k: float(v) for k, v in self.summarize(totals).items()}
    metrics["mlm_perplexity"] = math.exp(min(metrics["mlm_loss"], 50.0))
    return metrics

  # --- phases, identity ------------------------------------------------------------------
  def for_phase(self, phase) -> "ReplacedTokenDetection":
    if not phase.long:
      return self
    return ReplacedTokenDetection(self.config, self.config.objective.mlm.long_max_predictions)

  def describe(self) -> dict:
    rtd_config = self.config.rtd
    return {"model": method_lib.describe_model(self.model_config),
            "generator": generator_sizes(self.model_config, rtd_config),
            "embedding_sharing": rtd_config.embedding_sharing,
            "training": rtd_config.training}

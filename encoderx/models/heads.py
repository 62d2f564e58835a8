"""Pretraining heads: masked-LM and span boundary (both scored against the token
embedding), sentence-level, and replaced-token detection (ELECTRA's discriminator); the
pooler (the sentence representation of the classifiers) and `pool`."""
from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from encoderx import errors
from encoderx.models import common, embeddings as embeddings_lib


# What the pooler reads (Pooler below): the first token, the mean of the real tokens, or
# ("late") every token, its outputs then averaged.
CLASSIFIER_POOLINGS = ("first_token", "mean", "late")


@dataclasses.dataclass(frozen=True)
class HeadsConfig:
  """config.model.heads: the MLM head, the pooler and the task heads' shared parts."""
  # The pooler's activation on its dense ([CLS]): BERT's tanh; ELECTRA's classification
  # head applies GELU (google-research/electra, Hugging Face ElectraClassificationHead).
  pooler_act: str = "tanh"
  # Which tokens the pooler reads (CLASSIFIER_POOLINGS), and a norm after its activation
  # (ModernBERT's ModernBertPredictionHead).
  pooling: str = "first_token"
  pooler_norm: bool = False
  # The token classification and extractive QA heads apply the pooler's transform
  # (dense, pooler_act, norm) to every token before their classifier (ModernBERT).
  token_transform: bool = False
  # Biases, as Hugging Face's ModernBERT names them: of the MLM head's output over the
  # vocabulary (decoder_bias), and of the dense of the MLM head's transform and of the
  # pooler (classifier_bias). The task classifiers always have theirs.
  decoder_bias: bool = True
  classifier_bias: bool = True
  # The MLM head scores against the word embedding (True) or a table of its own (its
  # `output_embeddings`; EuroBERT's untied lm_head).
  tie_word_embeddings: bool = True
  # The MLM head's transform (dense + hidden_act + norm, BERT, ModernBERT) before the
  # scores; False: the encoder's output is scored directly (EuroBERT).
  mlm_transform: bool = True
  # DeBERTa's enhanced mask decoder: absolute positions enter only before the MLM head,
  # which sees the last layer re-run with them in its queries (encoderx/models/
  # pretraining.py). Needs a position table, created even with embeddings.position
  # "none".
  enhanced_mask_decoder: bool = False


def validate(model) -> None:
  """config.model.heads' fields."""
  heads = model.heads
  errors.check_choice("model.heads.pooler_act", heads.pooler_act, tuple(common.ACTIVATIONS))
  errors.check_choice("model.heads.pooling", heads.pooling, CLASSIFIER_POOLINGS)
  if heads.enhanced_mask_decoder:
    if model.embeddings.size not in (0, model.hidden_size):
      errors.fail("model.heads.enhanced_mask_decoder", "adds position embeddings to hidden "
                  "states; it needs model.embeddings.size = hidden_size, got "
                  f"{model.embeddings.size}.")
    if (model.embeddings.position == "rotary" or model.attention.window
        or model.norm.position == "pre"):
      errors.fail("model.heads.enhanced_mask_decoder", "re-runs the last post-norm layer "
                  "on a query stream of absolute positions; it does not take rotary "
                  "positions, local attention or pre-norm layers.")


def gather_positions(hidden: jax.Array, positions: jax.Array) -> jax.Array:
  """[batch, length, hidden], [batch, n] -> [batch, n, hidden]."""
  return jnp.take_along_axis(hidden, positions[..., None], axis=1)


def pool(hidden: jax.Array, segment_ids: jax.Array, pooling: str) -> jax.Array:
  """[batch, length, hidden] -> [batch, hidden]: the first token ('first_token', [CLS]),
  the last real token ('last_token', as sentence-transformers' Pooling
  (pooling_mode_lasttoken) of right-padded rows), or the mean over the real tokens,
  special ones included ('mean', as sentence-transformers' Pooling
  (pooling_mode_mean_tokens) over the attention mask, and Hugging Face's
  ModernBertForSequenceClassification with classifier_pooling 'mean')."""
  if pooling == "first_token":
    return hidden[:, 0]
  if pooling == "last_token":
    last = jnp.maximum(jnp.sum(segment_ids > 0, axis=1) - 1, 0)
    return jnp.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0]
  real = (segment_ids > 0).astype(hidden.dtype)[..., None]
  return (hidden * real).sum(axis=1) / jnp.maximum(real.sum(axis=1), 1e-9)


def pool_packed(hidden: jax.Array, token_text: jax.Array, text_start: jax.Array,
                text_end: jax.Array, pooling: str) -> jax.Array:
  """`pool` of each text of packed rows (encoderx/data/packed_texts.py): hidden [rows,
  length, hidden], token_text [rows, length] (the text of each token; texts for
  padding), text_start and text_end [texts] (each text's first and last token in the
  rows' flattened tokens) -> [texts, hidden]."""
  flat = hidden.reshape(-1, hidden.shape[-1])
  if pooling == "first_token":
    return flat[text_start]
  if pooling == "last_token":
    return flat[text_end]
  texts = text_start.shape[0]
  owner = token_text.reshape(-1)
  sums = jax.ops.segment_sum(flat, owner, num_segments=texts + 1)[:texts]
  counts = jax.ops.segment_sum(jnp.ones_like(owner, hidden.dtype), owner,
                               num_segments=texts + 1)[:texts]
  return sums / jnp.maximum(counts, 1e-9)[:, None]


def _transform(config: model_config.ModelConfig, x: jax.Array, features: int, dense_name: str,
               norm_name: str, role: str = "in") -> jax.Array:
  """Dense (its bias as model.heads.classifier_bias) + activation + norm (created in the
  calling module's scope)."""
  x = common.dense(config, features, ("embed", "mlp"), dense_name, config.heads.classifier_bias,
                   role)(x)
  # Pinned to the hidden layout (features whole on each device). Left to XLA's sharding
  # propagation, the features come out split over 'tensor' like the kernel, and on a
  # data x fsdp x tensor mesh with one example per data-parallel device the backward
  # pass of the LayerNorm and tied scores that follow was computed wrong (XLA CPU, jax
  # 0.10.2; tests/test_training.py checks that case against one device).
  x = common.constrain_hidden(x)
  return common.norm(config, norm_name)(common.ACTIVATIONS[config.hidden_act](x))


def _tied_scores(module: nn.Module, x: jax.Array,
                 embeddings: embeddings_lib.Embeddings) -> jax.Array:
  """Scores of [..., embedding] against every token embedding, + the module's own bias."""
  return embeddings.attend(x, embeddings_lib.output_bias(module, module.config))


class MlmHead(nn.Module):
  """Dense + activation + norm (model.heads.mlm_transform), then scores against the token
  embedding (or, model.heads.tie_word_embeddings False, a table of its own) + bias
  (model.heads.decoder_bias).

  BERT's (cls.predictions); ModernBERT's is the same (ModernBertPredictionHead then the
  tied decoder, transformers models/modernbert/modeling_modernbert.py
  ModernBertForMaskedLM); EuroBERT's scores the encoder's output with its own lm_head
  (EuroBertForMaskedLM). It runs on the gathered masked positions only ([batch,
  predictions, hidden]), which is what makes the vocabulary projection cheap.
  """
  config: model_config.ModelConfig

  @nn.compact
  def __call__(self, hidden: jax.Array, embeddings: embeddings_lib.Embeddings) -> jax.Array:
    config = self.config
    x = hidden
    if config.heads.mlm_transform:
      x = _transform(config, x, config.embeddings.size, "transform", "layer_norm", "out")
    bias = embeddings_lib.output_bias(self, config) if config.heads.decoder_bias else None
    if config.heads.tie_word_embeddings:
      return embeddings.attend(x, bias)
    table = embeddings_lib.Embed(
        config.padded_vocab_size, x.shape[-1], dtype=config.compute_dtype,
        param_dtype=config.weights_dtype,
        embedding_init=common.initializer(config, ("vocab", "embed"), config.vocab_size,
                                          role="out"),
        name=embeddings_lib.OUTPUT_EMBEDDINGS)
    return embeddings_lib.vocabulary_scores(config, x, table.embedding, bias)


class SboHead(nn.Module):
  """SpanBERT's span boundary head: a masked token from its unit's boundaries alone.

  For a prediction at offset i inside the unit s..e:
  h = [x_{s-1}; x_{e+1}; p_i] (the encoder's outputs at the tokens just outside the unit
  and a learned embedding of the offset), then two layers of Dense + activation +
  LayerNorm, then scores against the token embedding + bias, like MlmHead. Sizes are
  SpanBERT's: `max_offsets` offsets (the rare larger ones share the last) of width
  `position_size`. [batch, length, hidden] and [batch, predictions] (positions, positions,
  offsets) -> [batch, predictions, vocab].
  """
  config: model_config.ModelConfig
  max_offsets: int = 20
  position_size: int = 200

  @nn.compact
  def __call__(self, hidden: jax.Array, left: jax.Array, right: jax.Array,
               offsets: jax.Array, embeddings: embeddings_lib.Embeddings) -> jax.Array:
    config = self.config
    position_embeddings = embeddings_lib.Embed(
        self.max_offsets, self.position_size, dtype=config.compute_dtype,
        param_dtype=config.weights_dtype,
        embedding_init=common.initializer(config, ("positions", "embed")),
        name="position_embeddings")
    x = jnp.concatenate([gather_positions(hidden, left), gather_positions(hidden, right),
                         position_embeddings(jnp.minimum(offsets, self.max_offsets - 1))],
                        axis=-1)
    x = _transform(config, x, config.hidden_size, "transform_1", "layer_norm_1")
    x = _transform(config, x, config.embeddings.size, "transform_2", "layer_norm_2")
    return _tied_scores(self, x, embeddings)


class Pooler(nn.Module):
  """The sentence representation of the classifiers: the `transform` act(Dense(x)), act
  model.heads.pooler_act (BERT's tanh), then a norm with model.heads.pooler_norm, of the tokens
  model.heads.pooling picks: [batch, length, hidden] -> [batch, hidden].

  'first_token' ([CLS]: BERT's pooler) or 'mean' (of the real tokens, `pool`) pool
  before the transform; 'late' transforms every token and averages after (EuroBERT's
  classifier_pooling 'late' averages the classifier's logits of every token, the same
  since the classifier is affine). ModernBERT's ModernBertPredictionHead is the
  transform with its norm (model.heads.pooler_norm) and the dense's bias as
  model.heads.classifier_bias; EuroBertForSequenceClassification's dense + GELU is it without.
  """
  config: model_config.ModelConfig

  def setup(self):
    config = self.config
    self.dense = common.dense(config, config.hidden_size, ("embed", "mlp"), "dense",
                              config.heads.classifier_bias, role="out")
    if config.heads.pooler_norm:
      self.layer_norm = common.norm(config, "layer_norm")

  def transform(self, x: jax.Array) -> jax.Array:
    """[..., hidden] -> [..., hidden]: dense, activation, norm (model.heads.pooler_norm)."""
    x = common.ACTIVATIONS[self.config.heads.pooler_act](self.dense(x))
    return self.layer_norm(x) if self.config.heads.pooler_norm else x

  def __call__(self, hidden: jax.Array, segment_ids: jax.Array | None = None) -> jax.Array:
    """`segment_ids` [batch, length] (their real tokens) for 'mean' and 'late'."""
    pooling = self.config.heads.pooling
    if pooling == "late":
      return pool(self.transform(hidden), segment_ids, "mean")
    return self.transform(pool(hidden, segment_ids, pooling))


class SentenceHead(nn.Module):
  """Two-way classifier on the pooled [CLS] (NSP, SOP): [batch, hidden] -> [batch, 2]."""
  config: model_config.ModelConfig

  @nn.compact
  def __call__(self, pooled: jax.Array) -> jax.Array:
    return common.dense(self.config, 2, ("mlp", None), "classifier")(pooled)


class RtdHead(nn.Module):
  """ELECTRA's discriminator head: Dense(hidden) + activation + Dense(1), the score that a
  token was replaced: [batch, length, hidden] -> [batch, length] logits.

  google-research/electra run_pretraining.py `_get_discriminator_output`; Hugging Face
  `ElectraDiscriminatorPredictions` (dense, dense_prediction).
  """
  config: model_config.ModelConfig

  @nn.compact
  def __call__(self, hidden: jax.Array) -> jax.Array:
    config = self.config
    x = common.dense(config, config.hidden_size, ("embed", "mlp"), "transform")(hidden)
    x = common.constrain_hidden(x)  # pinned to the hidden layout, as in _transform
    x = common.ACTIVATIONS[config.hidden_act](x)
    return common.dense(config, 1, ("mlp", None), "classifier")(x)[..., 0]

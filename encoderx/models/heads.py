"""Pretraining heads: masked-LM and span boundary (both tied to the token embedding),
sentence-level, and replaced-token detection (ELECTRA's discriminator)."""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from encoderx.models import common, embeddings as embeddings_lib


def gather_positions(hidden: jax.Array, positions: jax.Array) -> jax.Array:
  """[batch, length, hidden], [batch, n] -> [batch, n, hidden]."""
  return jnp.take_along_axis(hidden, positions[..., None], axis=1)


def _transform(config: common.ModelConfig, x: jax.Array, features: int, dense_name: str,
               norm_name: str) -> jax.Array:
  """Dense + activation + LayerNorm (created in the calling module's scope)."""
  x = common.dense(config, features, ("embed", "mlp"), dense_name)(x)
  # Pinned to the hidden layout (features whole on each device). Left to XLA's sharding
  # propagation, the features come out split over 'tensor' like the kernel, and on a
  # data x fsdp x tensor mesh with one example per data-parallel device the backward
  # pass of the LayerNorm and tied scores that follow was computed wrong (XLA CPU, jax
  # 0.10.2; tests/test_training.py checks that case against one device).
  x = common.constrain_hidden(x)
  return common.layer_norm(config, norm_name)(common.ACTIVATIONS[config.hidden_act](x))


def _tied_scores(module: nn.Module, x: jax.Array,
                 embeddings: embeddings_lib.Embeddings) -> jax.Array:
  """Scores of [..., embedding] against every token embedding, + the module's own bias."""
  return embeddings.attend(x, embeddings_lib.output_bias(module, module.config))


class MlmHead(nn.Module):
  """Dense + activation + LayerNorm, then scores against the token embedding + bias.

  It runs on the gathered masked positions only ([batch, predictions, hidden]), which
  is what makes the vocabulary projection cheap.
  """
  config: common.ModelConfig

  @nn.compact
  def __call__(self, hidden: jax.Array, embeddings: embeddings_lib.Embeddings) -> jax.Array:
    x = _transform(self.config, hidden, self.config.embedding_size, "transform", "layer_norm")
    return _tied_scores(self, x, embeddings)


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
  config: common.ModelConfig
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
    x = _transform(config, x, config.embedding_size, "transform_2", "layer_norm_2")
    return _tied_scores(self, x, embeddings)


class Pooler(nn.Module):
  """act(Dense(hidden at [CLS])), act model.pooler_act (BERT's tanh):
  [batch, length, hidden] -> [batch, hidden]."""
  config: common.ModelConfig

  @nn.compact
  def __call__(self, hidden: jax.Array) -> jax.Array:
    dense = common.dense(self.config, self.config.hidden_size, ("embed", "mlp"), "dense")
    return common.ACTIVATIONS[self.config.pooler_act](dense(hidden[:, 0]))


class SentenceHead(nn.Module):
  """Two-way classifier on the pooled [CLS] (NSP, SOP): [batch, hidden] -> [batch, 2]."""
  config: common.ModelConfig

  @nn.compact
  def __call__(self, pooled: jax.Array) -> jax.Array:
    return common.dense(self.config, 2, ("mlp", None), "classifier")(pooled)


class RtdHead(nn.Module):
  """ELECTRA's discriminator head: Dense(hidden) + activation + Dense(1), the score that a
  token was replaced: [batch, length, hidden] -> [batch, length] logits.

  google-research/electra run_pretraining.py `_get_discriminator_output`; Hugging Face
  `ElectraDiscriminatorPredictions` (dense, dense_prediction).
  """
  config: common.ModelConfig

  @nn.compact
  def __call__(self, hidden: jax.Array) -> jax.Array:
    config = self.config
    x = common.dense(config, config.hidden_size, ("embed", "mlp"), "transform")(hidden)
    x = common.constrain_hidden(x)  # pinned to the hidden layout, as in _transform
    x = common.ACTIVATIONS[config.hidden_act](x)
    return common.dense(config, 1, ("mlp", None), "classifier")(x)[..., 0]

"""Pretraining heads: masked-LM (tied to the token embedding) and sentence-level."""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from encoderx.models import common, embeddings as embeddings_lib


def gather_positions(hidden: jax.Array, positions: jax.Array) -> jax.Array:
  """[batch, length, hidden], [batch, n] -> [batch, n, hidden]."""
  return jnp.take_along_axis(hidden, positions[..., None], axis=1)


class MlmHead(nn.Module):
  """Dense + activation + LayerNorm, then scores against the token embedding + bias.

  It runs on the gathered masked positions only ([batch, predictions, hidden]), which
  is what makes the vocabulary projection cheap.
  """
  config: common.ModelConfig

  @nn.compact
  def __call__(self, hidden: jax.Array, embeddings: embeddings_lib.Embeddings) -> jax.Array:
    config = self.config
    x = common.dense(config, config.embedding_size, ("embed", "mlp"), "transform")(hidden)
    x = common.ACTIVATIONS[config.hidden_act](x)
    x = common.layer_norm(config, "layer_norm")(x)
    bias = self.param("output_bias", common.zeros(("vocab",)), (config.vocab_size,),
                      config.weights_dtype)
    return embeddings.attend(x) + bias.astype(config.compute_dtype)


class Pooler(nn.Module):
  """tanh(Dense(hidden at [CLS])): [batch, length, hidden] -> [batch, hidden]."""
  config: common.ModelConfig

  @nn.compact
  def __call__(self, hidden: jax.Array) -> jax.Array:
    dense = common.dense(self.config, self.config.hidden_size, ("embed", "mlp"), "dense")
    return jnp.tanh(dense(hidden[:, 0]))


class SentenceHead(nn.Module):
  """Two-way classifier on the pooled [CLS] (NSP, SOP): [batch, hidden] -> [batch, 2]."""
  config: common.ModelConfig

  @nn.compact
  def __call__(self, pooled: jax.Array) -> jax.Array:
    return common.dense(self.config, 2, ("mlp", None), "classifier")(pooled)

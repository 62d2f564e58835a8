"""What every model module shares: the model config, initializers, dtypes, activations.

Parameters carry logical axis names (see encoderx/sharding.py for the table that maps
them to mesh axes); activations are constrained with the `activation_*` names.
"""
from __future__ import annotations

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

# Logical shape of the hidden states between layers: [batch, length, hidden].
HIDDEN_AXES = ("activation_batch", "activation_length", "activation_embed")

ACTIVATIONS = {
    "gelu": functools.partial(jax.nn.gelu, approximate=False),  # BERT's erf GELU
    "gelu_new": functools.partial(jax.nn.gelu, approximate=True),  # tanh (ALBERT, GPT-2)
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """`config.model` as a frozen (hashable) dataclass, with the vocabulary size resolved."""
  vocab_size: int
  hidden_size: int
  num_layers: int
  num_heads: int
  intermediate_size: int
  embedding_size: int
  hidden_act: str
  max_position_embeddings: int
  type_vocab_size: int
  hidden_dropout: float
  attention_dropout: float
  layer_norm_eps: float
  initializer_range: float
  layer_sharing: str
  scan_layers: bool
  remat: bool
  dtype: str
  param_dtype: str
  position_offset: int = 0  # added to position ids (RoBERTa: 2)

  @classmethod
  def from_config(cls, model_config, vocab_size: int | None = None) -> "ModelConfig":
    """From `config.model`; `vocab_size` fills a config whose vocab_size is 0."""
    fields = dict(model_config)
    if not fields["vocab_size"]:
      if not vocab_size:
        raise ValueError("config.model.vocab_size is 0 and no vocabulary size was given.")
      fields["vocab_size"] = vocab_size
    fields["embedding_size"] = fields["embedding_size"] or fields["hidden_size"]
    return cls(**fields)

  @property
  def compute_dtype(self):
    return jnp.dtype(self.dtype)

  @property
  def weights_dtype(self):
    return jnp.dtype(self.param_dtype)

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads


def initializer(config: ModelConfig, axes: tuple[str | None, ...]):
  """BERT's init, N(0, initializer_range) truncated at 2 standard deviations."""
  return nn.with_logical_partitioning(
      nn.initializers.truncated_normal(stddev=config.initializer_range), axes)


def zeros(axes):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), axes)


def dense(config: ModelConfig, features: int, axes: tuple[str, str], name: str) -> nn.Dense:
  """A Dense layer whose kernel [in, out] and bias [out] carry logical axes."""
  return nn.Dense(features, dtype=config.compute_dtype, param_dtype=config.weights_dtype,
                  kernel_init=initializer(config, axes), bias_init=zeros((axes[1],)),
                  name=name)


def layer_norm(config: ModelConfig, name: str, axis: str = "embed") -> nn.LayerNorm:
  # Two-pass variance: matches PyTorch to the last decimal where E[x^2]-E[x]^2 drifts.
  return nn.LayerNorm(epsilon=config.layer_norm_eps, dtype=config.compute_dtype,
                      param_dtype=config.weights_dtype, use_fast_variance=False,
                      scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(),
                                                              (axis,)),
                      bias_init=zeros((axis,)), name=name)


def constrain_hidden(x: jax.Array) -> jax.Array:
  return nn.with_logical_constraint(x, HIDDEN_AXES)

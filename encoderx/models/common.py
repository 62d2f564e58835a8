"""What every model module shares: initializers, norms, dtypes, activations, and the
model config's groups these read (`NormConfig`, `InitConfig`).

The model config (`ModelConfig`, encoderx/models/model_config.py) is the model's sizes
and one group of fields per concern, each group declared and checked beside the code
that reads it: model.norm and model.init here. `config` below is a ModelConfig.

Parameters carry logical axis names (see encoderx/sharding.py for the table that maps
them to mesh axes); activations are constrained with the `activation_*` names.
"""
from __future__ import annotations

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from encoderx import errors
from encoderx.models import contraction

# Logical shape of the hidden states between layers: [batch, length, hidden].
HIDDEN_AXES = ("activation_batch", "activation_length", "activation_embed")
# Logical shape of per-head activations: [batch, length, heads, head_dim].
HEADS_AXES = ("activation_batch", "activation_length", "activation_heads", "activation_kv")


def gelu(x: jax.Array) -> jax.Array:
  """The exact (erf) GELU as PyTorch writes it, x / 2 (1 + erf(x / sqrt(2))): the function
  of jax.nn.gelu's erfc form, which XLA:CPU computes slower (ModernBERT-tiny's CPU train
  step, GeGLU of 512: 92 ms with erfc, 90 with erf)."""
  return 0.5 * x * (1.0 + jax.lax.erf(x * jnp.asarray(0.5**0.5, x.dtype)))


ACTIVATIONS = {
    "gelu": gelu,  # BERT's erf GELU
    "gelu_new": functools.partial(jax.nn.gelu, approximate=True),  # tanh (ALBERT, GPT-2)
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
    "tanh": jnp.tanh,
}
NORMS = ("layer_norm", "rms_norm")
NORM_POSITIONS = ("post", "pre")
INITIALIZERS = ("bert", "megatron")


@dataclasses.dataclass(frozen=True)
class NormConfig:
  """config.model.norm: the norms of the encoder and heads (`norm()` below) and where
  the layers apply them (encoderx/models/encoder.py)."""
  # "layer_norm" (LayerNorm) or "rms_norm" (RMSNorm: no mean, no bias; EuroBERT), for
  # every norm of the encoder and heads but DeBERTa's relative table's; eps is either's
  # epsilon. The norm modules keep the name layer_norm whatever their kind, so that
  # parameter paths do not depend on it.
  kind: str = "layer_norm"
  # "post": BERT's layer, norm(x + block(x)); "pre": x + block(norm(x)), the
  # embeddings' norm as model.embeddings.layer_norm says and a final norm after the last
  # layer (ModernBERT, EuroBERT).
  position: str = "post"
  eps: float = 1e-12
  bias: bool = True  # the LayerNorms' bias (RMSNorm has none)
  # Pre-norm only. False: the first layer's attention takes its input without a norm,
  # its embeddings' norm serving (ModernBERT: Hugging Face's layer-0 attn_norm is
  # Identity; AnswerDotAI's skip_first_prenorm).
  first_attention: bool = True


def validate_norm(model) -> None:
  """config.model.norm's fields, and how they combine with the layout."""
  norm_config = model.norm
  errors.check_choice("model.norm.kind", norm_config.kind, NORMS)
  errors.check_choice("model.norm.position", norm_config.position, NORM_POSITIONS)
  if norm_config.kind == "rms_norm" and norm_config.bias:
    errors.fail("model.norm.bias", "RMSNorm has no bias (model.norm.kind='rms_norm').",
                "Set model.norm.bias=False.")
  if not norm_config.first_attention:
    if norm_config.position != "pre":
      errors.fail("model.norm.first_attention", "False is for pre-norm layers "
                  "(model.norm.position='pre').")
    if model.layout.sharing != "none":
      errors.fail("model.norm.first_attention", "False leaves the first layer without a "
                  "norm the others have; it cannot share its parameters (model.layout."
                  f"sharing={model.layout.sharing!r}).")
    if model.layout.scan and model.num_layers < 2:
      errors.fail("model.layout.scan", "scans the layers after the first (model.norm."
                  "first_attention=False); a single layer has none.")


@dataclasses.dataclass(frozen=True)
class InitConfig:
  """config.model.init: how weights are drawn (`initializer()` below)."""
  # Weights are drawn from N(0, std) truncated at `cutoff` standard deviations (0: not
  # truncated, EuroBERT's). "bert": std `range` everywhere; "megatron": std range /
  # sqrt(2 num_layers) for the projections back into the residual stream and the heads'
  # dense (attention out, feed-forward out, MLM transform, pooler, untied decoder) and
  # hidden_size^-0.5 for the task classifiers (ModernBERT: Hugging Face's
  # ModernBertPreTrainedModel._init_weights, AnswerDotAI's full_megatron in
  # src/bert_layers/initialization.py). Embeddings, the other projections and the norms
  # are initialized alike by both.
  scheme: str = "bert"
  range: float = 0.02
  cutoff: float = 2.0


def validate_init(model) -> None:
  """config.model.init's fields."""
  errors.check_choice("model.init.scheme", model.init.scheme, INITIALIZERS)
  if model.init.cutoff < 0:
    errors.fail("model.init.cutoff", "must be >= 0 (standard deviations; 0: not "
                f"truncated), got {model.init.cutoff}.")


# The standard deviation of a weight's init, by its role (model.init.scheme).
ROLES = ("in", "out", "final")


def init_std(config, role: str = "in") -> float:
  """The std of weights of `role`: 'in' (embeddings, projections out of the residual
  stream), 'out' (projections into it, the heads' dense), 'final' (task classifiers).
  All are model.init.range for model.init.scheme 'bert'; 'megatron' scales 'out' by
  1 / sqrt(2 num_layers) and sets 'final' to hidden_size^-0.5, as Hugging Face's
  ModernBertPreTrainedModel._init_weights (stds 'in', 'out', 'embedding', 'final_out')."""
  if config.init.scheme == "bert" or role == "in":
    return config.init.range
  if role == "out":
    return config.init.range / (2.0 * config.num_layers) ** 0.5
  return config.hidden_size ** -0.5


def initializer(config, axes: tuple[str | None, ...], rows: int | None = None,
                role: str = "in"):
  """N(0, init_std(role)) truncated at model.init.cutoff standard deviations (BERT's:
  2; 0: not truncated). With `rows`, only the first `rows` rows are drawn (as a table of
  that many rows would be) and the rows below are zeros (the vocabulary's padding
  rows)."""
  std, cutoff = init_std(config, role), config.init.cutoff
  init = (nn.initializers.truncated_normal(stddev=std, lower=-cutoff, upper=cutoff)
          if cutoff else nn.initializers.normal(stddev=std))
  if rows is None:
    return nn.with_logical_partitioning(init, axes)

  def zero_padded(key, shape, dtype=jnp.float32):
    table = init(key, (rows, *shape[1:]), dtype)
    return jnp.pad(table, [(0, shape[0] - rows)] + [(0, 0)] * (len(shape) - 1))
  return nn.with_logical_partitioning(zero_padded, axes)


def zeros(axes):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), axes)


def dense(config, features: int, axes: tuple[str, str], name: str,
          use_bias: bool = True, role: str = "in", transpose_input: bool = False) -> nn.Dense:
  """A Dense layer whose kernel [in, out] and bias [out] carry logical axes (its kernel
  gradient through `contraction.contract`, with its `transpose_input`); the kernel drawn
  as `initializer(role)`."""
  dot_general = (functools.partial(contraction.dot_general, transpose_input=True)
                 if transpose_input else contraction.dot_general)
  return nn.Dense(features, use_bias=use_bias, dtype=config.compute_dtype,
                  param_dtype=config.weights_dtype,
                  kernel_init=initializer(config, axes, role=role),
                  bias_init=zeros((axes[1],)), dot_general=dot_general, name=name)


def layer_norm(config, name: str, axis: str = "embed",
               use_bias: bool = True) -> nn.LayerNorm:
  """A LayerNorm over the last axis (scale [axis], bias [axis] with `use_bias`)."""
  # Two-pass variance: matches PyTorch to the last decimal where E[x^2]-E[x]^2 drifts.
  return nn.LayerNorm(epsilon=config.norm.eps, dtype=config.compute_dtype,
                      param_dtype=config.weights_dtype, use_fast_variance=False,
                      use_bias=use_bias,
                      scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(),
                                                              (axis,)),
                      bias_init=zeros((axis,)), name=name)


def norm(config, name: str, axis: str = "embed") -> nn.Module:
  """The model's norm (model.norm.kind): a LayerNorm (with a bias when model.norm.bias) or an
  RMSNorm, x / sqrt(mean(x^2) + eps) * scale, in float32 as Hugging Face's
  EuroBertRMSNorm computes it (then cast to the compute dtype)."""
  if config.norm.kind == "rms_norm":
    return nn.RMSNorm(epsilon=config.norm.eps, dtype=config.compute_dtype,
                      param_dtype=config.weights_dtype, use_fast_variance=False,
                      scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(),
                                                              (axis,)), name=name)
  return layer_norm(config, name, axis, use_bias=config.norm.bias)


def constrain_hidden(x: jax.Array) -> jax.Array:
  return nn.with_logical_constraint(x, HIDDEN_AXES)

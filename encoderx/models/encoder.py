"""The post-LayerNorm Transformer encoder stack of BERT, with its options.

- `attention`: the attention variant of every layer (encoderx/models/attention.py); a
  variant with a context module gets it built here, once, shared by all layers.
- `layer_sharing`: 'none'; 'all' (one layer applied num_layers times, ALBERT);
  'attention' or 'ffn' (that sublayer's parameters shared by every layer).
- `scan_layers`: distinct layers as one `nn.scan` (parameters stacked on a leading
  'layers' axis), which compiles once instead of num_layers times. `stack_layers` /
  `unstack_layers` turn a checkpoint's per-layer parameters into that layout and back
  (weight conversion and --init_from read and write the per-layer one).
- `remat`: recompute each layer's activations in the backward pass to save memory.

A layer takes an optional query stream (`query`, the shape of the hidden states): its
attention then takes queries (and the residual) from it and keys and values from the
hidden states. DeBERTa's enhanced mask decoder re-runs the last layer that way
(`Encoder.last_layer`, used by encoderx/models/pretraining.py).

The hidden state the layers carry is an array [batch, length, hidden] or a dict of
such streams (XLNet's content and query streams, {'h': [batch, length, hidden],
'g': [batch, predictions, hidden]}): every stream goes through the same residual,
LayerNorm and feed-forward parameters, and only the attention variant tells them apart.
`LayerContext.per_layer` gives each layer its own inputs (XLNet's memory), and the
stack can return what entered each layer (XLNet's memory, DeBERTa's last layer input).
"""
from __future__ import annotations

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from encoderx.models import attention, common
from encoderx.models import dropout as dropout_lib


def _each_stream(function, *trees):
  """`function` applied to every stream of the hidden state (an array or a dict)."""
  return jax.tree_util.tree_map(function, *trees)


class AttentionBlock(nn.Module):
  """The variant's attention + dropout + residual + LayerNorm."""
  config: common.ModelConfig

  @nn.compact
  def __call__(self, x, context: attention.LayerContext, deterministic: bool,
               query: jax.Array | None = None):
    """`query`, when given, is the query stream and the residual (see the module doc);
    the variant is then called with `query=` (only then: the others need not take it)."""
    config = self.config
    variant = attention.VARIANTS[config.attention]
    y = variant.attention(config, name="self_attention")(
        x, context, deterministic, **({} if query is None else {"query": query}))
    dropout = dropout_lib.Dropout(config.hidden_dropout)
    norm = common.layer_norm(config, "layer_norm")
    residual = x if query is None else query
    return _each_stream(lambda x, y: norm(x + dropout(y, deterministic=deterministic)),
                        residual, y)


class FeedForwardBlock(nn.Module):
  """Dense (hidden -> intermediate) + activation + Dense + dropout + residual + LN."""
  config: common.ModelConfig

  @nn.compact
  def __call__(self, x, deterministic: bool):
    config = self.config
    intermediate = common.dense(config, config.intermediate_size, ("embed", "mlp"),
                                "intermediate")
    output = common.dense(config, config.hidden_size, ("mlp", "embed"), "output")
    dropout = dropout_lib.Dropout(config.hidden_dropout)
    norm = common.layer_norm(config, "layer_norm")

    def feed_forward(x):
      y = common.ACTIVATIONS[config.hidden_act](intermediate(x))
      y = nn.with_logical_constraint(y, ("activation_batch", "activation_length",
                                         "activation_mlp"))
      return norm(x + dropout(output(y), deterministic=deterministic))

    return _each_stream(feed_forward, x)


class EncoderLayer(nn.Module):
  """One layer; either block may be a module shared with other layers."""
  config: common.ModelConfig
  shared_attention: nn.Module | None = None
  shared_ffn: nn.Module | None = None

  def setup(self):
    self.attention = self.shared_attention or AttentionBlock(self.config)
    self.ffn = self.shared_ffn or FeedForwardBlock(self.config)

  def __call__(self, x, context: attention.LayerContext, deterministic: bool,
               query: jax.Array | None = None):
    x = self.attention(x, context, deterministic, query)
    return _each_stream(common.constrain_hidden, self.ffn(x, deterministic))


class _ScannedLayer(nn.Module):
  """EncoderLayer in the (carry, inputs...) -> (carry, output) form nn.scan wants: the
  carry is the hidden state, `per_layer` this layer's slice of context.per_layer, and
  the output what entered the layer (when `collect`)."""
  config: common.ModelConfig

  @nn.compact
  def __call__(self, x, context, per_layer, deterministic, collect):
    layer = EncoderLayer
    if self.config.remat:
      layer = nn.remat(layer, static_argnums=(3,), prevent_cse=False)
    y = layer(self.config, name="layer")(x, context.replace(per_layer=per_layer),
                                         deterministic)
    return y, (x if collect else None)


class Encoder(nn.Module):
  """[batch, length, hidden] (or a dict of streams) -> the same, num_layers layers."""
  config: common.ModelConfig

  def setup(self):
    config = self.config
    context_module = attention.VARIANTS[config.attention].context
    if context_module is not None:
      self.relative = context_module(config)
    if config.scan_layers:
      self.layers = nn.scan(
          _ScannedLayer, variable_axes={"params": 0},
          split_rngs={"params": True, "dropout": True},
          in_axes=(nn.broadcast, 0, nn.broadcast, nn.broadcast), length=config.num_layers,
          metadata_params={nn.PARTITION_NAME: "layers"})(config)
      return
    # static_argnums counts self: (self, x, context, deterministic).
    layer = nn.remat(EncoderLayer, static_argnums=(3,)) if config.remat else EncoderLayer
    if config.layer_sharing == "all":
      self.layers = [layer(config, name="shared_layer")] * config.num_layers
      return
    shared = {}
    if config.layer_sharing == "attention":
      self.shared_attention = AttentionBlock(config)
      shared["shared_attention"] = self.shared_attention
    elif config.layer_sharing == "ffn":
      self.shared_ffn = FeedForwardBlock(config)
      shared["shared_ffn"] = self.shared_ffn
    self.layers = [layer(config, **shared, name=f"layer_{i}")
                   for i in range(config.num_layers)]

  def with_relative(self, context: attention.LayerContext,
                    deterministic: bool) -> attention.LayerContext:
    """The context with what the variant computes once per forward pass (`relative`)."""
    if attention.VARIANTS[self.config.attention].context is None or (
        context.relative is not None):
      return context
    return context.replace(relative=self.relative(context, deterministic))

  def __call__(self, x, context: attention.LayerContext, deterministic: bool,
               collect_layer_inputs: bool = False):
    """The stack's output; with `collect_layer_inputs`, (output, what entered each
    layer: the hidden state's leaves stacked on a leading [layers] axis). `context` may
    already hold `relative` (with_relative)."""
    context = self.with_relative(context, deterministic)
    per_layer, context = context.per_layer, context.replace(per_layer=None)
    if self.config.scan_layers:
      x, inputs = self.layers(x, context, per_layer, deterministic, collect_layer_inputs)
      return (x, inputs) if collect_layer_inputs else x
    inputs = []
    for index, layer in enumerate(self.layers):
      inputs.append(x)
      layer_context = context if per_layer is None else context.replace(
          per_layer=jax.tree_util.tree_map(lambda leaf, i=index: leaf[i], per_layer))
      x = layer(x, layer_context, deterministic)
    if not collect_layer_inputs:
      return x
    return x, jax.tree_util.tree_map(lambda *leaves: jnp.stack(leaves), *inputs)

  def last_layer(self, x: jax.Array, query: jax.Array, context: attention.LayerContext,
                 deterministic: bool) -> jax.Array:
    """The last layer applied again, with its own parameters, to keys and values `x`
    [batch, length, hidden] and the query stream `query` [batch, queries, hidden];
    `context` must hold `relative` (with_relative) and describe those queries
    (LayerContext.at_queries)."""
    if not self.config.scan_layers:
      return self.layers[-1](x, context, deterministic, query)
    # Scanned layers' parameters are stacked on a leading axis: apply the last slice.
    stacked = nn.unbox(self.layers.variables["params"]["layer"])
    params = jax.tree_util.tree_map(lambda p: p[-1], stacked)
    rngs = None if deterministic else {"dropout": self.make_rng("dropout")}
    return EncoderLayer(self.config, parent=None).apply(
        {"params": params}, x, context, deterministic, query, rngs=rngs)


# --- the checkpoint layout: per-layer parameters <-> the nn.scan layout ------------------
_LAYER = re.compile(r"^layer_(\d+)$")


def stack_layers(params: dict) -> dict:
  """Per-layer params (layer_0, layer_1, ...) -> the nn.scan layout (layers/layer); the
  encoder's other parameters (e.g. DeBERTa's relative table) stay as they are."""
  encoder = params["encoder_model"]["encoder"]
  layers = sorted((int(_LAYER.match(k).group(1)), v) for k, v in encoder.items()
                  if _LAYER.match(k))
  stacked = jax.tree_util.tree_map(lambda *xs: np.stack(xs), *[v for _, v in layers])
  others = {k: v for k, v in encoder.items() if not _LAYER.match(k)}
  return {**params, "encoder_model": {**params["encoder_model"],
                                      "encoder": {**others, "layers": {"layer": stacked}}}}


def unstack_layers(params: dict, num_layers: int) -> dict:
  """The nn.scan layout (layers/layer) -> per-layer params (layer_0, layer_1, ...)."""
  encoder = params["encoder_model"]["encoder"]
  layers = {f"layer_{i}": jax.tree_util.tree_map(lambda x, i=i: x[i], encoder["layers"]["layer"])
            for i in range(num_layers)}
  others = {k: v for k, v in encoder.items() if k != "layers"}
  return {**params, "encoder_model": {**params["encoder_model"],
                                      "encoder": {**others, **layers}}}

"""The post-LayerNorm Transformer encoder stack of BERT, with its options.

- `attention`: the attention variant of every layer (encoderx/models/attention.py); a
  variant with a context module gets it built here, once, shared by all layers.
- `layer_sharing`: 'none'; 'all' (one layer applied num_layers times, ALBERT);
  'attention' or 'ffn' (that sublayer's parameters shared by every layer).
- `scan_layers`: distinct layers as one `nn.scan` (parameters stacked on a leading
  'layers' axis), which compiles once instead of num_layers times.
- `remat`: recompute each layer's activations in the backward pass to save memory.

The hidden state the layers carry is an array [batch, length, hidden] or a dict of
such streams (XLNet's content and query streams, {'h': [batch, length, hidden],
'g': [batch, predictions, hidden]}): every stream goes through the same residual,
LayerNorm and feed-forward parameters, and only the attention variant tells them apart.
`LayerContext.per_layer` gives each layer its own inputs (XLNet's memory), and the
stack can return what entered each layer (what XLNet's memory keeps).
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from encoderx.models import attention, common


def _each_stream(function, *trees):
  """`function` applied to every stream of the hidden state (an array or a dict)."""
  return jax.tree_util.tree_map(function, *trees)


class AttentionBlock(nn.Module):
  """The variant's attention + dropout + residual + LayerNorm."""
  config: common.ModelConfig

  @nn.compact
  def __call__(self, x, context: attention.LayerContext, deterministic: bool):
    config = self.config
    variant = attention.VARIANTS[config.attention]
    y = variant.attention(config, name="self_attention")(x, context, deterministic)
    dropout = nn.Dropout(config.hidden_dropout)
    norm = common.layer_norm(config, "layer_norm")
    return _each_stream(lambda x, y: norm(x + dropout(y, deterministic=deterministic)), x, y)


class FeedForwardBlock(nn.Module):
  """Dense (hidden -> intermediate) + activation + Dense + dropout + residual + LN."""
  config: common.ModelConfig

  @nn.compact
  def __call__(self, x, deterministic: bool):
    config = self.config
    intermediate = common.dense(config, config.intermediate_size, ("embed", "mlp"),
                                "intermediate")
    output = common.dense(config, config.hidden_size, ("mlp", "embed"), "output")
    dropout = nn.Dropout(config.hidden_dropout)
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

  def __call__(self, x, context: attention.LayerContext, deterministic: bool):
    x = self.attention(x, context, deterministic)
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

  def __call__(self, x, context: attention.LayerContext, deterministic: bool,
               collect_layer_inputs: bool = False):
    """The stack's output; with `collect_layer_inputs`, (output, what entered each
    layer: the hidden state's leaves stacked on a leading [layers] axis)."""
    if attention.VARIANTS[self.config.attention].context is not None:
      context = context.replace(relative=self.relative(context, deterministic))
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

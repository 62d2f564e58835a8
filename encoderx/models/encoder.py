"""The post-LayerNorm Transformer encoder stack of BERT, with its options.

- `attention`: the attention variant of every layer (encoderx/models/attention.py); a
  variant with a context module gets it built here, once, shared by all layers.
- `layer_sharing`: 'none'; 'all' (one layer applied num_layers times, ALBERT);
  'attention' or 'ffn' (that sublayer's parameters shared by every layer).
- `scan_layers`: distinct layers as one `nn.scan` (parameters stacked on a leading
  'layers' axis), which compiles once instead of num_layers times.
- `remat`: recompute each layer's activations in the backward pass to save memory.

A layer takes an optional query stream (`query`, the shape of the hidden states): its
attention then takes queries (and the residual) from it and keys and values from the
hidden states. DeBERTa's enhanced mask decoder re-runs the last layer that way
(`Encoder.last_layer`, used by encoderx/models/pretraining.py).
"""
from __future__ import annotations

import flax.linen as nn
import jax

from encoderx.models import attention, common


class AttentionBlock(nn.Module):
  """The variant's attention + dropout + residual + LayerNorm."""
  config: common.ModelConfig

  @nn.compact
  def __call__(self, x: jax.Array, context: attention.LayerContext,
               deterministic: bool, query: jax.Array | None = None) -> jax.Array:
    config = self.config
    variant = attention.VARIANTS[config.attention]
    y = variant.attention(config, name="self_attention")(x, context, deterministic,
                                                         query=query)
    y = nn.Dropout(config.hidden_dropout)(y, deterministic=deterministic)
    return common.layer_norm(config, "layer_norm")((x if query is None else query) + y)


class FeedForwardBlock(nn.Module):
  """Dense (hidden -> intermediate) + activation + Dense + dropout + residual + LN."""
  config: common.ModelConfig

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
    config = self.config
    y = common.dense(config, config.intermediate_size, ("embed", "mlp"), "intermediate")(x)
    y = common.ACTIVATIONS[config.hidden_act](y)
    y = nn.with_logical_constraint(y, ("activation_batch", "activation_length",
                                       "activation_mlp"))
    y = common.dense(config, config.hidden_size, ("mlp", "embed"), "output")(y)
    y = nn.Dropout(config.hidden_dropout)(y, deterministic=deterministic)
    return common.layer_norm(config, "layer_norm")(x + y)


class EncoderLayer(nn.Module):
  """One layer; either block may be a module shared with other layers."""
  config: common.ModelConfig
  shared_attention: nn.Module | None = None
  shared_ffn: nn.Module | None = None

  def setup(self):
    self.attention = self.shared_attention or AttentionBlock(self.config)
    self.ffn = self.shared_ffn or FeedForwardBlock(self.config)

  def __call__(self, x: jax.Array, context: attention.LayerContext,
               deterministic: bool, query: jax.Array | None = None) -> jax.Array:
    x = self.attention(x, context, deterministic, query)
    return common.constrain_hidden(self.ffn(x, deterministic))


class _ScannedLayer(nn.Module):
  """EncoderLayer in the (carry, broadcast...) -> (carry, output) form nn.scan wants;
  the output is the layer's input when `keep_inputs` (else None)."""
  config: common.ModelConfig
  keep_inputs: bool = False

  @nn.compact
  def __call__(self, x, context, deterministic):
    layer = EncoderLayer
    if self.config.remat:
      layer = nn.remat(layer, static_argnums=(3,), prevent_cse=False)
    output = layer(self.config, name="layer")(x, context, deterministic)
    return output, x if self.keep_inputs else None


class Encoder(nn.Module):
  """[batch, length, hidden] -> [batch, length, hidden], num_layers layers."""
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
          in_axes=(nn.broadcast, nn.broadcast), length=config.num_layers,
          metadata_params={nn.PARTITION_NAME: "layers"})(
              config, keep_inputs=config.enhanced_mask_decoder)
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

  def __call__(self, x: jax.Array, context: attention.LayerContext,
               deterministic: bool, keep_last_input: bool = False):
    """[batch, length, hidden] -> the same; with `keep_last_input`, (that, the last
    layer's input). `context` may already hold `relative` (with_relative)."""
    context = self.with_relative(context, deterministic)
    if self.config.scan_layers:
      if keep_last_input and not self.config.enhanced_mask_decoder:
        raise ValueError("scanned layers keep the last layer's input only for "
                         "model.enhanced_mask_decoder")
      x, inputs = self.layers(x, context, deterministic)
      return (x, inputs[-1]) if keep_last_input else x
    last_input = x
    for layer in self.layers:
      last_input, x = x, layer(x, context, deterministic)
    return (x, last_input) if keep_last_input else x

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

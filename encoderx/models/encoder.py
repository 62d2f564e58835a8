"""The post-LayerNorm Transformer encoder stack of BERT, with its options.

- `attention`: the attention variant of every layer (encoderx/models/attention.py); a
  variant with a context module gets it built here, once, shared by all layers.
- `layer_sharing`: 'none'; 'all' (one layer applied num_layers times, ALBERT);
  'attention' or 'ffn' (that sublayer's parameters shared by every layer).
- `scan_layers`: distinct layers as one `nn.scan` (parameters stacked on a leading
  'layers' axis), which compiles once instead of num_layers times.
- `remat`: recompute each layer's activations in the backward pass to save memory.
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
               deterministic: bool) -> jax.Array:
    config = self.config
    variant = attention.VARIANTS[config.attention]
    y = variant.attention(config, name="self_attention")(x, context, deterministic)
    y = nn.Dropout(config.hidden_dropout)(y, deterministic=deterministic)
    return common.layer_norm(config, "layer_norm")(x + y)


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
               deterministic: bool) -> jax.Array:
    x = self.attention(x, context, deterministic)
    return common.constrain_hidden(self.ffn(x, deterministic))


class _ScannedLayer(nn.Module):
  """EncoderLayer in the (carry, broadcast...) -> (carry, output) form nn.scan wants."""
  config: common.ModelConfig

  @nn.compact
  def __call__(self, x, context, deterministic):
    layer = EncoderLayer
    if self.config.remat:
      layer = nn.remat(layer, static_argnums=(3,), prevent_cse=False)
    return layer(self.config, name="layer")(x, context, deterministic), None


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

  def __call__(self, x: jax.Array, context: attention.LayerContext,
               deterministic: bool) -> jax.Array:
    if attention.VARIANTS[self.config.attention].context is not None:
      context = context.replace(relative=self.relative(context, deterministic))
    if self.config.scan_layers:
      x, _ = self.layers(x, context, deterministic)
      return x
    for layer in self.layers:
      x = layer(x, context, deterministic)
    return x

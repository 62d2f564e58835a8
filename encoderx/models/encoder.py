"""The Transformer encoder stack: BERT's post-LayerNorm layers, with its options.

- `attention`: the attention variant of every layer (encoderx/models/attention.py); a
  variant with a context module gets it built here, once, shared by all layers.
- `layer_sharing`: 'none'; 'all' (one layer applied num_layers times, ALBERT);
  'attention' or 'ffn' (that sublayer's parameters shared by every layer).
- `scan_layers`: distinct layers as one `nn.scan` (parameters stacked on a leading
  'layers' axis), which compiles once instead of num_layers times. `stack_layers` /
  `unstack_layers` turn a checkpoint's per-layer parameters into that layout and back
  (weight conversion and --init_from read and write the per-layer one).
- `remat`: recompute each layer's activations in the backward pass to save memory.
- `norm_position`: 'post' (BERT: norm(x + block(x))) or 'pre' (x + block(norm(x)), a
  final norm after the last layer: ModernBERT, EuroBERT), with `norm` LayerNorm or
  RMSNorm; `first_attention_norm=False` leaves the first layer's attention without its
  norm (ModernBERT's layer 0, whose attn_norm is Identity).
- `feed_forward`: 'mlp' or 'gated' (GeGLU / SwiGLU); biases as model.attention.bias and
  model.feed_forward.bias say.
- local attention (`local_attention`, `global_attention_every`): layers of the two
  kinds differ only in their window and rotary theta, which `LayerContext.for_layer`
  picks, so that a scanned stack stays homogeneous (the kind is scanned data, and each
  layer runs its kind's attention kernel under `lax.cond`).

Followed for the pre-norm layers: transformers models/modernbert/modeling_modernbert.py
(ModernBertEncoderLayer, ModernBertModel.forward: embeddings, layers, final_norm) and
AnswerDotAI/ModernBERT src/bert_layers/layers.py (FlexBertUnpadPreNormLayer,
skip_first_prenorm), transformers models/eurobert/modeling_eurobert.py
(EuroBertDecoderLayer, EuroBertModel.forward).

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

import dataclasses
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from encoderx import errors
from encoderx.models import attention, common
from encoderx.models import dropout as dropout_lib


LAYER_SHARING = ("none", "all", "ffn", "attention")
FEED_FORWARDS = ("mlp", "gated")


@dataclasses.dataclass(frozen=True)
class FeedForwardConfig:
  """config.model.feed_forward: each layer's feed-forward (its width is
  model.intermediate_size, its activation model.hidden_act)."""
  # "mlp": act(x W1) W2 (BERT); "gated": (act(x W) * x V) W2, a gated linear unit:
  # GeGLU with hidden_act "gelu" (ModernBERT), SwiGLU with "silu" (EuroBERT).
  kind: str = "mlp"
  bias: bool = True  # of its projections


@dataclasses.dataclass(frozen=True)
class LayoutConfig:
  """config.model.layout: how the layers are laid out in parameters and computed."""
  sharing: str = "none"  # "all" (ALBERT), "ffn", "attention" or "none".
  scan: bool = False  # the distinct layers as one nn.scan (see the module's docstring)
  remat: bool = False  # recompute each layer's activations in the backward pass


def validate(model) -> None:
  """config.model.feed_forward's and config.model.layout's fields."""
  errors.check_choice("model.feed_forward.kind", model.feed_forward.kind, FEED_FORWARDS)
  errors.check_choice("model.layout.sharing", model.layout.sharing, LAYER_SHARING)
  if model.layout.scan and model.layout.sharing != "none":
    errors.fail("model.layout.scan", "scans distinct layers; it cannot be combined with "
                f"model.layout.sharing={model.layout.sharing!r}.")


def _each_stream(function, *trees):
  """`function` applied to every stream of the hidden state (an array or a dict)."""
  return jax.tree_util.tree_map(function, *trees)


def _identity(x):
  return x


class AttentionBlock(nn.Module):
  """The variant's attention + dropout + residual, with the norm after the residual
  (post-norm) or before the attention (pre-norm; none there when not `with_norm`)."""
  config: model_config.ModelConfig
  with_norm: bool = True

  @nn.compact
  def __call__(self, x, context: attention.LayerContext, deterministic: bool,
               query: jax.Array | None = None):
    """`query`, when given, is the query stream and the residual (see the module doc);
    the variant is then called with `query=` (only then: the others need not take it)."""
    config = self.config
    variant = attention.VARIANTS[config.attention.variant]
    self_attention = variant.attention(config, name="self_attention")
    dropout = dropout_lib.Dropout(config.hidden_dropout)
    residual = x if query is None else query
    if config.norm.position == "pre":
      norm = common.norm(config, "layer_norm") if self.with_norm else _identity
      y = self_attention(_each_stream(norm, x), context, deterministic,
                         **({} if query is None else {"query": norm(query)}))
      return _each_stream(lambda x, y: x + dropout(y, deterministic=deterministic),
                          residual, y)
    y = self_attention(x, context, deterministic,
                       **({} if query is None else {"query": query}))
    norm = common.norm(config, "layer_norm")
    return _each_stream(lambda x, y: norm(x + dropout(y, deterministic=deterministic)),
                        residual, y)


class FeedForwardBlock(nn.Module):
  """Dense (hidden -> intermediate) + activation (times a second Dense's output when
  gated) + Dense + dropout + residual, with the norm after the residual (post-norm) or
  before the first Dense (pre-norm).

  Gated ('gated', GLU variants, Shazeer 2020): (act(x W) * x V) W2, W `intermediate`, V
  `linear`, W2 `output`. Hugging Face's ModernBertMLP (one Wi, chunked: act(input) *
  gate; AnswerDotAI src/bert_layers/mlp.py FlexBertGLU) and EuroBertMLP
  (act(gate_proj(x)) * up_proj(x)) both compute it.
  """
  config: model_config.ModelConfig

  @nn.compact
  def __call__(self, x, deterministic: bool):
    config = self.config
    bias = config.feed_forward.bias
    intermediate = common.dense(config, config.intermediate_size, ("embed", "mlp"),
                                "intermediate", bias)
    linear = (common.dense(config, config.intermediate_size, ("embed", "mlp"), "linear",
                           bias) if config.feed_forward.kind == "gated" else None)
    pre = config.norm.position == "pre"
    # Pre-norm: the output's gradient is the residual stream's (contraction's module doc).
    output = common.dense(config, config.hidden_size, ("mlp", "embed"), "output", bias,
                          role="out", transpose_input=pre)
    dropout = dropout_lib.Dropout(config.hidden_dropout)
    norm = common.norm(config, "layer_norm")

    def feed_forward(x):
      normed = norm(x) if pre else x
      y = common.ACTIVATIONS[config.hidden_act](intermediate(normed))
      if linear is not None:
        y = y * linear(normed)
      y = nn.with_logical_constraint(y, ("activation_batch", "activation_length",
                                         "activation_mlp"))
      y = dropout(output(y), deterministic=deterministic)
      return x + y if pre else norm(x + y)

    return _each_stream(feed_forward, x)


class EncoderLayer(nn.Module):
  """One layer; either block may be a module shared with other layers. `attention_norm`
  False: a pre-norm layer whose attention has no norm (model.norm.first_attention)."""
  config: model_config.ModelConfig
  shared_attention: nn.Module | None = None
  shared_ffn: nn.Module | None = None
  attention_norm: bool = True

  def setup(self):
    self.attention = self.shared_attention or AttentionBlock(self.config,
                                                             self.attention_norm)
    self.ffn = self.shared_ffn or FeedForwardBlock(self.config)

  def __call__(self, x, context: attention.LayerContext, deterministic: bool,
               query: jax.Array | None = None):
    x = self.attention(x, context, deterministic, query)
    return _each_stream(common.constrain_hidden, self.ffn(x, deterministic))


class _ScannedLayer(nn.Module):
  """EncoderLayer in the (carry, inputs...) -> (carry, output) form nn.scan wants: the
  carry is the hidden state, `per_layer` this layer's slice of context.per_layer,
  `is_global` its kind (a bool scalar: LayerContext.for_layer), and the output what
  entered the layer (when `collect`)."""
  config: model_config.ModelConfig

  @nn.compact
  def __call__(self, x, context, per_layer, is_global, deterministic, collect):
    layer = EncoderLayer
    if self.config.layout.remat:
      layer = nn.remat(layer, static_argnums=(3,), prevent_cse=False)
    y = layer(self.config, name="layer")(
        x, context.for_layer(is_global).replace(per_layer=per_layer), deterministic)
    return y, (x if collect else None)


class Encoder(nn.Module):
  """[batch, length, hidden] (or a dict of streams) -> the same, num_layers layers."""
  config: model_config.ModelConfig

  def setup(self):
    config = self.config
    context_module = attention.VARIANTS[config.attention.variant].context
    if context_module is not None:
      self.relative = context_module(config)
    if config.norm.position == "pre":
      self.final_layer_norm = common.norm(config, "final_layer_norm")
    # static_argnums counts self: (self, x, context, deterministic).
    layer = nn.remat(EncoderLayer, static_argnums=(3,)) if config.layout.remat else EncoderLayer
    if config.layout.scan:
      # A first layer unlike the others stays out of the scan, under its own name.
      if config.first_layer_differs:
        self.first_layer = layer(config, attention_norm=False, name="layer_0")
      self.layers = nn.scan(
          _ScannedLayer, variable_axes={"params": 0},
          split_rngs={"params": True, "dropout": True},
          in_axes=(nn.broadcast, 0, 0, nn.broadcast, nn.broadcast),
          length=config.num_layers - self._scan_start,
          metadata_params={nn.PARTITION_NAME: "layers"})(config)
      return
    if config.layout.sharing == "all":
      self.layers = [layer(config, name="shared_layer")] * config.num_layers
      return
    shared = {}
    if config.layout.sharing == "attention":
      self.shared_attention = AttentionBlock(config)
      shared["shared_attention"] = self.shared_attention
    elif config.layout.sharing == "ffn":
      self.shared_ffn = FeedForwardBlock(config)
      shared["shared_ffn"] = self.shared_ffn
    self.layers = [layer(config, **shared, name=f"layer_{i}",
                         attention_norm=i > 0 or not config.first_layer_differs)
                   for i in range(config.num_layers)]

  @property
  def _scan_start(self) -> int:
    """The first scanned layer (1 when the first layer stays out of the scan)."""
    return int(self.config.first_layer_differs)

  def with_relative(self, context: attention.LayerContext,
                    deterministic: bool) -> attention.LayerContext:
    """The context with what the variant computes once per forward pass (`relative`)."""
    if attention.VARIANTS[self.config.attention.variant].context is None or (
        context.relative is not None):
      return context
    return context.replace(relative=self.relative(context, deterministic))

  def __call__(self, x, context: attention.LayerContext, deterministic: bool,
               collect_layer_inputs: bool = False):
    """The stack's output; with `collect_layer_inputs`, (output, what entered each
    layer: the hidden state's leaves stacked on a leading [layers] axis). `context` may
    already hold `relative` (with_relative)."""
    config = self.config
    context = self.with_relative(context, deterministic)
    per_layer, context = context.per_layer, context.replace(per_layer=None)

    def layer_context(index):
      """Layer `index`'s context: its kind's window and rotary, its slice of per_layer."""
      layer = context.for_layer(config.is_global_layer(index))
      return layer if per_layer is None else layer.replace(
          per_layer=jax.tree_util.tree_map(lambda leaf: leaf[index], per_layer))

    inputs = []
    if config.layout.scan:
      start = self._scan_start
      if start:
        inputs.append(x)
        x = self.first_layer(x, layer_context(0), deterministic)
      kinds = jnp.asarray([config.is_global_layer(i)
                           for i in range(start, config.num_layers)])
      scanned = per_layer if per_layer is None or not start else jax.tree_util.tree_map(
          lambda leaf: leaf[start:], per_layer)
      x, scanned_inputs = self.layers(x, context, scanned, kinds, deterministic,
                                      collect_layer_inputs)
      if collect_layer_inputs:
        inputs = jax.tree_util.tree_map(
            lambda *leaves: jnp.concatenate([jnp.stack(leaves[:-1]), leaves[-1]]),
            *inputs, scanned_inputs) if inputs else scanned_inputs
    else:
      for index, layer in enumerate(self.layers):
        inputs.append(x)
        x = layer(x, layer_context(index), deterministic)
      if collect_layer_inputs:
        inputs = jax.tree_util.tree_map(lambda *leaves: jnp.stack(leaves), *inputs)
    if config.norm.position == "pre":
      x = _each_stream(self.final_layer_norm, x)
    return (x, inputs) if collect_layer_inputs else x

  def last_layer(self, x: jax.Array, query: jax.Array, context: attention.LayerContext,
                 deterministic: bool) -> jax.Array:
    """The last layer applied again, with its own parameters, to keys and values `x`
    [batch, length, hidden] and the query stream `query` [batch, queries, hidden];
    `context` must hold `relative` (with_relative) and describe those queries
    (LayerContext.at_queries)."""
    if not self.config.layout.scan:
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
  encoder's other parameters (e.g. DeBERTa's relative table) stay as they are, and so do
  leading layers whose parameters differ from the last's (a pre-norm first layer without
  its attention norm, model.norm.first_attention: the stack scans the layers after it)."""
  encoder = params["encoder_model"]["encoder"]
  layers = sorted((int(_LAYER.match(k).group(1)), k, v) for k, v in encoder.items()
                  if _LAYER.match(k))
  structure = jax.tree_util.tree_structure(layers[-1][2])
  start = 0
  while jax.tree_util.tree_structure(layers[start][2]) != structure:
    start += 1
  stacked = jax.tree_util.tree_map(lambda *xs: np.stack(xs),
                                   *[v for _, _, v in layers[start:]])
  others = {k: v for k, v in encoder.items()
            if not _LAYER.match(k) or k in {name for _, name, _ in layers[:start]}}
  return {**params, "encoder_model": {**params["encoder_model"],
                                      "encoder": {**others, "layers": {"layer": stacked}}}}


def unstack_layers(params: dict, num_layers: int) -> dict:
  """The inverse of `stack_layers`: num_layers layers, those kept apart included."""
  encoder = params["encoder_model"]["encoder"]
  start = sum(1 for k in encoder if _LAYER.match(k))  # layers kept out of the scan
  layers = {f"layer_{i}": jax.tree_util.tree_map(lambda x, i=i: x[i - start],
                                                 encoder["layers"]["layer"])
            for i in range(start, num_layers)}
  others = {k: v for k, v in encoder.items() if k != "layers"}
  return {**params, "encoder_model": {**params["encoder_model"],
                                      "encoder": {**others, **layers}}}

"""Attention variants of the encoder layer, by name, and what every layer is given.

An encoder layer receives the hidden states and one `LayerContext`, built once per
forward pass: positions, segment information, the attention mask where a variant reads
it whole, and whatever an attention variant computes once for all layers (`relative`:
relative-position embeddings, for instance). `model.attention.variant` picks the variant from
VARIANTS; a variant is its attention module plus, optionally, the module that computes
its part of the context (owned by the encoder stack, so its parameters are shared by all
layers). Adding an attention (DeBERTa's disentangled, XLNet's two-stream relative) is a
`register()` call, not a copy of the stack.

The standard attention reads no mask from the context: its kernel
(encoderx/models/attention_kernels.py, `model.attention.kernel`) takes the segment ids
and the layer's window, and only the 'xla' kernel builds the whole [length, length]
mask (`LayerContext.layer_mask`), so that long rows hold none. It rotates its queries
and keys by the context's `rotary` (encoderx/models/rotary.py) before the kernel, and
takes fewer key-value heads than query heads (model.attention.num_kv_heads), which reach the
kernels unrepeated.

Layers differ in kind where model.attention.window asks for local ones (ModernBERT): the
context holds what a local layer uses instead of a global one's (`local_window`,
`local_rotary`), and `LayerContext.for_layer` gives a layer its kind's `window` and
`rotary`. In a scanned stack the kind is traced (`is_global`), and the attention runs
its kind's kernel under `lax.cond`.

Kernels are created in their final shape ([hidden, heads, head_dim] for q/k/v,
[heads, head_dim, hidden] for the output). Flax's MultiHeadDotProductAttention creates
them flat and reshapes, which breaks under logical axis rules (the flat kernel gets the
3-D kernel's sharding constraint when `param()` re-checks shapes inside `apply`).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from encoderx import errors
from encoderx.models import attention_kernels
from encoderx.models import common
from encoderx.models import contraction
from encoderx.models import masks
from encoderx.models import dropout as dropout_lib
from encoderx.models import rotary as rotary_lib
from encoderx.models.attention_kernels import attend, fused_implementation  # noqa: F401  (the variants' and tests' attention.attend)
from encoderx.models.common import HEADS_AXES


@flax.struct.dataclass
class LayerContext:
  """What every encoder layer is given besides the hidden states."""
  positions: jax.Array  # [batch, length] position of each token in its own sequence
  segment_ids: jax.Array  # [batch, length] packed sequence (1, 2, ...); 0 is padding
  token_type_ids: jax.Array  # [batch, length] segment A (0) / B (1)
  # [batch, 1, query, key] bool: which keys each query may attend to, for the variants
  # that read it whole (Variant.reads_mask: DeBERTa's, XLNet's); None for the standard
  # attention, whose kernels take the segment ids (`layer_mask` builds it for 'xla').
  mask: jax.Array | None = None
  relative: Any = None  # computed once for all layers by the variant's context module
  # What each layer is given of its own: leaves [layers, ...] as the encoder receives
  # them; layer i sees its slice (XLNet: the memory of the previous segment).
  per_layer: Any = None
  # A variant's own inputs, as the model that uses it builds them (XLNet: the
  # factorization order's masks and the query stream's targets); None for most.
  variant_inputs: Any = None
  # Rotary positions (model.embeddings.position 'rotary'): (cos, sin), each [batch,
  # length, head_dim], of the global layers' theta (of this layer's after `for_layer`);
  # None without.
  rotary: Any = None
  # Before `for_layer`, where some layers are local (model.attention.window): their
  # window and rotary positions (of the local theta); 0 and None otherwise.
  local_window: int = flax.struct.field(pytree_node=False, default=0)
  local_rotary: Any = None
  # After `for_layer`: this layer's window (0: global), and where its kind is traced (a
  # scanned stack of both kinds) a bool scalar, True for a global layer, whose window is
  # then 0 rather than `window`.
  window: int = flax.struct.field(pytree_node=False, default=0)
  is_global: Any = None

  def for_layer(self, is_global) -> "LayerContext":
    """The context of a global (True) or local (False) layer: its `window` and
    `rotary`. `is_global` may be traced (a scanned stack's layer kind): it is then kept
    as `is_global`, `rotary` is selected by it and `window` is the local one."""
    if not self.local_window:
      return self
    layer = self.replace(local_window=0, local_rotary=None)
    if isinstance(is_global, bool):
      return layer if is_global else layer.replace(rotary=self.local_rotary,
                                                   window=self.local_window)
    rotary = jax.tree_util.tree_map(lambda g, l: jnp.where(is_global, g, l),
                                    self.rotary, self.local_rotary)
    return layer.replace(rotary=rotary, window=self.local_window, is_global=is_global)

  def layer_mask(self, window: int | None = None) -> jax.Array:
    """[batch, 1, query, key] bool: `mask` where the context holds one, else the mask of
    a layer of `window` (this layer's unless given) built from the segment ids
    (`masks.local_window_mask`): what the 'xla' kernel takes."""
    if self.mask is not None:
      return self.mask
    return masks.local_window_mask(self.segment_ids,
                                   self.window if window is None else window)

  def at_queries(self, indices: jax.Array) -> "LayerContext":
    """The context of the queries at `indices` [batch, n] alone (keys unchanged): the
    mask's rows, and `relative.at_queries(indices)` when the variant has a relative."""
    mask = jnp.take_along_axis(self.layer_mask(), indices[:, None, :, None], axis=2)
    relative = None if self.relative is None else self.relative.at_queries(indices)
    return self.replace(mask=mask, relative=relative)


def layer_context(batch: dict, config: model_config.ModelConfig | None = None) -> LayerContext:
  """The context of a model input batch (see encoderx/models/pretraining.py): the whole
  mask when the model's variant reads it (always without a `config`); with the model's
  `config`, its rotary positions and its local layers' window and rotary."""
  variant = None if config is None else VARIANTS.get(config.attention.variant)
  reads_mask = variant is None or variant.reads_mask
  context = LayerContext(
      positions=batch["positions"], segment_ids=batch["segment_ids"],
      token_type_ids=batch["token_type_ids"],
      mask=masks.padding_and_packing_mask(batch["segment_ids"]) if reads_mask else None)
  if config is None:
    return context
  rotary = local_rotary = None
  if config.embeddings.position == "rotary":
    rotary = rotary_lib.cos_sin(batch["positions"], config.head_dim, config.embeddings.rope_theta)
    local_rotary = rotary if not config.embeddings.local_rope_theta else rotary_lib.cos_sin(
        batch["positions"], config.head_dim, config.embeddings.local_rope_theta)
  if not any(not config.is_global_layer(i) for i in range(config.num_layers)):
    return context.replace(rotary=rotary)
  return context.replace(rotary=rotary, local_window=config.attention.window,
                         local_rotary=local_rotary)


class Projection(nn.Module):
  """x's last `contracted` dimensions · kernel [those, out...] + bias [out...], with
  logically partitioned parameters (`contraction.contract`: its kernel gradient takes
  the cheap layout)."""
  config: model_config.ModelConfig
  contracted: int
  kernel_shape: tuple[int, ...]
  kernel_axes: tuple[str | None, ...]
  bias_shape: tuple[int, ...]
  bias_axes: tuple[str | None, ...]
  use_bias: bool = True
  role: str = "in"  # the kernel's init (common.init_std)

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    config = self.config
    kernel = self.param("kernel", common.initializer(config, self.kernel_axes,
                                                     role=self.role),
                        self.kernel_shape, config.weights_dtype)
    if not self.use_bias:
      x, kernel = nn.dtypes.promote_dtype(x, kernel, dtype=config.compute_dtype)
      return contraction.contract(x, kernel, self.contracted)
    bias = self.param("bias", common.zeros(self.bias_axes), self.bias_shape,
                      config.weights_dtype)
    x, kernel, bias = nn.dtypes.promote_dtype(x, kernel, bias, dtype=config.compute_dtype)
    return contraction.contract(x, kernel, self.contracted) + bias


def heads_projection(config: model_config.ModelConfig, name: str, use_bias: bool = True,
                     heads: int | None = None) -> Projection:
  """[batch, length, hidden] -> [batch, length, heads, head_dim] (query, key, value);
  `heads` num_heads unless given (the key-value heads)."""
  hidden, head_dim = config.hidden_size, config.head_dim
  heads = heads or config.num_heads
  return Projection(config, 1, (hidden, heads, head_dim), ("embed", "heads", "kv"),
                    (heads, head_dim), ("heads", "kv"), use_bias, name=name)


def output_projection(config: model_config.ModelConfig, name: str = "out",
                      use_bias: bool = True) -> Projection:
  """[batch, length, heads, head_dim] -> [batch, length, hidden] (a projection back into
  the residual stream: initialized as model.init.scheme's role 'out')."""
  hidden, heads, head_dim = config.hidden_size, config.num_heads, config.head_dim
  return Projection(config, 2, (heads, head_dim, hidden), ("heads", "kv", "embed"),
                    (hidden,), ("embed",), use_bias, role="out", name=name)


class SelfAttention(nn.Module):
  """Multi-head self-attention: [batch, length, hidden] -> same, by the kernel
  model.attention.kernel names (encoderx/models/attention_kernels.py). BERT's, and with
  the model's options: biases (model.attention.bias), rotary positions
  (context.rotary), fewer key-value heads (model.attention.num_kv_heads; EuroBertAttention's
  q/k/v_proj in transformers models/eurobert/modeling_eurobert.py) and the local window
  of a local layer (context.window)."""
  config: model_config.ModelConfig

  @nn.compact
  def __call__(self, x: jax.Array, context: LayerContext, deterministic: bool,
               query: jax.Array | None = None) -> jax.Array:
    """`query` [batch, queries, hidden] replaces the query stream; keys and values are
    x's."""
    config = self.config
    query_given = query is not None
    if query_given and context.rotary is not None:
      raise ValueError("rotary positions take no separate query stream (model."
                       "enhanced_mask_decoder)")
    bias = config.attention.bias
    query, key, value = (
        nn.with_logical_constraint(heads_projection(config, n, bias, heads)(y), HEADS_AXES)
        for n, y, heads in (("query", x if query is None else query, None),
                            ("key", x, config.kv_heads), ("value", x, config.kv_heads)))
    if context.rotary is not None:
      query, key = (rotary_lib.rotate(y, *context.rotary) for y in (query, key))
    dropout = attention_dropout(self, config, deterministic)

    def attended(window):
      """The attention of a layer of `window`, by its kernel. Initialization traces a
      dummy batch of any length: 'xla' then (the parameters are the same)."""
      kernel = "xla" if self.is_initializing() else attention_kernels.choose(
          config, query, key, value, window, query_given, bool(dropout))
      return attention_kernels.compute(kernel, query, key, value, context.segment_ids,
                                       window, lambda: context.layer_mask(window),
                                       **dropout)

    if context.is_global is None:
      out = attended(context.window)
    else:  # a scanned layer of either kind: its own kernel runs
      out = jax.lax.cond(context.is_global, lambda: attended(0),
                         lambda: attended(context.window))
    return output_projection(config, use_bias=bias)(out)


def attention_dropout(module: nn.Module, config: model_config.ModelConfig,
                      deterministic: bool) -> dict:
  """`attend`'s dropout arguments for a layer: a key from `module`'s 'dropout' rngs
  when training with attention dropout, else none."""
  if deterministic or dropout_lib.effective_rate(config.attention.dropout) == 0:
    return {}
  return {"dropout_rate": config.attention.dropout,
          "dropout_key": module.make_rng("dropout")}


@dataclasses.dataclass(frozen=True)
class Variant:
  """An attention variant.

  attention: a module class built as `attention(config, name=...)` and called as
    `(hidden [batch, length, hidden], LayerContext, deterministic) -> [batch, length,
    hidden]`. A variant with several streams takes and returns a dict of them instead
    (XLNet's content and query streams {'h': ..., 'g': ...}); the encoder layer around
    it (dropout, residual, LayerNorm, feed-forward) treats every stream alike, with the
    same parameters. A variant that supports a separate query stream also takes
    `query=` [batch, queries, hidden] (DeBERTa's enhanced mask decoder; the context then
    describes those queries, LayerContext.at_queries) and returns [batch, queries,
    hidden]; keys and values still come from hidden.
  context: None, or a module class built as `context(config, name='relative')` by the
    encoder stack and called once per forward pass as `(LayerContext, deterministic) ->
    value`; layers then see that value as `context.relative`.
  validate: None, or `(config.model) -> None`: checks the model fields only this variant
    reads, raising errors.ConfigError.
  reads_mask: whether its layers read the whole [batch, 1, length, length]
    `LayerContext.mask` (built by `layer_context` only then).
  """
  attention: type[nn.Module]
  context: type[nn.Module] | None = None
  validate: Callable[[Any], None] | None = None
  reads_mask: bool = True


VARIANTS: dict[str, Variant] = {"standard": Variant(SelfAttention, reads_mask=False)}


def register(name: str, variant: Variant) -> Variant:
  """Makes `variant` available as `model.attention.variant=name`."""
  VARIANTS[name] = variant
  return variant


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
  """config.model.attention: the attention variant, its kernel and its options."""
  # The variant, by name (VARIANTS: "standard", "disentangled", "two_stream_relative").
  variant: str = "standard"
  # How the standard attention is computed (attention_kernels.ATTENTION_KERNELS).
  kernel: str = "auto"
  dropout: float = 0.1
  bias: bool = True  # of the query, key, value and output projections
  # Key-value heads of the standard attention (grouped-query attention: each serves
  # num_heads / num_kv_heads query heads; EuroBERT); 0: num_heads.
  num_kv_heads: int = 0
  # Local attention (ModernBERT): a window of `window` tokens, window / 2 each side of
  # the query (|q - k| <= window / 2), in every layer but the global ones, layer i
  # global when i % global_every == 0 (Hugging Face's global_attn_every_n_layers).
  # 0: every layer global.
  window: int = 0
  global_every: int = 1
  # Disentangled attention (DeBERTa, encoderx/models/disentangled.py): the relative
  # distance terms beside content->content ("c2p" content->position, "p2c"
  # position->content); distances in log buckets (256 rows each side of 0 in v2/v3; 0:
  # no buckets, distances clipped at max_relative_positions); position terms projected
  # with the content query/key projections (share_att_key) or with their own.
  relative_terms: tuple[str, ...] = ("c2p", "p2c")
  position_buckets: int = 256
  max_relative_positions: int = 512
  share_att_key: bool = True
  # Relative attention (XLNet): distances beyond are encoded as this one; -1: none.
  clamp_len: int = -1


def validate(model) -> None:
  """Checks config.model.attention: the variant, the standard attention's options (and
  the fields only the variant reads: Variant.validate)."""
  fields = model.attention
  errors.check_choice("model.attention.variant", fields.variant, tuple(VARIANTS))
  errors.check_choice("model.attention.kernel", fields.kernel,
                      attention_kernels.ATTENTION_KERNELS)
  errors.check_fraction("model.attention.dropout", fields.dropout)
  window, heads, kv_heads = fields.window, model.num_heads, fields.num_kv_heads
  if window < 0 or window % 2:
    errors.fail("model.attention.window", f"must be an even number of tokens "
                f"(window / 2 each side of the query) or 0, got {window}.")
  if fields.global_every < 1:
    errors.fail("model.attention.global_every", "must be >= 1 (layer i is global when i "
                f"% it == 0), got {fields.global_every}.")
  if kv_heads < 0 or (kv_heads and heads % kv_heads):
    errors.fail("model.attention.num_kv_heads", f"{kv_heads}: model.num_heads={heads} must "
                "be a multiple of it (each key-value head serves a group of query heads).")
  if fields.variant != "standard":
    standard_only = {
        "model.attention.kernel": repr(fields.kernel) if fields.kernel != "auto" else "",
        "model.embeddings.position": ("'rotary'" if model.embeddings.position == "rotary"
                                      else ""),
        "model.attention.window": window,
        "model.attention.num_kv_heads": kv_heads if kv_heads not in (0, heads) else 0,
        "model.attention.bias": "False" if not fields.bias else ""}
    for field, value in standard_only.items():
      if value:
        errors.fail(field, f"{value} is an option of the standard attention; "
                    f"model.attention.variant={fields.variant!r} computes its own.",
                    "Use 'auto'." if field.endswith("kernel") else "")
  if VARIANTS[fields.variant].validate is not None:
    VARIANTS[fields.variant].validate(model)

"""Attention variants of the encoder layer, by name, and what every layer is given.

An encoder layer receives the hidden states and one `LayerContext`, built once per
forward pass: the attention mask (padding and packed sequences), positions, segment
information and whatever an attention variant computes once for all layers (`relative`:
relative-position embeddings, for instance). `model.attention` picks the variant from
VARIANTS; a variant is its attention module plus, optionally, the module that computes
its part of the context (owned by the encoder stack, so its parameters are shared by all
layers). Adding an attention (DeBERTa's disentangled, XLNet's two-stream relative) is a
`register()` call, not a copy of the stack.

Layers differ in kind where model.local_attention asks for local ones (ModernBERT): the
context holds what a global layer uses (`mask`, `rotary`) and what a local one uses
instead (`local`), and `LayerContext.for_layer` picks. The standard attention rotates
its queries and keys by the context's `rotary` (encoderx/models/rotary.py) and takes
fewer key-value heads than query heads (model.num_kv_heads).

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
from encoderx.models import common
from encoderx.models import contraction
from encoderx.models import masks
from encoderx.models import dropout as dropout_lib
from encoderx.models import flash_attention
from encoderx.models import rotary as rotary_lib

# Logical shape of per-head activations: [batch, length, heads, head_dim].
HEADS_AXES = ("activation_batch", "activation_length", "activation_heads", "activation_kv")


@flax.struct.dataclass
class LayerContext:
  """What every encoder layer is given besides the hidden states."""
  mask: jax.Array  # [batch, 1, query, key] bool: which keys each query may attend to
  positions: jax.Array  # [batch, length] position of each token in its own sequence
  segment_ids: jax.Array  # [batch, length] packed sequence (1, 2, ...); 0 is padding
  token_type_ids: jax.Array  # [batch, length] segment A (0) / B (1)
  relative: Any = None  # computed once for all layers by the variant's context module
  # What each layer is given of its own: leaves [layers, ...] as the encoder receives
  # them; layer i sees its slice (XLNet: the memory of the previous segment).
  per_layer: Any = None
  # A variant's own inputs, as the model that uses it builds them (XLNet: the
  # factorization order's masks and the query stream's targets); None for most.
  variant_inputs: Any = None
  # Rotary positions (model.position_embedding 'rotary'): (cos, sin), each [batch,
  # length, head_dim], of the global layers' theta; None without.
  rotary: Any = None
  # What a local layer uses instead of `mask` and `rotary` (model.local_attention):
  # (mask [batch, 1, length, length] with the window, rotary of the local theta); None
  # when every layer is global. `for_layer` picks.
  local: Any = None

  def for_layer(self, is_global) -> "LayerContext":
    """The context of a global (True) or local (False) layer: `mask` and `rotary` its
    kind's, `local` None. `is_global` may be traced (a scanned stack's layer kind)."""
    if self.local is None:
      return self
    local_mask, local_rotary = self.local
    if isinstance(is_global, bool):
      mask, rotary = (self.mask, self.rotary) if is_global else (local_mask, local_rotary)
    else:
      mask, rotary = jax.tree_util.tree_map(
          lambda g, l: jnp.where(is_global, g, l), (self.mask, self.rotary),
          (local_mask, local_rotary))
    return self.replace(mask=mask, rotary=rotary, local=None)

  def at_queries(self, indices: jax.Array) -> "LayerContext":
    """The context of the queries at `indices` [batch, n] alone (keys unchanged): the
    mask's rows, and `relative.at_queries(indices)` when the variant has a relative."""
    mask = jnp.take_along_axis(self.mask, indices[:, None, :, None], axis=2)
    relative = None if self.relative is None else self.relative.at_queries(indices)
    return self.replace(mask=mask, relative=relative)


def layer_context(batch: dict, config: common.ModelConfig | None = None) -> LayerContext:
  """The context of a model input batch (see encoderx/models/pretraining.py); with the
  model's `config`, its rotary positions and its local layers' mask."""
  context = LayerContext(mask=masks.padding_and_packing_mask(batch["segment_ids"]),
                         positions=batch["positions"], segment_ids=batch["segment_ids"],
                         token_type_ids=batch["token_type_ids"])
  if config is None:
    return context
  rotary = local_rotary = None
  if config.position_embedding == "rotary":
    rotary = rotary_lib.cos_sin(batch["positions"], config.head_dim, config.rope_theta)
    local_rotary = rotary if not config.local_rope_theta else rotary_lib.cos_sin(
        batch["positions"], config.head_dim, config.local_rope_theta)
  local = None
  if any(not config.is_global_layer(i) for i in range(config.num_layers)):
    local = (masks.local_window_mask(batch["segment_ids"], config.local_attention),
             local_rotary)
  return context.replace(rotary=rotary, local=local)


class Projection(nn.Module):
  """x's last `contracted` dimensions · kernel [those, out...] + bias [out...], with
  logically partitioned parameters (`contraction.contract`: its kernel gradient takes
  the cheap layout)."""
  config: common.ModelConfig
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


def heads_projection(config: common.ModelConfig, name: str, use_bias: bool = True,
                     heads: int | None = None) -> Projection:
  """[batch, length, hidden] -> [batch, length, heads, head_dim] (query, key, value);
  `heads` num_heads unless given (the key-value heads)."""
  hidden, head_dim = config.hidden_size, config.head_dim
  heads = heads or config.num_heads
  return Projection(config, 1, (hidden, heads, head_dim), ("embed", "heads", "kv"),
                    (heads, head_dim), ("heads", "kv"), use_bias, name=name)


def output_projection(config: common.ModelConfig, name: str = "out",
                      use_bias: bool = True) -> Projection:
  """[batch, length, heads, head_dim] -> [batch, length, hidden] (a projection back into
  the residual stream: initialized as model.initializer's role 'out')."""
  hidden, heads, head_dim = config.hidden_size, config.num_heads, config.head_dim
  return Projection(config, 2, (heads, head_dim, hidden), ("heads", "kv", "embed"),
                    (hidden,), ("embed",), use_bias, role="out", name=name)


def fused_implementation(query: jax.Array, key: jax.Array, bias: jax.Array | None
                         ) -> str | None:
  """The `implementation` of `jax.nn.dot_product_attention` for these heads: "cudnn"
  (its fused flash attention) on GPU for bfloat16/float16 heads of at most 128 dims, a
  multiple of 8, over even lengths (cuDNN's condition for a mask in training), without a
  bias (cuDNN would also compute the bias's gradient); None (XLA) elsewhere. jax picks
  XLA for None on every platform, cuDNN only when asked."""
  head_dim = query.shape[-1]
  if (jax.default_backend() == "gpu" and bias is None
      and query.dtype in (jnp.bfloat16, jnp.float16)
      and head_dim <= 128 and head_dim % 8 == 0
      and query.shape[1] % 2 == 0 and key.shape[1] % 2 == 0):
    return "cudnn"
  return None


def attend(query: jax.Array, key: jax.Array, value: jax.Array, mask: jax.Array,
           bias: jax.Array | None = None, dropout_rate: float = 0.0,
           dropout_key: jax.Array | None = None) -> jax.Array:
  """Scaled dot-product attention, [batch, length, heads, head_dim] in and out; the keys
  and values may have fewer heads (grouped-query attention: query head n attends with
  key-value head n // (heads / kv_heads), as Hugging Face's repeat_kv and
  jax.nn.dot_product_attention group them).

  Without dropout on the probabilities, this is `jax.nn.dot_product_attention`: cuDNN's
  fused flash attention on GPU where `fused_implementation` allows (the mask, padding and
  packed documents alike, goes in as its additive bias), XLA elsewhere. Neither has a
  usable dropout (jax's cuDNN call fixes the dropout seed at 42, so every step would
  drop the same elements), so with attention dropout the probabilities are computed here,
  dropped (8 bits per element, encoderx/models/dropout.py) and applied to the values:
  the same arithmetic, checked against it in tests/test_dropout.py. (On GPU,
  `model.attention_kernel` "auto" or "pallas" keeps them on chip instead: SelfAttention
  then calls `fused_attention_with_dropout`.)
  """
  if dropout_key is None or dropout_lib.effective_rate(dropout_rate) == 0:
    return jax.nn.dot_product_attention(query, key, value, bias=bias, mask=mask,
                                        implementation=fused_implementation(query, key, bias))
  key, value = masks.repeat_kv_heads(query, key, value)
  probabilities = dropout_lib.dropout(masks.attention_probabilities(query, key, mask, bias),
                                      dropout_rate, dropout_key)
  return jnp.einsum("bnqk,bknd->bqnd", probabilities.astype(value.dtype), value)


class SelfAttention(nn.Module):
  """Multi-head self-attention: [batch, length, hidden] -> same (`attend`). BERT's, and
  with the model's options: biases (model.attention_bias), rotary positions
  (context.rotary), fewer key-value heads (model.num_kv_heads; EuroBertAttention's
  q/k/v_proj in transformers models/eurobert/modeling_eurobert.py) and the local window
  of a local layer (in its context's mask)."""
  config: common.ModelConfig

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
    bias = config.attention_bias
    query, key, value = (
        nn.with_logical_constraint(heads_projection(config, n, bias, heads)(y), HEADS_AXES)
        for n, y, heads in (("query", x if query is None else query, None),
                            ("key", x, config.kv_heads), ("value", x, config.kv_heads)))
    if context.rotary is not None:
      query, key = (rotary_lib.rotate(y, *context.rotary) for y in (query, key))
    dropout = attention_dropout(self, config, deterministic)
    kernel = config.attention_kernel
    if kernel == "auto":
      kernel = ("pallas" if not config.local_attention and pallas_by_default(
          jax.default_backend(), query, key, value, query_given, bool(dropout)) else "xla")
    # Initialization traces a dummy batch of any length; the parameters are the same.
    if kernel == "pallas" and not self.is_initializing():
      attended = fused_attention_with_dropout(
          query, *masks.repeat_kv_heads(query, key, value), context, query_given,
          **dropout)
    else:
      attended = attend(query, key, value, context.mask, **dropout)
    return output_projection(config, use_bias=bias)(attended)


def pallas_by_default(backend: str, query: jax.Array, key: jax.Array, value: jax.Array,
                      query_given: bool, with_dropout: bool) -> bool:
  """Whether `model.attention_kernel="auto"` takes the Pallas kernel: on GPU, in
  training with attention dropout, over bfloat16/float16 heads of at most 64 dims that
  the kernel takes (`flash_attention.check_supported`), each device holding whole
  sequences and heads. There it is the faster: on an H200, BERT-large @512 steps in
  103.3 ms against XLA's 135.3 (README, "On a GPU"). Wider heads are left to XLA: the
  kernel's tiling for them is unmeasured. Without dropout cuDNN's fused attention is
  faster still, and `attend` uses it."""
  return (backend == "gpu" and with_dropout
          and query.dtype in (jnp.bfloat16, jnp.float16) and query.shape[-1] <= 64
          and kernel_refusal(query, key, value, query_given) is None)


def kernel_refusal(query: jax.Array, key: jax.Array, value: jax.Array,
                   query_given: bool) -> str | None:
  """Why encoderx/models/flash_attention.py's kernel cannot take these heads (a separate
  query stream, a shape it lacks, a layout that splits sequences or heads over
  devices), or None."""
  if query_given:
    return ("it takes self-attention over whole sequences, not a separate query "
            "stream")
  try:
    flash_attention.check_supported(query, key, value)
    flash_attention.check_heads_layout(nn.logical_to_mesh_axes(HEADS_AXES))
  except ValueError as error:
    return str(error)
  return None


def fused_attention_with_dropout(query: jax.Array, key: jax.Array, value: jax.Array,
                                 context: LayerContext, query_given: bool,
                                 dropout_rate: float = 0.0,
                                 dropout_key: jax.Array | None = None) -> jax.Array:
  """`model.attention_kernel="pallas"`: encoderx/models/flash_attention.py's kernel,
  which rebuilds the mask from the segment ids block by block (so it takes the whole
  sequence's self-attention only). On GPU its Triton kernels; elsewhere Pallas's
  interpreter (slow: for tests on CPU). TPU would need a Mosaic kernel of its own."""
  refusal = kernel_refusal(query, key, value, query_given)
  if refusal:
    raise ValueError(f"model.attention_kernel='pallas': {refusal}. Use 'auto' or 'xla'.")
  if jax.default_backend() == "tpu":
    raise ValueError("model.attention_kernel='pallas' is a GPU (Triton) kernel; use "
                     "'auto' or 'xla' on TPU.")
  return flash_attention.sharded_flash_attention(
      query, key, value, context.segment_ids, dropout_rate, dropout_key,
      nn.logical_to_mesh_axes(HEADS_AXES), interpret=jax.default_backend() != "gpu")


def attention_dropout(module: nn.Module, config: common.ModelConfig,
                      deterministic: bool) -> dict:
  """`attend`'s dropout arguments for a layer: a key from `module`'s 'dropout' rngs
  when training with attention dropout, else none."""
  if deterministic or dropout_lib.effective_rate(config.attention_dropout) == 0:
    return {}
  return {"dropout_rate": config.attention_dropout,
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
  """
  attention: type[nn.Module]
  context: type[nn.Module] | None = None
  validate: Callable[[Any], None] | None = None


VARIANTS: dict[str, Variant] = {"standard": Variant(SelfAttention)}


def register(name: str, variant: Variant) -> Variant:
  """Makes `variant` available as `model.attention=name`."""
  VARIANTS[name] = variant
  return variant


def validate(model) -> None:
  """Checks config.model.attention and the fields its variant reads."""
  errors.check_choice("model.attention", model.attention, tuple(VARIANTS))
  if VARIANTS[model.attention].validate is not None:
    VARIANTS[model.attention].validate(model)

"""The kernels that compute the standard attention, by name (`model.attention.kernel`),
and the one "auto" picks for a layer (`choose`).

  xla        `attend`: XLA's attention under the layer's whole [batch, 1, length,
             length] mask, the probabilities written out (dropped with attention
             dropout); cuDNN's fused attention on GPU where `fused_implementation`
             allows and no dropout applies. Memory quadratic in the length; any shape;
             the only one that takes a separate query stream.
  blockwise  encoderx/models/blockwise_attention.py: XLA, blocks of queries against the
             blocks of keys they reach, memory linear in the length; no dropout.
  pallas     encoderx/models/flash_attention.py: the GPU (Triton) kernel, with dropout;
             head sizes a power of 2 from 16, lengths a multiple of 64 (or a power of 2
             below); interpreted off GPU (slow: for tests).
  splash     encoderx/models/splash_attention.py: JAX's splash attention for TPU (as
             MaxText uses it), no dropout; rows padded to its blocks of 128 and more;
             in Pallas's TPU interpret mode off TPU (slow: for tests).

A run (`validate`) refuses pallas and splash off their platform (PLATFORMS) unless
`interpret_off_platform` is set, as tests that run the interpreter set it.

All but xla take the segment ids and the layer's window and mask block by block, so no
[length, length] array exists on their path: the context of the standard attention
holds no mask (`LayerContext.layer_mask` builds one for xla only). They take the keys
and values with the model's kv heads as they come (grouped-query attention, no repeat);
the queries and keys arrive rotated (rotary positions). Every kernel gives a padding
query what `attend` gives it (masks.padding_queries_as_xla).

"auto" (`choose`) decides per layer kind when the model is traced, from the backend, the
heads, the window and whether attention dropout applies (training with
model.attention.dropout > 0):

  with attention dropout  GPU: pallas where `pallas_by_default` (measured the faster),
                          windows included; else xla. Elsewhere xla: blockwise and
                          splash have no dropout.
  TPU                     splash where it takes the heads' layout (`splash_refusal`),
                          else blockwise.
  GPU                     rows shorter than LONG_ROW: xla (cuDNN); longer: pallas where
                          it takes the heads (`pallas_refusal`), else blockwise.
  CPU                     blockwise for rows longer than CPU_FULL_ROW tokens and for
                          local layers whose window skips key blocks (a 512-token row,
                          a window of 128); xla for global layers' rows of up to
                          CPU_FULL_ROW tokens and for local layers whose window meets
                          every block of the row (ModernBERT-tiny's 128 tokens, a
                          window of 64: the band saves nothing, and XLA's attention
                          took 0.82x its time).
  any                     xla for a separate query stream (DeBERTa's enhanced mask
                          decoder), and for a row shorter than its layer's window.

What has not run on hardware: splash on a TPU (never), pallas with windows or
grouped-query heads on a GPU (compiled for sm_90 by launch/triton_check.py, never
timed), the GPU's long-row choice (unmeasured against cuDNN).
"""
from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from encoderx import errors
from encoderx.models import blockwise_attention
from encoderx.models import common
from encoderx.models import dropout as dropout_lib
from encoderx.models import flash_attention
from encoderx.models import masks
from encoderx.models import splash_attention

# How the standard attention is computed (model.attention.kernel): "xla": XLA's
# attention under the whole [length, length] mask (cuDNN's fused kernel on GPU without
# attention dropout); "pallas": the GPU (Triton)
# flash attention with dropout (flash_attention.py); "blockwise": XLA in memory linear in
# the length, no dropout (blockwise_attention.py); "splash": JAX's splash attention for
# TPU, no dropout (splash_attention.py). "auto", per layer: with attention dropout,
# "pallas" on GPU where measured the faster, else "xla"; without, "splash" on TPU (else
# "blockwise"), on GPU "xla" (cuDNN) for rows under 1,024 tokens and "pallas" (else
# "blockwise") for longer ones, on CPU "blockwise" for rows longer than 1,024 tokens and
# for local layers whose window skips key blocks, else "xla" (`choose`).
ATTENTION_KERNELS = ("auto", "xla", "pallas", "blockwise", "splash")
# On GPU, rows of at least this many tokens take a linear-memory kernel under "auto".
LONG_ROW = 1024
# On CPU, a global layer attends in full (xla) in rows of at most this many tokens, in
# blocks (blockwise) in longer ones. On the 2-core Intel Xeon (2026-11-30), xla against
# blockwise's single block: ModernBERT-base's train step at 1,024 tokens (batch 2) 3% to
# 12% faster (four pairs of medians of 5) at the same peak memory (9.2 GB), the tiny
# ModernBERT's (batch 4) 5% to 11%; at 2,048 tokens (batch 1) ModernBERT-base's took
# 12.9 s against blockwise's 12.6 s, and 2.1 GB more. (Before the heads-first layout of
# `masks.attention_probabilities`, xla took 4.8x blockwise's time at 1,024 tokens:
# docs/guides/long-context.md.)
CPU_FULL_ROW = 1024
# The kernels without attention dropout.
WITHOUT_DROPOUT = ("blockwise", "splash")
# The platform each Pallas kernel is compiled for; elsewhere Pallas interprets it, which
# is for tests: 20 steps of the tiny ModernBERT with splash on CPU took 258 s, against
# 79 s for 200 with the default. A run refuses it off its platform (`validate`) unless
# this is set (the `interpreted_kernels` fixture of tests/conftest.py sets it).
PLATFORMS = {"pallas": "gpu", "splash": "tpu"}
interpret_off_platform = False


def backend() -> str:
  """The platform the model is traced for (tests monkeypatch it to see "auto" choose for
  another)."""
  return jax.default_backend()


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
  jax.nn.dot_product_attention group them); `mask` [batch, 1, query, key] bool.

  Where `fused_implementation` allows and no dropout applies, this is cuDNN's fused
  flash attention (`jax.nn.dot_product_attention`; the mask, padding and packed
  documents alike, goes in as its additive bias). Elsewhere XLA computes the
  probabilities (`masks.attention_probabilities`: jax.nn.dot_product_attention's
  arithmetic, the heads first), drops them where dropout applies (8 bits per element,
  encoderx/models/dropout.py: jax's cuDNN call fixes the dropout seed at 42, so every
  step would drop the same elements) and applies them to the values; checked against
  Flax's attention in tests/test_dropout.py. (On GPU, "auto" or "pallas" keeps the
  dropped probabilities on chip instead: flash_attention.py.)
  """
  dropping = dropout_key is not None and dropout_lib.effective_rate(dropout_rate) > 0
  implementation = fused_implementation(query, key, bias)
  if implementation is not None and not dropping:
    with masks.softmax_rule():
      return jax.nn.dot_product_attention(query, key, value, bias=bias, mask=mask,
                                          implementation=implementation)
  probabilities = masks.attention_probabilities(query, key, mask, bias)
  if dropping:
    probabilities = dropout_lib.dropout(probabilities, dropout_rate, dropout_key)
  return masks.weighted_values(probabilities.astype(value.dtype), value)


def _heads_layout():
  """How the heads [batch, length, heads, head_dim] lie over the current mesh."""
  return nn.logical_to_mesh_axes(common.HEADS_AXES)


def pallas_refusal(query: jax.Array, key: jax.Array, value: jax.Array,
                   query_given: bool = False) -> str | None:
  """Why flash_attention.py's kernel cannot take these heads (a separate query stream,
  a shape it lacks, a layout that splits sequences or heads over devices), or None."""
  if query_given:
    return ("it takes self-attention over whole sequences, not a separate query "
            "stream")
  try:
    flash_attention.check_supported(query, key, value)
    flash_attention.check_heads_layout(_heads_layout())
  except ValueError as error:
    return str(error)
  return None


def splash_refusal(key: jax.Array, query_given: bool = False) -> str | None:
  """Why splash attention cannot take these heads under the current mesh (a separate
  query stream, sequences or heads split over devices, kv heads that do not split as
  the query heads do), or None."""
  if query_given:
    return "it takes self-attention over whole rows, not a separate query stream"
  try:
    splash_attention.check_layout(key.shape[2], _heads_layout(),
                                  jax.sharding.get_abstract_mesh())
  except ValueError as error:
    return str(error)
  return None


def pallas_by_default(backend_name: str, query: jax.Array, key: jax.Array,
                      value: jax.Array, query_given: bool, with_dropout: bool) -> bool:
  """Whether "auto" takes the Pallas kernel for a layer with attention dropout: on GPU,
  over bfloat16/float16 heads of at most 64 dims that the kernel takes
  (`pallas_refusal`), each device holding whole sequences and heads. There it is the
  faster: on an H200, BERT-large @512 steps in 103.3 ms against XLA's 135.3 (CHANGELOG,
  2026-11-26). Wider heads are left to XLA: the kernel's tiling for them is unmeasured.
  Without dropout cuDNN's fused attention is faster still at the lengths measured."""
  return (backend_name == "gpu" and with_dropout
          and query.dtype in (jnp.bfloat16, jnp.float16) and query.shape[-1] <= 64
          and pallas_refusal(query, key, value, query_given) is None)


def choose(config: model_config.ModelConfig, query: jax.Array, key: jax.Array,
           value: jax.Array, window: int, query_given: bool, with_dropout: bool,
           backend_name: str | None = None) -> str:
  """The kernel of a layer of `window` (0: global) for these heads [batch, length,
  heads, head_dim]: model.attention.kernel, or for "auto" what the module docstring
  says. `backend_name`: `backend()` unless given."""
  if config.attention.kernel != "auto":
    return config.attention.kernel
  backend_name = backend_name or backend()
  length = query.shape[1]
  if query_given or window > length:
    return "xla"
  if with_dropout:
    return ("pallas" if pallas_by_default(backend_name, query, key, value, query_given,
                                          with_dropout) else "xla")
  if backend_name == "tpu":
    return "splash" if splash_refusal(key) is None else "blockwise"
  if backend_name == "gpu":
    if length < LONG_ROW:
      return "xla"
    return "pallas" if pallas_refusal(query, key, value) is None else "blockwise"
  # On a 2-core CPU, forward and backward of [32, 128] rows of 2 heads of 64 with a
  # window of 64 took 0.82x blockwise's time with xla (medians of 30 and 60
  # interleaved repeats, on a shared machine); a band that meets every block saves nothing.
  if length > CPU_FULL_ROW or (
      window and not blockwise_attention.visits_every_block(length, window)):
    return "blockwise"
  return "xla"


def compute(kernel: str, query: jax.Array, key: jax.Array, value: jax.Array,
            segment_ids: jax.Array, window: int, mask: Callable[[], jax.Array],
            dropout_rate: float = 0.0, dropout_key: jax.Array | None = None
            ) -> jax.Array:
  """Attention by `kernel` of query [batch, length, heads, head_dim] over key and value
  [batch, length, kv_heads, head_dim], for a layer of `window` over the documents of
  `segment_ids` [batch, length]; `mask()` builds the whole mask, for "xla" alone.
  Raises a one-line ValueError where the kernel cannot run."""
  if kernel == "xla":
    return attend(query, key, value, mask(), dropout_rate=dropout_rate,
                  dropout_key=dropout_key)
  if (kernel in WITHOUT_DROPOUT and dropout_key is not None
      and dropout_lib.effective_rate(dropout_rate) > 0):
    raise ValueError(f"model.attention.kernel={kernel!r} has no attention dropout "
                     f"(model.attention.dropout={dropout_rate}); use 'auto', 'xla' or "
                     "'pallas', or model.attention.dropout=0.")
  if kernel == "blockwise":
    return blockwise_attention.blockwise_attention(query, key, value, segment_ids,
                                                   window=window)
  if kernel == "splash":
    return splash_attention.splash_attention(query, key, value, segment_ids,
                                             window=window, heads_spec=_heads_layout())
  refusal = pallas_refusal(query, key, value)
  if refusal:
    raise ValueError(f"model.attention.kernel='pallas': {refusal}. Use 'auto' or 'xla'.")
  platform = jax.default_backend()  # the real one: the kernel runs there
  if platform == "tpu":
    raise ValueError("model.attention.kernel='pallas' is a GPU (Triton) kernel; use "
                     "'auto' or 'splash' on TPU.")
  return flash_attention.sharded_flash_attention(
      query, key, value, segment_ids, dropout_rate, dropout_key, _heads_layout(),
      window=window, interpret=platform != "gpu")


def validate(model, lengths: dict[str, int]) -> None:
  """Checks the standard attention's kernel and window against the model's fields and
  the rows it runs on (`lengths`: each length's config field -> its tokens, e.g.
  {"data.seq_length": 8192}) before anything is traced; raises errors.ConfigError in
  one line naming the field. `model` is config.model (a ConfigDict)."""
  kernel, window = model.attention.kernel, model.attention.window
  if kernel in ("auto", "xla"):
    # xla takes a row shorter than the window (its local layers then see the row as
    # Hugging Face's do): fine-tuning a released ModernBERT (a window of 128) on short
    # rows is common, so only the kernels that cannot take it refuse it.
    return
  if window and model.attention.global_every > 1 and model.num_layers > 1:
    for field, length in lengths.items():
      if length < window:
        errors.fail(field, f"{length} tokens is shorter than the local window "
                    f"model.attention.window={window}, which "
                    f"model.attention.kernel={kernel!r} cannot take.",
                    f"Use rows of at least {window} tokens, a window of at most "
                    f"{length}, or attention.kernel 'auto' or 'xla'.")
  if kernel in WITHOUT_DROPOUT and dropout_lib.effective_rate(model.attention.dropout):
    errors.fail("model.attention.kernel", f"{kernel!r} has no attention dropout; got "
                f"model.attention.dropout={model.attention.dropout}.",
                "Set model.attention.dropout=0, or use 'auto', 'xla' or 'pallas'.")
  if model.heads.enhanced_mask_decoder:
    errors.fail("model.attention.kernel", f"{kernel!r} takes self-attention over whole "
                "rows; model.heads.enhanced_mask_decoder re-runs the last layer on a separate "
                "query stream.", "Use 'auto' or 'xla'.")
  if kernel == "pallas" and backend() == "tpu":
    errors.fail("model.attention.kernel", "'pallas' is a GPU (Triton) kernel and does "
                "not run on TPU.", "Use 'auto' or 'splash' on TPU.")
  if kernel == "pallas":
    heads, kv_heads = model.num_heads, model.attention.num_kv_heads or model.num_heads
    head_dim = model.hidden_size // heads
    for field, length in lengths.items():
      query = jax.ShapeDtypeStruct((1, length, heads, head_dim), jnp.float32)
      kv = jax.ShapeDtypeStruct((1, length, kv_heads, head_dim), jnp.float32)
      try:
        flash_attention.check_supported(query, kv, kv)
      except ValueError as error:
        errors.fail("model.attention.kernel", f"'pallas' cannot run rows of {field}="
                    f"{length} with heads of hidden_size / num_heads = {head_dim}: "
                    f"{error}.", "Use 'auto', 'xla' or 'blockwise'.")
  platform = PLATFORMS.get(kernel)
  if platform and backend() != platform and not interpret_off_platform:
    errors.fail("model.attention.kernel", f"{kernel!r} is a {platform.upper()} kernel; on "
                f"{backend().upper()} Pallas would interpret it, far slower (that is for "
                "tests).", "Use 'auto' (it picks for the platform), 'blockwise' or 'xla'.")

"""What every model module shares: the model config, initializers, norms, dtypes,
activations, and the validation of the model's fields (`validate_model`).

`ModelConfig` is the one definition of the model's fields: `config.model` in the config
schema (encoderx/config.py) is made from it, so a field is named and defaulted here only.
A family is a choice of these fields (no module asks which family it is in): BERT's are
the defaults; ModernBERT and EuroBERT set the rotary, pre-norm, gated and bias fields
below (encoderx/hf/modernbert.py and eurobert.py show which).

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

ACTIVATIONS = {
    "gelu": functools.partial(jax.nn.gelu, approximate=False),  # BERT's erf GELU
    "gelu_new": functools.partial(jax.nn.gelu, approximate=True),  # tanh (ALBERT, GPT-2)
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
    "tanh": jnp.tanh,
}
LAYER_SHARING = ("none", "all", "ffn", "attention")
POSITION_EMBEDDINGS = ("absolute", "rotary", "none")
NORMS = ("layer_norm", "rms_norm")
NORM_POSITIONS = ("post", "pre")
FEED_FORWARDS = ("mlp", "gated")
INITIALIZERS = ("bert", "megatron")
# What the pooler reads (encoderx/models/heads.py Pooler): the first token, the mean of
# the real tokens, or ("late") every token, its outputs then averaged.
CLASSIFIER_POOLINGS = ("first_token", "mean", "late")
# How the standard attention is computed (encoderx/models/attention_kernels.py):
# "xla": jax.nn.dot_product_attention under the whole [length, length] mask (cuDNN's
# fused kernel on GPU), XLA's attention with attention dropout; "pallas": the GPU
# (Triton) flash attention with dropout (flash_attention.py); "blockwise": XLA in
# memory linear in the length, no dropout (blockwise_attention.py); "splash": JAX's
# splash attention for TPU, no dropout (splash_attention.py). "auto", per layer: with
# attention dropout, "pallas" on GPU where measured the faster, else "xla"; without,
# "splash" on TPU (else "blockwise"), on GPU "xla" (cuDNN) for rows under 1,024 tokens
# and "pallas" (else "blockwise") for longer ones, on CPU "blockwise" for rows of 1,024
# tokens or more and for local layers, else "xla" (attention_kernels.choose).
ATTENTION_KERNELS = ("auto", "xla", "pallas", "blockwise", "splash")
DTYPES = ("float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """The encoder's fields (BERT-base defaults); frozen, so hashable as a module field."""
  # The model family ("bert", "roberta", "albert", ...: encoderx/hf/families.py):
  # what Hugging Face class export writes and which rules convert its weights. Named, not
  # guessed from the other fields, because families differ in more than those fields (a
  # BERT and a RoBERTa of equal sizes differ only in tokenizer and position offset).
  family: str = "bert"
  vocab_size: int = 0  # 0: the vocabulary's size.
  # The word-embedding table and the vocabulary-sized output biases get vocab_size
  # rounded up to a multiple of this (`padded_vocab_size`), so that they split over the
  # mesh axes of the 'vocab' rule (RoBERTa's 50,265 -> 50,304 with 128). vocab_size
  # stays the real number of tokens: the padding rows start at zero, are masked out of
  # every softmax over the vocabulary (their gradients are zero), and export drops them.
  vocab_multiple: int = 1
  hidden_size: int = 768
  num_layers: int = 12
  num_heads: int = 12
  intermediate_size: int = 3072
  embedding_size: int = 0  # 0: hidden_size; smaller factorizes the embedding (ALBERT).
  hidden_act: str = "gelu"
  # The pooler's activation on its dense ([CLS]): BERT's tanh; ELECTRA's classification
  # head applies GELU (google-research/electra, Hugging Face ElectraClassificationHead).
  pooler_act: str = "tanh"
  # The attention variant, by name (encoderx/models/attention.py: VARIANTS).
  attention: str = "standard"
  # How the standard attention is computed (ATTENTION_KERNELS above).
  attention_kernel: str = "auto"
  # Disentangled attention (DeBERTa, encoderx/models/disentangled.py): the relative
  # distance terms beside content->content ("c2p" content->position, "p2c"
  # position->content); distances in log buckets (256 rows each side of 0 in v2/v3; 0:
  # no buckets, distances clipped at max_relative_positions); position terms projected
  # with the content query/key projections (share_att_key) or with their own.
  relative_attention_terms: tuple[str, ...] = ("c2p", "p2c")
  position_buckets: int = 256
  max_relative_positions: int = 512
  share_att_key: bool = True
  # DeBERTa's enhanced mask decoder: absolute positions enter only before the MLM head,
  # which sees the last layer re-run with them in its queries (encoderx/models/
  # pretraining.py). Needs a position table, created even with position_embedding "none".
  enhanced_mask_decoder: bool = False
  # "absolute": a learned table of max_position_embeddings rows (BERT); "rotary": no
  # table, queries and keys rotated by the batch's positions (encoderx/models/rotary.py;
  # ModernBERT, EuroBERT); "none": no position embedding in the input (variants with
  # relative positions).
  position_embedding: str = "absolute"
  # Rotary positions: the base of the frequencies (theta) in global layers, and in local
  # ones (0: rope_theta). ModernBERT: 160,000 and 10,000; EuroBERT: 250,000.
  rope_theta: float = 10000.0
  local_rope_theta: float = 0.0
  max_position_embeddings: int = 512
  # Added to every position id: RoBERTa's positions start after its padding id, at 2,
  # so its table has max length + 2 rows (514 for 512).
  position_offset: int = 0
  type_vocab_size: int = 2
  # False: the embeddings enter the first layer without a norm (XLNet, EuroBERT).
  embedding_layer_norm: bool = True
  # Relative attention (XLNet): distances beyond are encoded as this one; -1: none.
  clamp_len: int = -1
  # Key-value heads of the standard attention (grouped-query attention: each serves
  # num_heads / num_kv_heads query heads; EuroBERT); 0: num_heads.
  num_kv_heads: int = 0
  # Local attention (ModernBERT): a window of local_attention tokens, local_attention / 2
  # each side of the query (|q - k| <= local_attention / 2), in every layer but the
  # global ones, layer i global when i % global_attention_every == 0 (Hugging Face's
  # global_attn_every_n_layers). 0: every layer global.
  local_attention: int = 0
  global_attention_every: int = 1
  # "layer_norm" (LayerNorm) or "rms_norm" (RMSNorm: no mean, no bias; EuroBERT), for
  # every norm of the encoder and heads but DeBERTa's relative table's; layer_norm_eps is
  # either's epsilon. "post": BERT's layer, norm(x + block(x)); "pre": x + block(norm(x)),
  # the embeddings' norm as embedding_layer_norm says and a final norm after the last
  # layer (ModernBERT, EuroBERT). The norm modules keep the name layer_norm whatever
  # their kind, so that parameter paths do not depend on it.
  norm: str = "layer_norm"
  norm_position: str = "post"
  # Pre-norm only. False: the first layer's attention takes its input without a norm,
  # its embeddings' norm serving (ModernBERT: Hugging Face's layer-0 attn_norm is
  # Identity; AnswerDotAI's skip_first_prenorm).
  first_attention_norm: bool = True
  # "mlp": act(x W1) W2 (BERT); "gated": (act(x W) * x V) W2, a gated linear unit:
  # GeGLU with hidden_act "gelu" (ModernBERT), SwiGLU with "silu" (EuroBERT).
  feed_forward: str = "mlp"
  # Biases, as Hugging Face's ModernBERT names them: of the attention's projections
  # (attention_bias), of the feed-forward's (mlp_bias), of the LayerNorms (norm_bias;
  # RMSNorm has none), of the MLM head's output over the vocabulary (decoder_bias), and
  # of the dense of the MLM head's transform and of the pooler (classifier_bias). The
  # task classifiers always have theirs.
  attention_bias: bool = True
  mlp_bias: bool = True
  norm_bias: bool = True
  decoder_bias: bool = True
  classifier_bias: bool = True
  # The MLM head scores against the word embedding (True) or a table of its own (its
  # `output_embeddings`; EuroBERT's untied lm_head).
  tie_word_embeddings: bool = True
  # The MLM head's transform (dense + hidden_act + norm, BERT, ModernBERT) before the
  # scores; False: the encoder's output is scored directly (EuroBERT).
  mlm_transform: bool = True
  # The pooler (encoderx/models/heads.py): which tokens it reads (CLASSIFIER_POOLINGS),
  # and a norm after its activation (ModernBERT's ModernBertPredictionHead).
  classifier_pooling: str = "first_token"
  pooler_norm: bool = False
  # The token classification and extractive QA heads apply the pooler's transform
  # (dense, pooler_act, norm) to every token before their classifier (ModernBERT).
  token_head_transform: bool = False
  hidden_dropout: float = 0.1
  attention_dropout: float = 0.1
  layer_norm_eps: float = 1e-12
  initializer_range: float = 0.02
  # Weights are drawn from N(0, std) truncated at initializer_cutoff standard deviations
  # (0: not truncated, EuroBERT's). "bert": std initializer_range everywhere;
  # "megatron": std initializer_range / sqrt(2 num_layers) for the projections back into
  # the residual stream and the heads' dense (attention out, feed-forward out, MLM
  # transform, pooler, untied decoder) and hidden_size^-0.5 for the task classifiers
  # (ModernBERT: Hugging Face's ModernBertPreTrainedModel._init_weights, AnswerDotAI's
  # full_megatron in src/bert_layers/initialization.py). Embeddings, the other
  # projections and the norms are initialized alike by both.
  initializer: str = "bert"
  initializer_cutoff: float = 2.0
  layer_sharing: str = "none"  # "all" (ALBERT), "ffn", "attention" or "none".
  scan_layers: bool = False
  remat: bool = False
  dtype: str = "float32"  # compute dtype; bfloat16 on TPU.
  param_dtype: str = "float32"

  @classmethod
  def from_config(cls, model_config, vocab_size: int | None = None) -> "ModelConfig":
    """From `config.model`; `vocab_size` fills a config whose vocab_size is 0."""
    fields = dict(model_config)
    if not fields["vocab_size"]:
      if not vocab_size:
        raise ValueError("config.model.vocab_size is 0 and no vocabulary size was given.")
      fields["vocab_size"] = vocab_size
    fields["embedding_size"] = fields["embedding_size"] or fields["hidden_size"]
    fields["relative_attention_terms"] = tuple(fields["relative_attention_terms"])
    return cls(**fields)

  @property
  def compute_dtype(self):
    return jnp.dtype(self.dtype)

  @property
  def weights_dtype(self):
    return jnp.dtype(self.param_dtype)

  @property
  def padded_vocab_size(self) -> int:
    """The rows of the word embedding and the output biases: vocab_size rounded up to a
    multiple of vocab_multiple."""
    return -(-self.vocab_size // self.vocab_multiple) * self.vocab_multiple

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def kv_heads(self) -> int:
    """The attention's key-value heads (num_kv_heads, or num_heads for 0)."""
    return self.num_kv_heads or self.num_heads

  def is_global_layer(self, index: int) -> bool:
    """Whether layer `index` attends globally (local_attention, global_attention_every)."""
    return not self.local_attention or index % self.global_attention_every == 0

  @property
  def first_layer_differs(self) -> bool:
    """The first layer has parameters the others lack or lack some of theirs (a pre-norm
    first layer without its attention norm): a scanned stack leaves it out."""
    return self.norm_position == "pre" and not self.first_attention_norm


def config_section() -> ml_collections.ConfigDict:
  """config.model: ModelConfig's fields with their defaults."""
  return ml_collections.ConfigDict(dataclasses.asdict(ModelConfig()))


def validate(model) -> None:
  """Checks config.model's values (those of every encoder; an attention variant checks
  its own fields: attention.Variant.validate); raises errors.ConfigError."""
  errors.check_positive(model, "hidden_size", "num_layers", "num_heads",
                        "intermediate_size", "max_position_embeddings")
  if model.hidden_size % model.num_heads:
    errors.fail("model.hidden_size", f"{model.hidden_size} is not divisible by "
                f"model.num_heads={model.num_heads}.")
  if model.embedding_size < 0 or model.vocab_size < 0:
    errors.fail("model.embedding_size" if model.embedding_size < 0 else "model.vocab_size",
                "must be >= 0 (0 means the default).")
  if model.vocab_multiple < 1:
    errors.fail("model.vocab_multiple", f"must be >= 1 (1: no padding rows), got "
                f"{model.vocab_multiple}.", "Use e.g. 128 to pad the vocabulary so that it "
                "splits over the mesh.")
  if model.position_offset < 0:
    errors.fail("model.position_offset", f"must be >= 0, got {model.position_offset}.")
  errors.check_choice("model.hidden_act", model.hidden_act, tuple(ACTIVATIONS))
  errors.check_choice("model.pooler_act", model.pooler_act, tuple(ACTIVATIONS))
  errors.check_choice("model.attention_kernel", model.attention_kernel, ATTENTION_KERNELS)
  if model.attention_kernel != "auto" and model.attention != "standard":
    errors.fail("model.attention_kernel", f"{model.attention_kernel!r} is a kernel of the "
                f"standard attention; model.attention={model.attention!r} computes its "
                "own.", "Use 'auto'.")
  errors.check_choice("model.position_embedding", model.position_embedding,
                      POSITION_EMBEDDINGS)
  errors.check_choice("model.layer_sharing", model.layer_sharing, LAYER_SHARING)
  if model.enhanced_mask_decoder and model.embedding_size not in (0, model.hidden_size):
    errors.fail("model.enhanced_mask_decoder", "adds position embeddings to hidden states; "
                f"it needs model.embedding_size = hidden_size, got {model.embedding_size}.")
  errors.check_choice("model.dtype", model.dtype, DTYPES)
  errors.check_choice("model.param_dtype", model.param_dtype, DTYPES)
  if model.scan_layers and model.layer_sharing != "none":
    errors.fail("model.scan_layers", "scans distinct layers; it cannot be combined with "
                f"model.layer_sharing={model.layer_sharing!r}.")
  for field in ("hidden_dropout", "attention_dropout"):
    if not 0.0 <= model[field] < 1.0:
      errors.fail(f"model.{field}", f"must be in [0, 1), got {model[field]}.")
  validate_model(model)


# The standard deviation of a weight's init, by its role (model.initializer).
ROLES = ("in", "out", "final")


def init_std(config: ModelConfig, role: str = "in") -> float:
  """The std of weights of `role`: 'in' (embeddings, projections out of the residual
  stream), 'out' (projections into it, the heads' dense), 'final' (task classifiers).
  All are initializer_range for model.initializer 'bert'; 'megatron' scales 'out' by
  1 / sqrt(2 num_layers) and sets 'final' to hidden_size^-0.5, as Hugging Face's
  ModernBertPreTrainedModel._init_weights (stds 'in', 'out', 'embedding', 'final_out')."""
  if config.initializer == "bert" or role == "in":
    return config.initializer_range
  if role == "out":
    return config.initializer_range / (2.0 * config.num_layers) ** 0.5
  return config.hidden_size ** -0.5


def initializer(config: ModelConfig, axes: tuple[str | None, ...], rows: int | None = None,
                role: str = "in"):
  """N(0, init_std(role)) truncated at initializer_cutoff standard deviations (BERT's:
  2; 0: not truncated). With `rows`, only the first `rows` rows are drawn (as a table of
  that many rows would be) and the rows below are zeros (the vocabulary's padding
  rows)."""
  std, cutoff = init_std(config, role), config.initializer_cutoff
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


def dense(config: ModelConfig, features: int, axes: tuple[str, str], name: str,
          use_bias: bool = True, role: str = "in") -> nn.Dense:
  """A Dense layer whose kernel [in, out] and bias [out] carry logical axes (its kernel
  gradient through `contraction.contract`); the kernel drawn as `initializer(role)`."""
  return nn.Dense(features, use_bias=use_bias, dtype=config.compute_dtype,
                  param_dtype=config.weights_dtype,
                  kernel_init=initializer(config, axes, role=role),
                  bias_init=zeros((axes[1],)), dot_general=contraction.dot_general,
                  name=name)


def layer_norm(config: ModelConfig, name: str, axis: str = "embed",
               use_bias: bool = True) -> nn.LayerNorm:
  """A LayerNorm over the last axis (scale [axis], bias [axis] with `use_bias`)."""
  # Two-pass variance: matches PyTorch to the last decimal where E[x^2]-E[x]^2 drifts.
  return nn.LayerNorm(epsilon=config.layer_norm_eps, dtype=config.compute_dtype,
                      param_dtype=config.weights_dtype, use_fast_variance=False,
                      use_bias=use_bias,
                      scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(),
                                                              (axis,)),
                      bias_init=zeros((axis,)), name=name)


def norm(config: ModelConfig, name: str, axis: str = "embed") -> nn.Module:
  """The model's norm (model.norm): a LayerNorm (with a bias when model.norm_bias) or an
  RMSNorm, x / sqrt(mean(x^2) + eps) * scale, in float32 as Hugging Face's
  EuroBertRMSNorm computes it (then cast to the compute dtype)."""
  if config.norm == "rms_norm":
    return nn.RMSNorm(epsilon=config.layer_norm_eps, dtype=config.compute_dtype,
                      param_dtype=config.weights_dtype, use_fast_variance=False,
                      scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(),
                                                              (axis,)), name=name)
  return layer_norm(config, name, axis, use_bias=config.norm_bias)


def constrain_hidden(x: jax.Array) -> jax.Array:
  return nn.with_logical_constraint(x, HIDDEN_AXES)


def validate_model(model) -> None:
  """Checks the fields of the position encodings, norms, feed-forward, biases, key-value
  heads and local attention (config.model, a ConfigDict or ModelConfig), and how they
  combine; raises errors.ConfigError naming the first bad field."""
  get = model.__getitem__ if hasattr(model, "__getitem__") else (
      lambda name: getattr(model, name))
  errors.check_choice("model.norm", get("norm"), NORMS)
  errors.check_choice("model.norm_position", get("norm_position"), NORM_POSITIONS)
  errors.check_choice("model.feed_forward", get("feed_forward"), FEED_FORWARDS)
  errors.check_choice("model.initializer", get("initializer"), INITIALIZERS)
  errors.check_choice("model.classifier_pooling", get("classifier_pooling"),
                      CLASSIFIER_POOLINGS)
  if get("rope_theta") <= 0:
    errors.fail("model.rope_theta", f"must be positive, got {get('rope_theta')}.")
  if get("local_rope_theta") < 0:
    errors.fail("model.local_rope_theta", f"must be positive (or 0: model.rope_theta), got "
                f"{get('local_rope_theta')}.")
  if get("initializer_cutoff") < 0:
    errors.fail("model.initializer_cutoff", "must be >= 0 (standard deviations; 0: not "
                f"truncated), got {get('initializer_cutoff')}.")
  window = get("local_attention")
  if window < 0 or window % 2:
    errors.fail("model.local_attention", f"must be an even number of tokens "
                f"(local_attention / 2 each side of the query) or 0, got {window}.")
  if get("global_attention_every") < 1:
    errors.fail("model.global_attention_every", "must be >= 1 (layer i is global when i % "
                f"it == 0), got {get('global_attention_every')}.")
  heads, kv_heads = get("num_heads"), get("num_kv_heads")
  if kv_heads < 0 or (kv_heads and heads % kv_heads):
    errors.fail("model.num_kv_heads", f"{kv_heads}: model.num_heads={heads} must be a "
                "multiple of it (each key-value head serves a group of query heads).")
  rotary = get("position_embedding") == "rotary"
  if rotary and (get("hidden_size") // heads) % 2:
    errors.fail("model.position_embedding", "'rotary' rotates pairs of dimensions; the "
                f"head size hidden_size / num_heads = {get('hidden_size') // heads} is odd.")
  standard_only = {"position_embedding": "'rotary'" if rotary else "",
                   "local_attention": window,
                   "num_kv_heads": kv_heads if kv_heads not in (0, heads) else 0,
                   "attention_bias": "False" if not get("attention_bias") else ""}
  for field, value in standard_only.items():
    if value and get("attention") != "standard":
      errors.fail(f"model.{field}", f"{value} is an option of the standard attention; "
                  f"model.attention={get('attention')!r} computes its own.")
  if get("norm") == "rms_norm" and get("norm_bias"):
    errors.fail("model.norm_bias", "RMSNorm has no bias (model.norm='rms_norm').",
                "Set model.norm_bias=False.")
  if not get("first_attention_norm"):
    if get("norm_position") != "pre":
      errors.fail("model.first_attention_norm", "False is for pre-norm layers "
                  "(model.norm_position='pre').")
    if get("layer_sharing") != "none":
      errors.fail("model.first_attention_norm", "False leaves the first layer without a "
                  "norm the others have; it cannot share its parameters (model."
                  f"layer_sharing={get('layer_sharing')!r}).")
    if get("scan_layers") and get("num_layers") < 2:
      errors.fail("model.scan_layers", "scans the layers after the first (model."
                  "first_attention_norm=False); a single layer has none.")
  if get("enhanced_mask_decoder") and (rotary or window or get("norm_position") == "pre"):
    errors.fail("model.enhanced_mask_decoder", "re-runs the last post-norm layer on a "
                "query stream of absolute positions; it does not take rotary positions, "
                "local attention or pre-norm layers.")

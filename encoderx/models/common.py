"""What every model module shares: the model config, initializers, dtypes, activations.

`ModelConfig` is the one definition of the model's fields: `config.model` in the config
schema (encoderx/config.py) is made from it, so a field is named and defaulted here only.

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

ACTIVATIONS = {
    "gelu": functools.partial(jax.nn.gelu, approximate=False),  # BERT's erf GELU
    "gelu_new": functools.partial(jax.nn.gelu, approximate=True),  # tanh (ALBERT, GPT-2)
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
    "tanh": jnp.tanh,
}
LAYER_SHARING = ("none", "all", "ffn", "attention")
POSITION_EMBEDDINGS = ("absolute", "none")
# "xla": `attention.attend`, jax.nn.dot_product_attention (cuDNN's fused kernel on GPU)
# without attention dropout, XLA's attention with it; "pallas":
# encoderx/models/flash_attention.py, the fused kernel with dropout; "auto": "pallas"
# where it is the faster (`attention.pallas_by_default`), else "xla".
ATTENTION_KERNELS = ("auto", "xla", "pallas")
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
  # How the standard attention is computed (ATTENTION_KERNELS; README, Model).
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
  # "absolute": a learned table of max_position_embeddings rows (BERT); "none": no
  # position embedding in the input (variants with relative positions).
  position_embedding: str = "absolute"
  max_position_embeddings: int = 512
  # Added to every position id: RoBERTa's positions start after its padding id, at 2,
  # so its table has max length + 2 rows (514 for 512).
  position_offset: int = 0
  type_vocab_size: int = 2
  # False: the embeddings enter the first layer without a LayerNorm (XLNet).
  embedding_layer_norm: bool = True
  # Relative attention (XLNet): distances beyond are encoded as this one; -1: none.
  clamp_len: int = -1
  hidden_dropout: float = 0.1
  attention_dropout: float = 0.1
  layer_norm_eps: float = 1e-12
  initializer_range: float = 0.02
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


def initializer(config: ModelConfig, axes: tuple[str | None, ...], rows: int | None = None):
  """BERT's init, N(0, initializer_range) truncated at 2 standard deviations. With `rows`,
  only the first `rows` rows are drawn (as a table of that many rows would be) and the
  rows below are zeros (the vocabulary's padding rows)."""
  init = nn.initializers.truncated_normal(stddev=config.initializer_range)
  if rows is None:
    return nn.with_logical_partitioning(init, axes)

  def zero_padded(key, shape, dtype=jnp.float32):
    table = init(key, (rows, *shape[1:]), dtype)
    return jnp.pad(table, [(0, shape[0] - rows)] + [(0, 0)] * (len(shape) - 1))
  return nn.with_logical_partitioning(zero_padded, axes)


def zeros(axes):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), axes)


def dense(config: ModelConfig, features: int, axes: tuple[str, str], name: str) -> nn.Dense:
  """A Dense layer whose kernel [in, out] and bias [out] carry logical axes (its kernel
  gradient through `contraction.contract`)."""
  return nn.Dense(features, dtype=config.compute_dtype, param_dtype=config.weights_dtype,
                  kernel_init=initializer(config, axes), bias_init=zeros((axes[1],)),
                  dot_general=contraction.dot_general, name=name)


def layer_norm(config: ModelConfig, name: str, axis: str = "embed") -> nn.LayerNorm:
  # Two-pass variance: matches PyTorch to the last decimal where E[x^2]-E[x]^2 drifts.
  return nn.LayerNorm(epsilon=config.layer_norm_eps, dtype=config.compute_dtype,
                      param_dtype=config.weights_dtype, use_fast_variance=False,
                      scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(),
                                                              (axis,)),
                      bias_init=zeros((axis,)), name=name)


def constrain_hidden(x: jax.Array) -> jax.Array:
  return nn.with_logical_constraint(x, HIDDEN_AXES)

"""The model config: the encoder's sizes, and one group of fields per concern.

`ModelConfig` is the one definition of the model's fields: `config.model` in the config
schema (encoderx/config.py) is made from it (`config_section`), so a field is named and
defaulted once. The sizes, family, activation, dropout and dtypes are its own fields;
each other concern is a small frozen dataclass declared, and checked, beside the code
that reads it:

    model.embeddings    embeddings.EmbeddingsConfig   the input embeddings and positions
    model.attention     attention.AttentionConfig     variant, kernel, window, heads, ...
    model.feed_forward  encoder.FeedForwardConfig     mlp or gated, bias
    model.norm          common.NormConfig             kind, position, eps, bias
    model.layout        encoder.LayoutConfig          layer sharing, scan, remat
    model.init          common.InitConfig             scheme, range, cutoff
    model.heads         heads.HeadsConfig             MLM head, pooler, task heads

A family is a choice of these fields (no module asks which family it is in): BERT's are
the defaults; a family config (configs/<family>.py) sets the groups it changes, and its
conversion module (encoderx/hf/<family>.py) names them by path ('attention.window').
The flat names of older runs (model.local_attention, ...) are in moved.MOVED["field"].
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax.numpy as jnp
import ml_collections

from encoderx import errors
from encoderx.models import attention, common, embeddings, encoder, heads

DTYPES = ("float32", "bfloat16", "float16")
# The groups: field of ModelConfig -> its dataclass.
GROUPS = {
    "embeddings": embeddings.EmbeddingsConfig,
    "attention": attention.AttentionConfig,
    "feed_forward": encoder.FeedForwardConfig,
    "norm": common.NormConfig,
    "layout": encoder.LayoutConfig,
    "init": common.InitConfig,
    "heads": heads.HeadsConfig,
}


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
  # The feed-forward's activation, and the MLM head transform's.
  hidden_act: str = "gelu"
  # Dropout on the embeddings' and every sublayer's output (model.attention.dropout:
  # on the attention weights).
  hidden_dropout: float = 0.1
  dtype: str = "float32"  # compute dtype; bfloat16 on TPU.
  param_dtype: str = "float32"
  embeddings: embeddings.EmbeddingsConfig = embeddings.EmbeddingsConfig()
  attention: attention.AttentionConfig = attention.AttentionConfig()
  feed_forward: encoder.FeedForwardConfig = encoder.FeedForwardConfig()
  norm: common.NormConfig = common.NormConfig()
  layout: encoder.LayoutConfig = encoder.LayoutConfig()
  init: common.InitConfig = common.InitConfig()
  heads: heads.HeadsConfig = heads.HeadsConfig()

  @classmethod
  def from_config(cls, model_config, vocab_size: int | None = None) -> "ModelConfig":
    """From `config.model` (or a nested dict of its fields, some left out);
    `vocab_size` fills a config whose vocab_size is 0."""
    fields = nested(flat(model_config))
    groups = {name: GROUPS[name](**fields.pop(name, {})) for name in GROUPS}
    config = cls(**fields, **groups)
    if not config.vocab_size:
      if not vocab_size:
        raise ValueError("config.model.vocab_size is 0 and no vocabulary size was given.")
      config = config.replace(vocab_size=vocab_size)
    return config.replace(
        embeddings=dict(size=config.embeddings.size or config.hidden_size),
        attention=dict(relative_terms=tuple(config.attention.relative_terms)))

  def replace(self, **changes) -> "ModelConfig":
    """A copy with `changes`; a group's as a dict of its fields to change:
    `config.replace(layout=dict(scan=True), dtype="bfloat16")`."""
    for group, value in changes.items():
      if group in GROUPS and isinstance(value, Mapping):
        changes[group] = dataclasses.replace(getattr(self, group), **value)
    return dataclasses.replace(self, **changes)

  def with_fields(self, fields: Mapping[str, Any]) -> "ModelConfig":
    """A copy with the fields named by path changed ({'attention.window': 8}, as the
    Hugging Face conversion tables name them)."""
    return self.replace(**nested(fields))

  def field(self, path: str):
    """The value of the field at `path` ('attention.window')."""
    value = self
    for part in path.split("."):
      value = getattr(value, part)
    return value

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
    """The attention's key-value heads (attention.num_kv_heads, or num_heads for 0)."""
    return self.attention.num_kv_heads or self.num_heads

  def is_global_layer(self, index: int) -> bool:
    """Whether layer `index` attends globally (attention.window, attention.global_every)."""
    return not self.attention.window or index % self.attention.global_every == 0

  @property
  def first_layer_differs(self) -> bool:
    """The first layer has parameters the others lack or lack some of theirs (a pre-norm
    first layer without its attention norm): a scanned stack leaves it out."""
    return self.norm.position == "pre" and not self.norm.first_attention


def flat(model) -> dict[str, Any]:
  """The fields of a ModelConfig, config.model or a nested dict of them, by path
  ('attention.window'); lists (a config.json's) as tuples."""
  if isinstance(model, ml_collections.ConfigDict):
    model = model.to_dict()
  elif dataclasses.is_dataclass(model):
    model = {f.name: getattr(model, f.name) for f in dataclasses.fields(model)}
  fields = {}
  for name, value in model.items():
    if isinstance(value, Mapping) or dataclasses.is_dataclass(value):
      fields.update({f"{name}.{path}": inner for path, inner in flat(value).items()})
    else:
      fields[name] = tuple(value) if isinstance(value, list) else value
  return fields


def nested(fields: Mapping[str, Any]) -> dict[str, Any]:
  """{'attention.window': 8, 'dtype': ...} -> {'attention': {'window': 8}, 'dtype': ...}."""
  result = {}
  for path, value in fields.items():
    *groups, name = path.split(".")
    target = result
    for group in groups:
      target = target.setdefault(group, {})
    target[name] = value
  return result


def config_section() -> ml_collections.ConfigDict:
  """config.model: ModelConfig's fields with their defaults, a group per concern."""
  return ml_collections.ConfigDict(nested(flat(ModelConfig())))


def validate(model) -> None:
  """Checks config.model (or a ModelConfig): its own fields here, each group's beside
  the group (which also checks how it combines with the others); raises
  errors.ConfigError."""
  for field in ("hidden_size", "num_layers", "num_heads", "intermediate_size"):
    if getattr(model, field) <= 0:
      errors.fail(f"model.{field}", f"must be positive, got {getattr(model, field)}.")
  if model.hidden_size % model.num_heads:
    errors.fail("model.hidden_size", f"{model.hidden_size} is not divisible by "
                f"model.num_heads={model.num_heads}.")
  if model.vocab_size < 0:
    errors.fail("model.vocab_size", "must be >= 0 (0 means the default).")
  if model.vocab_multiple < 1:
    errors.fail("model.vocab_multiple", f"must be >= 1 (1: no padding rows), got "
                f"{model.vocab_multiple}.", "Use e.g. 128 to pad the vocabulary so that it "
                "splits over the mesh.")
  errors.check_choice("model.hidden_act", model.hidden_act, tuple(common.ACTIVATIONS))
  errors.check_fraction("model.hidden_dropout", model.hidden_dropout)
  errors.check_choice("model.dtype", model.dtype, DTYPES)
  errors.check_choice("model.param_dtype", model.param_dtype, DTYPES)
  embeddings.validate_embeddings(model)
  attention.validate(model)
  encoder.validate(model)
  common.validate_norm(model)
  common.validate_init(model)
  heads.validate(model)

"""What a family's conversion table is made of: `Transform`, `Rule`, `Head`, `Family`,
and the error every conversion raises (`ConversionError`).

The family modules (encoderx/hf/bert.py, ...) fill these in, with the building blocks of
encoderx/hf/rules.py; encoderx/hf/engine.py reads them. This module is the bottom of the
package: it imports nothing of encoderx/hf/.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Mapping

import numpy as np

from encoderx import errors
from encoderx.models import model_config


class ConversionError(errors.UserError, ValueError):
  """Weights or a configuration that cannot be converted; the message names what."""


@dataclasses.dataclass(frozen=True)
class Transform:
  to_flax: Callable[[np.ndarray, model_config.ModelConfig], np.ndarray]
  to_hf: Callable[[np.ndarray, model_config.ModelConfig], np.ndarray]


# (Hugging Face name, encoderx path 'a/b/c', transform). Several rules may name one
# Hugging Face weight that fuses several encoderx parameters (ModernBERT's Wqkv, Wi):
# each takes its block of rows (rules.rows), and export concatenates them in rule order.
Rule = tuple[str, str, Transform]


@dataclasses.dataclass(frozen=True)
class Head:
  """One Hugging Face class of a family and what it holds beyond the encoder.

  `rules(config)`: the rules of its own parts (HF names as the class names them; they
  may take encoderx parameters of the encoder_model too, as RoBERTa's classifier takes
  the pooler). `base_prefix`: the encoder's weights are under the family's prefix
  ('bert.'); False for the bare model (BertModel). `pooler`: the class's encoder has the
  family's pooler. `tied`: weights the class ties to others (the MLM decoder to the word
  embeddings), neither read nor written; a function of the ModelConfig where the config
  says whether they are tied (model.heads.tie_word_embeddings: `tied_names`). `labels`:
  config.json carries the labels.
  `hf_fields`: config fields that make the class hold these names (DeBERTa's legacy
  MLM head).
  """
  hf_class: str
  rules: Callable[[model_config.ModelConfig], list[Rule]] = lambda config: []
  base_prefix: bool = True
  pooler: bool = True
  tied: tuple[str, ...] | Callable[[model_config.ModelConfig], tuple[str, ...]] = ()
  labels: bool = False
  hf_fields: Mapping[str, object] = dataclasses.field(default_factory=dict)

  def tied_names(self, config: model_config.ModelConfig) -> tuple[str, ...]:
    """The weights tied in the class of this config."""
    return self.tied(config) if callable(self.tied) else self.tied


# encoderx model field, by path (ModelConfig.field: "norm.eps") -> the name of the same field
# in Hugging Face configs.
HF_FIELD_NAMES = {
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "intermediate_size": "intermediate_size",
    "hidden_act": "hidden_act",
    "embeddings.max_positions": "max_position_embeddings",
    "embeddings.type_vocab_size": "type_vocab_size",
    "hidden_dropout": "hidden_dropout_prob",
    "attention.dropout": "attention_probs_dropout_prob",
    "norm.eps": "layer_norm_eps",
    "init.range": "initializer_range"}


@dataclasses.dataclass(frozen=True)
class Family:
  """A transformers `model_type` with its rules.

  `name`: `model.family` here and `model_type` in config.json. `prefix`: where the task
  classes keep the encoder ('bert'). `encoder(config, prefix)`: rules of the embeddings
  and layers, HF names starting with `prefix` ('bert.' or ''). `pooler`: the pooler's
  dense under the prefix ('pooler.dense'; '' for a family whose encoder has none).
  `heads`: the classes by head name, most complete first ('pretraining', 'mlm',
  'sequence_classification', 'base'; the 'downstream' heads add 'token_classification'
  and 'question_answering').
  `field_names`: encoderx model field by path -> config.json field (HF_FIELD_NAMES, the
  BERT-like names, unless the family names them its own way). `hf_fields(config)` /
  `model_fields(hf_config)`: the family's own config.json fields beyond those, both ways.
  `check(config)`: raises ConversionError for
  configurations the family's classes cannot represent; `export_check(config, head)` those
  the class `head` reads but cannot write faithfully (DeBERTa's MLM classes: no enhanced
  mask decoder). `unread(config)`: rules of the weights (names after the prefix) that
  released checkpoints carry and the classes do not read: skipped on import, and their
  encoderx parameters left out on export and named. `pooler_act`: the
  activation of the family's pooler (`model.heads.pooler_act`; classes with a pooler refuse
  another). `tokenizer_class`: written to tokenizer_config.json, for
  a run whose vocabulary is of kind `vocab_kind` (config.data.vocab.kind) and of layout
  `vocab_layout` (config.data.vocab.layout; '' for WordPiece, which has one).
  """
  name: str
  config_class: str
  prefix: str
  encoder: Callable[[model_config.ModelConfig, str], list[Rule]]
  pooler: str
  heads: dict[str, Head]
  tokenizer_class: str
  vocab_kind: str
  field_names: Mapping[str, str] = dataclasses.field(default_factory=lambda: HF_FIELD_NAMES)
  hf_fields: Callable[[model_config.ModelConfig], dict] = lambda config: {}
  model_fields: Callable[[Mapping], dict] = lambda hf_config: {}
  check: Callable[[model_config.ModelConfig], None] = lambda config: None
  export_check: Callable[[model_config.ModelConfig, str], None] = lambda config, head: None
  unread: Callable[[model_config.ModelConfig], list[Rule]] = lambda config: []
  pooler_act: str = "tanh"
  vocab_layout: str = ""

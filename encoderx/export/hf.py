"""Hugging Face (PyTorch) <-> encoderx weights, both directions from one rule table.

A rule maps one Hugging Face parameter name to one encoderx parameter path with an
array transform and its inverse (PyTorch Linear stores [out, in]; Flax Dense [in, out];
attention kernels here are [hidden, heads, head_dim]). Converting in and back out is the
identity, which the tests check, and outputs on converted weights match the PyTorch
model's, which the tests check too.

A family (`Family`, registered with `register`) is one `model_type` of transformers: its
config class, how its config.json fields map to `config.model` (`model.family` names
it), the rules of its encoder, and its classes (`Head`s): the pretraining class, the
masked-LM class, task classes (sequence classification, ...) and the bare model, each with
the rules of the parts it holds beyond the encoder. Conversion is total: every weight of
the chosen class is mapped, and every encoderx parameter of the encoder too, or a
`ConversionError` names what is left; configurations the family cannot represent are
refused by the family's `check`.

    params = hf.from_hf(BertForPreTraining.from_pretrained(d).state_dict(), model_config)
    state_dict = hf.to_hf(params, model_config)  # the class that holds all of params
    state_dict = hf.to_hf(params, model_config, family="roberta", head="mlm")

A new family adds its encoder rules, its `Head`s, its config mapping, and one
`register(Family(...))` call: in this file (see the BERT block below) or in a module of
its own (hf_modernbert.py, hf_eurobert.py, imported by encoderx/export/__init__.py);
tests/export_checks.py has the checks every family passes.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Callable, Mapping

import flax
import flax.linen as nn
import jax
import numpy as np

from encoderx import errors
from encoderx.models import common, embeddings


class ConversionError(errors.UserError, ValueError):
  """Weights or a configuration that cannot be converted; the message names what."""


@dataclasses.dataclass(frozen=True)
class Transform:
  to_flax: Callable[[np.ndarray, common.ModelConfig], np.ndarray]
  to_hf: Callable[[np.ndarray, common.ModelConfig], np.ndarray]


# (Hugging Face name, encoderx path 'a/b/c', transform). Several rules may name one
# Hugging Face weight that fuses several encoderx parameters (ModernBERT's Wqkv, Wi):
# each takes its block of rows (`rows`), and export concatenates them in rule order.
Rule = tuple[str, str, Transform]

COPY = Transform(lambda x, c: x, lambda x, c: x)
LINEAR = Transform(lambda x, c: x.T, lambda x, c: x.T)
HEADS_IN = Transform(  # [heads*dim, hidden] -> [hidden, heads, dim]
    lambda x, c: x.T.reshape(x.shape[1], c.num_heads, c.head_dim),
    lambda x, c: x.reshape(x.shape[0], -1).T)
HEADS_BIAS = Transform(lambda x, c: x.reshape(c.num_heads, c.head_dim),
                       lambda x, c: x.reshape(-1))
HEADS_OUT = Transform(  # [hidden, heads*dim] -> [heads, dim, hidden]
    lambda x, c: x.T.reshape(c.num_heads, c.head_dim, x.shape[0]),
    lambda x, c: x.reshape(-1, x.shape[-1]).T)
# XLNet stores its output projection as [hidden, heads, dim]; ours is [heads, dim, hidden].
XLNET_HEADS_OUT = Transform(lambda x, c: x.transpose(1, 2, 0),
                            lambda x, c: x.transpose(2, 0, 1))
XLNET_MASK_EMB = Transform(lambda x, c: x.reshape(-1),  # [1, 1, hidden] -> [hidden]
                           lambda x, c: x.reshape(1, 1, -1))


def rows(transform: Transform, index: int, count: int) -> Transform:
  """`transform` of block `index` of `count` equal blocks of rows (axis 0) of a fused
  Hugging Face weight; export concatenates the blocks of one weight in rule order."""
  return Transform(lambda x, c: transform.to_flax(np.split(x, count)[index], c),
                   transform.to_hf)


def dense(hf: str, flax_path: str, kernel: Transform = LINEAR,
          bias: Transform = COPY, use_bias: bool = True) -> list[Rule]:
  return [(f"{hf}.weight", f"{flax_path}/kernel", kernel)] + (
      [(f"{hf}.bias", f"{flax_path}/bias", bias)] if use_bias else [])


def layer_norm(hf: str, flax_path: str, use_bias: bool = True) -> list[Rule]:
  return [(f"{hf}.weight", f"{flax_path}/scale", COPY)] + (
      [(f"{hf}.bias", f"{flax_path}/bias", COPY)] if use_bias else [])


# --- families and their classes --------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Head:
  """One Hugging Face class of a family and what it holds beyond the encoder.

  `rules(config)`: the rules of its own parts (HF names as the class names them; they
  may take encoderx parameters of the encoder_model too, as RoBERTa's classifier takes
  the pooler). `base_prefix`: the encoder's weights are under the family's prefix
  ('bert.'); False for the bare model (BertModel). `pooler`: the class's encoder has the
  family's pooler. `tied`: weights the class ties to others (the MLM decoder to the word
  embeddings), neither read nor written; a function of the ModelConfig where the config
  says whether they are tied (model.tie_word_embeddings: `tied_names`). `labels`:
  config.json carries the labels.
  `hf_fields`: config fields that make the class hold these names (DeBERTa's legacy
  MLM head).
  """
  hf_class: str
  rules: Callable[[common.ModelConfig], list[Rule]] = lambda config: []
  base_prefix: bool = True
  pooler: bool = True
  tied: tuple[str, ...] | Callable[[common.ModelConfig], tuple[str, ...]] = ()
  labels: bool = False
  hf_fields: Mapping[str, object] = dataclasses.field(default_factory=dict)

  def tied_names(self, config: common.ModelConfig) -> tuple[str, ...]:
    """The weights tied in the class of this config."""
    return self.tied(config) if callable(self.tied) else self.tied


# encoderx model field -> the name of the same field in Hugging Face configs.
HF_FIELD_NAMES = dict(
    vocab_size="vocab_size", hidden_size="hidden_size", num_layers="num_hidden_layers",
    num_heads="num_attention_heads", intermediate_size="intermediate_size",
    hidden_act="hidden_act", max_position_embeddings="max_position_embeddings",
    type_vocab_size="type_vocab_size", hidden_dropout="hidden_dropout_prob",
    attention_dropout="attention_probs_dropout_prob", layer_norm_eps="layer_norm_eps",
    initializer_range="initializer_range")


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
  `field_names`: encoderx model field -> config.json field (HF_FIELD_NAMES, the
  BERT-like names, unless the family names them its own way). `hf_fields(config)` /
  `model_fields(hf_config)`: the family's own config.json fields beyond those, both ways.
  `check(config)`: raises ConversionError for
  configurations the family's classes cannot represent; `export_check(config, head)` those
  the class `head` reads but cannot write faithfully (DeBERTa's MLM classes: no enhanced
  mask decoder). `unread(config)`: rules of the weights (names after the prefix) that
  released checkpoints carry and the classes do not read: skipped on import, and their
  encoderx parameters left out on export and named. `pooler_act`: the
  activation of the family's pooler (`model.pooler_act`; classes with a pooler refuse
  another). `tokenizer_class`: written to tokenizer_config.json, for
  a run whose vocabulary is of kind `vocab_kind` (config.data.vocab.kind) and, for
  SentencePiece, of layout `vocab_layout` (config.data.vocab.layout).
  """
  name: str
  config_class: str
  prefix: str
  encoder: Callable[[common.ModelConfig, str], list[Rule]]
  pooler: str
  heads: dict[str, Head]
  tokenizer_class: str
  vocab_kind: str
  field_names: Mapping[str, str] = dataclasses.field(default_factory=lambda: HF_FIELD_NAMES)
  hf_fields: Callable[[common.ModelConfig], dict] = lambda config: {}
  model_fields: Callable[[Mapping], dict] = lambda hf_config: {}
  check: Callable[[common.ModelConfig], None] = lambda config: None
  export_check: Callable[[common.ModelConfig, str], None] = lambda config, head: None
  unread: Callable[[common.ModelConfig], list[Rule]] = lambda config: []
  pooler_act: str = "tanh"
  vocab_layout: str = ""


FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
  FAMILIES[family.name] = family
  return family


def family_named(name: str) -> Family:
  if name not in FAMILIES:
    raise ConversionError(f"no Hugging Face conversion rules for family '{name}'; "
                          f"known: {', '.join(FAMILIES)}")
  return FAMILIES[name]


def head_of_class(family: str, hf_class: str) -> str | None:
  """The head name of one of the family's classes ('BertForPreTraining' -> 'pretraining')."""
  return next((name for name, head in family_named(family).heads.items()
               if head.hf_class == hf_class), None)


def class_rules(config: common.ModelConfig, family: str, head: str) -> list[Rule]:
  """Every rule of the family's class `head`: encoder, pooler (if it has one), head."""
  fam = family_named(family)
  if head not in fam.heads:
    raise ConversionError(f"family '{family}' has no class for head '{head}'; its heads: "
                          f"{', '.join(fam.heads)}.")
  spec = fam.heads[head]
  prefix = f"{fam.prefix}." if spec.base_prefix else ""
  rules = fam.encoder(config, prefix)
  if spec.pooler and fam.pooler:
    rules += dense(f"{prefix}{fam.pooler}", "encoder_model/pooler/dense")
  return rules + spec.rules(config)


# --- building blocks shared by the families --------------------------------------------
# Where each part of an encoder layer lives in a family's HF layer module.
BERT_LAYER = dict(
    query="attention.self.query", key="attention.self.key", value="attention.self.value",
    out="attention.output.dense", attention_norm="attention.output.LayerNorm",
    intermediate="intermediate.dense", output="output.dense", ffn_norm="output.LayerNorm")
ALBERT_LAYER = dict(
    query="attention.query", key="attention.key", value="attention.value",
    out="attention.dense", attention_norm="attention.LayerNorm",
    intermediate="ffn", output="ffn_output", ffn_norm="full_layer_layer_norm")


def layer_rules(hf: str, flax_path: str, names: dict[str, str]) -> list[Rule]:
  """Rules of one encoder layer: HF module `hf` (parts named by `names`) <-> `flax_path`."""
  attention = f"{flax_path}/attention/self_attention"
  return (dense(f"{hf}.{names['query']}", f"{attention}/query", HEADS_IN, HEADS_BIAS)
          + dense(f"{hf}.{names['key']}", f"{attention}/key", HEADS_IN, HEADS_BIAS)
          + dense(f"{hf}.{names['value']}", f"{attention}/value", HEADS_IN, HEADS_BIAS)
          + dense(f"{hf}.{names['out']}", f"{attention}/out", HEADS_OUT)
          + layer_norm(f"{hf}.{names['attention_norm']}", f"{flax_path}/attention/layer_norm")
          + dense(f"{hf}.{names['intermediate']}", f"{flax_path}/ffn/intermediate")
          + dense(f"{hf}.{names['output']}", f"{flax_path}/ffn/output")
          + layer_norm(f"{hf}.{names['ffn_norm']}", f"{flax_path}/ffn/layer_norm"))


def embedding_rules(hf: str) -> list[Rule]:
  """Token, position and token-type tables and their LayerNorm (BERT and ALBERT)."""
  flax_path = "encoder_model/embeddings"
  return [(f"{hf}embeddings.{table}.weight", f"{flax_path}/{table}/embedding", COPY)
          for table in ("word_embeddings", "position_embeddings", "token_type_embeddings")
          ] + layer_norm(f"{hf}embeddings.LayerNorm", f"{flax_path}/layer_norm")


def bert_encoder(config: common.ModelConfig, hf: str) -> list[Rule]:
  """Embeddings and layers of BERT and RoBERTa (`hf`: 'bert.', 'roberta.', '')."""
  rules = embedding_rules(hf)
  for i in range(config.num_layers):
    rules += layer_rules(f"{hf}encoder.layer.{i}", f"encoder_model/encoder/layer_{i}",
                         BERT_LAYER)
  return rules


def mlm_head(dense_name: str, layer_norm_name: str, bias: str) -> list[Rule]:
  """The MLM head's transform, LayerNorm and output bias (its decoder is the tied word
  embedding), named as the family names them."""
  return (dense(dense_name, "mlm_head/transform")
          + layer_norm(layer_norm_name, "mlm_head/layer_norm")
          + [(bias, "mlm_head/output_bias", COPY)])


def classifier(hf: str = "classifier") -> Callable[[common.ModelConfig], list[Rule]]:
  """The classify method's linear classifier (encoderx/models/finetuning.py)."""
  return lambda config: dense(hf, "classifier")


def token_heads(class_prefix: str) -> dict[str, Head]:
  """The family's token classification and extractive QA classes: a linear layer on the
  encoder's last hidden states, no pooler (the tag method's `classifier`, the qa
  method's `qa_outputs`; encoderx/models/finetuning.py)."""
  return {"token_classification": Head(f"{class_prefix}ForTokenClassification",
                                       classifier(), pooler=False, labels=True),
          "question_answering": Head(f"{class_prefix}ForQuestionAnswering",
                                     lambda config: dense("qa_outputs", "qa_outputs"),
                                     pooler=False)}


def refuse_unless_plain(config: common.ModelConfig, family: str, offset: int = 0) -> None:
  """What every BERT-like class needs: distinct layers, no embedding factorization,
  standard attention, absolute positions from `offset`."""
  if config.layer_sharing != "none":
    raise ConversionError(
        f"model.layer_sharing={config.layer_sharing!r} has no Hugging Face {family} "
        "equivalent (its layers are distinct); export it as family 'albert' "
        "(layer_sharing 'all') or train with layer_sharing='none'.")
  if config.embedding_size != config.hidden_size:
    raise ConversionError(
        f"model.embedding_size={config.embedding_size} != hidden_size: Hugging Face "
        f"{family} has no embedding projection (ALBERT has).")
  if config.attention != "standard" or config.position_embedding != "absolute":
    raise ConversionError(
        f"model.attention={config.attention!r} / position_embedding="
        f"{config.position_embedding!r}: Hugging Face {family} has standard attention "
        "with absolute positions.")
  if config.position_offset != offset:
    raise ConversionError(f"model.position_offset={config.position_offset}: Hugging Face "
                          f"{family} numbers positions from {offset}.")


# --- BERT (and SpanBERT, whose released models are BERTs without the SBO head) ----------
BERT_MLM = mlm_head("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm",
                    "cls.predictions.bias")
BERT_TIED = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")

register(Family(
    name="bert", config_class="BertConfig", prefix="bert", encoder=bert_encoder,
    pooler="pooler.dense", tokenizer_class="BertTokenizer", vocab_kind="wordpiece",
    heads={
        "pretraining": Head("BertForPreTraining", lambda config: BERT_MLM + dense(
            "cls.seq_relationship", "sentence_head/classifier"), tied=BERT_TIED),
        "mlm": Head("BertForMaskedLM", lambda config: BERT_MLM, pooler=False,
                    tied=BERT_TIED),
        "sequence_classification": Head("BertForSequenceClassification", classifier(),
                                        labels=True),
        **token_heads("Bert"),
        "base": Head("BertModel", base_prefix=False),
    },
    check=lambda config: refuse_unless_plain(config, "BERT")))


# --- RoBERTa ------------------------------------------------------------------------------
def _roberta_check(config: common.ModelConfig) -> None:
  if config.position_offset < 1:
    raise ConversionError("Hugging Face RoBERTa numbers positions from pad_token_id + 1; "
                          "model.position_offset must be at least 1 (RoBERTa's is 2).")
  refuse_unless_plain(config, "RoBERTa", offset=config.position_offset)


register(Family(
    name="roberta", config_class="RobertaConfig", prefix="roberta", encoder=bert_encoder,
    pooler="pooler.dense", tokenizer_class="RobertaTokenizer",
    vocab_kind="byte_bpe",
    heads={
        "mlm": Head("RobertaForMaskedLM", lambda config: mlm_head(
            "lm_head.dense", "lm_head.layer_norm", "lm_head.bias"), pooler=False,
                    tied=("lm_head.decoder.weight", "lm_head.decoder.bias")),
        # Its head is BERT's pooler (dense + tanh on the first token) then a linear
        # classifier: our pooler and classifier (modeling_roberta.py,
        # RobertaClassificationHead).
        "sequence_classification": Head(
            "RobertaForSequenceClassification", lambda config: dense(
                "classifier.dense", "encoder_model/pooler/dense") + dense(
                    "classifier.out_proj", "classifier"), pooler=False, labels=True),
        **token_heads("Roberta"),
        "base": Head("RobertaModel", base_prefix=False),
    },
    # Positions start after the padding id: pad_token_id is position_offset - 1.
    hf_fields=lambda config: dict(pad_token_id=config.position_offset - 1, bos_token_id=0,
                                  eos_token_id=2),
    model_fields=lambda hf_config: dict(
        position_offset=int(hf_config.get("pad_token_id", 1)) + 1),
    check=_roberta_check))


# --- ALBERT -------------------------------------------------------------------------------
def albert_encoder(config: common.ModelConfig, hf: str) -> list[Rule]:
  """ALBERT's layers are groups of shared layers: `layer_sharing='all'` is one group (the
  released models; our `shared_layer`), 'none' is one group per layer (HF
  num_hidden_groups = num_hidden_layers). Embeddings are always mapped to the hidden
  size (`embedding_hidden_mapping_in`, our Embeddings' `projection`)."""
  rules = embedding_rules(hf) + dense(f"{hf}encoder.embedding_hidden_mapping_in",
                                      "encoder_model/embeddings/projection")
  groups = ["shared_layer"] if config.layer_sharing == "all" else [
      f"layer_{i}" for i in range(config.num_layers)]
  for group, layer in enumerate(groups):
    rules += layer_rules(f"{hf}encoder.albert_layer_groups.{group}.albert_layers.0",
                         f"encoder_model/encoder/{layer}", ALBERT_LAYER)
  return rules


def _albert_check(config: common.ModelConfig) -> None:
  if config.layer_sharing not in ("all", "none"):
    raise ConversionError(
        f"model.layer_sharing={config.layer_sharing!r} has no Hugging Face ALBERT "
        "equivalent; ALBERT shares 'all' layers or (one group per layer) none.")
  if config.embedding_size == config.hidden_size:
    raise ConversionError("Hugging Face ALBERT always projects embeddings to the hidden "
                          "size; set model.embedding_size below model.hidden_size.")
  if (config.attention != "standard" or config.position_embedding != "absolute"
      or config.position_offset):
    raise ConversionError("Hugging Face ALBERT has standard attention with absolute "
                          "positions from 0.")


def _albert_model_fields(hf_config: Mapping) -> dict:
  groups = hf_config.get("num_hidden_groups", 1)
  if hf_config.get("inner_group_num", 1) != 1 or groups not in (
      1, hf_config["num_hidden_layers"]):
    raise ConversionError("ALBERT with inner_group_num != 1 or num_hidden_groups other "
                          "than 1 or num_hidden_layers is not supported.")
  return dict(embedding_size=hf_config["embedding_size"],
              layer_sharing="all" if groups == 1 else "none")


ALBERT_MLM = mlm_head("predictions.dense", "predictions.LayerNorm", "predictions.bias")
ALBERT_TIED = ("predictions.decoder.weight", "predictions.decoder.bias")

register(Family(
    name="albert", config_class="AlbertConfig", prefix="albert", encoder=albert_encoder,
    pooler="pooler", tokenizer_class="AlbertTokenizer",
    vocab_kind="sentencepiece", vocab_layout="albert",
    heads={
        "pretraining": Head("AlbertForPreTraining", lambda config: ALBERT_MLM + dense(
            "sop_classifier.classifier", "sentence_head/classifier"), tied=ALBERT_TIED),
        "mlm": Head("AlbertForMaskedLM", lambda config: ALBERT_MLM, pooler=False,
                    tied=ALBERT_TIED),
        "sequence_classification": Head("AlbertForSequenceClassification", classifier(),
                                        labels=True),
        **token_heads("Albert"),
        "base": Head("AlbertModel", base_prefix=False),
    },
    hf_fields=lambda config: dict(
        embedding_size=config.embedding_size,
        num_hidden_groups=1 if config.layer_sharing == "all" else config.num_layers),
    model_fields=_albert_model_fields, check=_albert_check))


# --- DeBERTa (v2 and v3: Hugging Face model_type 'deberta-v2') ----------------------------
# Followed: transformers models/deberta_v2/modeling_deberta_v2.py (DebertaV2Embeddings,
# DebertaV2Encoder, DisentangledSelfAttention, ContextPooler, DebertaV2ForMaskedLM).
DEBERTA_LAYER = dict(
    BERT_LAYER, query="attention.self.query_proj", key="attention.self.key_proj",
    value="attention.self.value_proj")


def deberta_encoder(config: common.ModelConfig, hf: str) -> list[Rule]:
  """BERT's embeddings and layers under DeBERTa's names, plus the relative distance table
  and its LayerNorm (`encoder.rel_embeddings`, `encoder.LayerNorm`) and, without
  share_att_key, each layer's position projections. The position table is the
  encoder's only with absolute positions in the input (position_biased_input); the
  token-type table only with token types."""
  flax_path = "encoder_model/embeddings"
  tables = ["word_embeddings"] + (["position_embeddings"]
                                  if config.position_embedding == "absolute" else []) + (
      ["token_type_embeddings"] if config.type_vocab_size > 0 else [])
  rules = [(f"{hf}embeddings.{table}.weight", f"{flax_path}/{table}/embedding", COPY)
           for table in tables] + layer_norm(f"{hf}embeddings.LayerNorm",
                                             f"{flax_path}/layer_norm")
  if config.attention == "disentangled":
    relative = "encoder_model/encoder/relative"
    rules += [(f"{hf}encoder.rel_embeddings.weight", f"{relative}/relative_embeddings",
               COPY)] + layer_norm(f"{hf}encoder.LayerNorm", f"{relative}/layer_norm")
  own_projections = [] if config.share_att_key or config.attention != "disentangled" else [
      (name, projection) for term, name, projection in (
          ("c2p", "pos_key_proj", "position_key"), ("p2c", "pos_query_proj", "position_query"))
      if term in config.relative_attention_terms]
  for i in range(config.num_layers):
    hf_layer, layer = f"{hf}encoder.layer.{i}", f"encoder_model/encoder/layer_{i}"
    rules += layer_rules(hf_layer, layer, DEBERTA_LAYER)
    for name, projection in own_projections:
      rules += dense(f"{hf_layer}.attention.self.{name}",
                     f"{layer}/attention/self_attention/{projection}", HEADS_IN, HEADS_BIAS)
  return rules


def _deberta_check(config: common.ModelConfig) -> None:
  if config.embedding_size != config.hidden_size:
    raise ConversionError(
        f"model.embedding_size={config.embedding_size} != hidden_size: Hugging Face "
        "DeBERTa projects embeddings before their LayerNorm, without bias; encoderx's "
        "DeBERTa needs model.embedding_size = hidden_size.")
  if config.layer_sharing != "none":
    raise ConversionError(f"model.layer_sharing={config.layer_sharing!r} has no Hugging "
                          "Face DeBERTa equivalent (its layers are distinct).")
  if config.attention not in ("disentangled", "standard") or config.position_offset:
    raise ConversionError(f"model.attention={config.attention!r} / position_offset="
                          f"{config.position_offset}: Hugging Face DeBERTa has "
                          "disentangled (or standard) attention with positions from 0.")


def _deberta_export_check(config: common.ModelConfig, head: str) -> None:
  if config.enhanced_mask_decoder and head in ("mlm", "mlm_legacy"):
    raise ConversionError(
        "model.enhanced_mask_decoder=True: Hugging Face DeBERTa has no enhanced mask "
        "decoder, so its MLM logits would differ; export the encoder (--head=base: "
        "the decoder is the MLM head's alone) or a model trained with "
        "model.enhanced_mask_decoder=False.")


def _deberta_hf_fields(config: common.ModelConfig) -> dict:
  """DebertaV2Config's fields for an encoderx model (see _deberta_model_fields); the
  pooler of the classification class is our pooler (dense + tanh on the first token)."""
  relative = config.attention == "disentangled"
  return dict(relative_attention=relative, pos_att_type=list(config.relative_attention_terms),
              position_buckets=config.position_buckets or -1,
              max_relative_positions=config.max_relative_positions,
              share_att_key=config.share_att_key,
              norm_rel_ebd="layer_norm" if relative else "none",
              position_biased_input=config.position_embedding == "absolute",
              pooler_hidden_act="tanh",
              legacy=False)  # the MLM head named as DeBERTa's checkpoints name it


def _deberta_model_fields(hf_config: Mapping) -> dict:
  """encoderx fields of a DebertaV2Config: disentangled attention when
  relative_attention (BERT's attention otherwise), absolute positions in the input when
  position_biased_input; no enhanced mask decoder (Hugging Face's models have none)."""
  get = hf_config.get
  if get("conv_kernel_size", 0):
    raise ConversionError("DeBERTa's convolution layer (conv_kernel_size, DeBERTa-v2 "
                          "xlarge and larger) is not supported.")
  hidden, heads = hf_config["hidden_size"], hf_config["num_attention_heads"]
  if get("embedding_size", hidden) != hidden:
    raise ConversionError("DeBERTa with embedding_size != hidden_size is not supported.")
  if get("attention_head_size", hidden // heads) != hidden // heads:
    raise ConversionError("attention_head_size must be hidden_size / num_attention_heads.")
  if get("pooler_hidden_act", "tanh") != "tanh" and get("architectures") and any(
      "SequenceClassification" in name for name in get("architectures")):
    raise ConversionError(f"pooler_hidden_act {get('pooler_hidden_act')!r}: encoderx's "
                          "pooler is tanh.")
  terms = get("pos_att_type") or ()
  terms = [t.strip() for t in (terms.lower().split("|") if isinstance(terms, str)
                               else terms)]
  if set(terms) - {"c2p", "p2c"}:
    raise ConversionError(f"pos_att_type {terms}: only 'c2p' and 'p2c' are supported.")
  fields = dict(position_embedding="absolute" if get("position_biased_input", True)
                else "none", attention="standard", type_vocab_size=get("type_vocab_size", 0),
                layer_norm_eps=get("layer_norm_eps", 1e-7), enhanced_mask_decoder=False)
  if get("relative_attention", False):
    norm = [n.strip() for n in str(get("norm_rel_ebd", "none")).lower().split("|")]
    if "layer_norm" not in norm:
      raise ConversionError("relative attention without norm_rel_ebd='layer_norm' "
                            "(DeBERTa v1's) is not supported.")
    max_relative = get("max_relative_positions", -1)
    fields.update(
        attention="disentangled",
        relative_attention_terms=tuple(t for t in ("c2p", "p2c") if t in terms),
        position_buckets=max(get("position_buckets", -1), 0),
        max_relative_positions=(max_relative if max_relative >= 1
                                else hf_config["max_position_embeddings"]),
        share_att_key=bool(get("share_att_key", False)))
  return fields


def _deberta_mlm(legacy: bool) -> list[Rule]:
  """DeBERTa's own checkpoints' head names (`lm_predictions.lm_head`, Hugging Face's
  legacy=False) or Hugging Face's legacy ones (`cls.predictions`): the same weights."""
  if legacy:
    return mlm_head("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm",
                    "cls.predictions.bias")
  return mlm_head("lm_predictions.lm_head.dense", "lm_predictions.lm_head.LayerNorm",
                  "lm_predictions.lm_head.bias")


register(Family(
    name="deberta-v2", config_class="DebertaV2Config", prefix="deberta",
    encoder=deberta_encoder, pooler="", tokenizer_class="DebertaV2Tokenizer",
    vocab_kind="sentencepiece", vocab_layout="deberta",
    heads={
        "mlm": Head("DebertaV2ForMaskedLM", lambda config: _deberta_mlm(False),
                    pooler=False),
        "mlm_legacy": Head("DebertaV2ForMaskedLM", lambda config: _deberta_mlm(True),
                           pooler=False, tied=BERT_TIED, hf_fields=dict(legacy=True)),
        # ContextPooler (dense + pooler_hidden_act on the first token, 'tanh' here) is our
        # pooler; then a linear classifier.
        "sequence_classification": Head(
            "DebertaV2ForSequenceClassification", lambda config: dense(
                "pooler.dense", "encoder_model/pooler/dense") + dense(
                    "classifier", "classifier"), pooler=False, labels=True),
        **token_heads("DebertaV2"),
        "base": Head("DebertaV2Model", base_prefix=False, pooler=False),
    },
    hf_fields=_deberta_hf_fields, model_fields=_deberta_model_fields, check=_deberta_check,
    export_check=_deberta_export_check,
    # Released v3 checkpoints keep the enhanced mask decoder's position table, which
    # their encoder does not read (position_biased_input=False; Hugging Face ignores it).
    unread=lambda config: [] if config.position_embedding == "absolute" else [
        ("embeddings.position_embeddings.weight",
         "encoder_model/embeddings/position_embeddings/embedding", COPY)]))


# --- ELECTRA (google-research/electra; transformers models/electra/modeling_electra.py) -----
def electra_encoder(config: common.ModelConfig, hf: str) -> list[Rule]:
  """BERT's encoder under `electra.`, and `embeddings_project` (our Embeddings'
  `projection`) when the embedding size differs from the hidden size."""
  rules = bert_encoder(config, hf)
  if config.embedding_size != config.hidden_size:
    rules += dense(f"{hf}embeddings_project", "encoder_model/embeddings/projection")
  return rules


def _electra_check(config: common.ModelConfig) -> None:
  if config.layer_sharing != "none":
    raise ConversionError(f"model.layer_sharing={config.layer_sharing!r} has no Hugging "
                          "Face ELECTRA equivalent (its layers are distinct).")
  if (config.attention != "standard" or config.position_embedding != "absolute"
      or config.position_offset):
    raise ConversionError(f"model.attention={config.attention!r} / position_embedding="
                          f"{config.position_embedding!r}: Hugging Face ELECTRA has "
                          "standard attention with absolute positions from 0.")


register(Family(
    name="electra", config_class="ElectraConfig", prefix="electra", encoder=electra_encoder,
    pooler="", tokenizer_class="ElectraTokenizer", vocab_kind="wordpiece",
    heads={
        # The discriminator (the electra method's transferable parameters: rtd_head).
        "pretraining": Head("ElectraForPreTraining", lambda config: dense(
            "discriminator_predictions.dense", "rtd_head/transform") + dense(
                "discriminator_predictions.dense_prediction", "rtd_head/classifier"),
                            pooler=False),
        # The generator, of its own (smaller) config. Hugging Face's generator head
        # applies GELU whatever hidden_act says (ElectraGeneratorPredictions), as
        # ELECTRA's models use.
        "mlm": Head("ElectraForMaskedLM", lambda config: mlm_head(
            "generator_predictions.dense", "generator_predictions.LayerNorm",
            "generator_lm_head.bias"), pooler=False, tied=("generator_lm_head.weight",)),
        # ElectraClassificationHead: dense + GELU on the first token (our pooler with
        # model.pooler_act='gelu'), then a linear classifier.
        "sequence_classification": Head(
            "ElectraForSequenceClassification", lambda config: dense(
                "classifier.dense", "encoder_model/pooler/dense") + dense(
                    "classifier.out_proj", "classifier"), pooler=False, labels=True),
        **token_heads("Electra"),
        "base": Head("ElectraModel", base_prefix=False, pooler=False),
    },
    hf_fields=lambda config: dict(embedding_size=config.embedding_size),
    model_fields=lambda hf_config: dict(
        embedding_size=hf_config.get("embedding_size", hf_config["hidden_size"]),
        pooler_act="gelu"),
    check=_electra_check, pooler_act="gelu"))


# --- XLNet (zihangdai/xlnet; transformers models/xlnet/modeling_xlnet.py) -------------------
def xlnet_encoder(config: common.ModelConfig, hf: str) -> list[Rule]:
  """The word embedding and, per layer, the relative attention (q, k, v, o, r kernels
  [hidden, heads, dim], no biases; the r_w / r_r / r_s biases and seg_embed of every
  layer: untie_r) with its LayerNorm, and the feed-forward."""
  rules = [(f"{hf}word_embedding.weight", "encoder_model/embeddings/word_embeddings/embedding",
            COPY)]
  for i in range(config.num_layers):
    layer, flax_layer = f"{hf}layer.{i}", f"encoder_model/encoder/layer_{i}"
    attention = f"{flax_layer}/attention/self_attention"
    rules += [(f"{layer}.rel_attn.{name}", f"{attention}/{ours}/kernel", COPY)
              for name, ours in (("q", "query"), ("k", "key"), ("v", "value"),
                                 ("r", "relative"))]
    rules += [(f"{layer}.rel_attn.o", f"{attention}/out/kernel", XLNET_HEADS_OUT)]
    rules += [(f"{layer}.rel_attn.{name}", f"{attention}/{name}", COPY)
              for name in ("r_w_bias", "r_r_bias", "r_s_bias", "seg_embed")]
    rules += (layer_norm(f"{layer}.rel_attn.layer_norm", f"{flax_layer}/attention/layer_norm")
              + dense(f"{layer}.ff.layer_1", f"{flax_layer}/ffn/intermediate")
              + dense(f"{layer}.ff.layer_2", f"{flax_layer}/ffn/output")
              + layer_norm(f"{layer}.ff.layer_norm", f"{flax_layer}/ffn/layer_norm"))
  return rules


# XLNet's config names its fields its own way, has one dropout rate and no token types or
# absolute positions.
XLNET_FIELD_NAMES = dict(
    vocab_size="vocab_size", hidden_size="d_model", num_layers="n_layer",
    num_heads="n_head", intermediate_size="d_inner", hidden_act="ff_activation",
    hidden_dropout="dropout", layer_norm_eps="layer_norm_eps",
    initializer_range="initializer_range", clamp_len="clamp_len")
# The encoderx fields of every XLNet (what XLNET_FIELD_NAMES does not cover).
XLNET_MODEL = dict(attention="two_stream_relative", position_embedding="none",
                   type_vocab_size=0, embedding_layer_norm=False)


def _xlnet_check(config: common.ModelConfig) -> None:
  differ = {name: getattr(config, name) for name, value in XLNET_MODEL.items()
            if getattr(config, name) != value}
  if differ or config.layer_sharing != "none":
    raise ConversionError(f"model fields {differ or {'layer_sharing': config.layer_sharing}}"
                          f" have no Hugging Face XLNet equivalent (it has {XLNET_MODEL}, "
                          "distinct layers).")


def _xlnet_model_fields(hf_config: Mapping) -> dict:
  if hf_config.get("attn_type", "bi") != "bi":
    raise ConversionError("XLNet with attn_type 'uni' (Transformer-XL's causal attention) "
                          "is not supported; encoderx's XLNet attends bidirectionally.")
  d_head = hf_config.get("d_head")
  if d_head is not None and d_head * hf_config["n_head"] != hf_config["d_model"]:
    raise ConversionError(f"XLNet with d_head={d_head} and n_head={hf_config['n_head']} "
                          f"(not d_model={hf_config['d_model']}) is not supported.")
  if not hf_config.get("untie_r", True):
    raise ConversionError("XLNet with untie_r=False (one set of attention biases for all "
                          "layers) is not supported.")
  return dict(attention_dropout=hf_config.get("dropout", 0.1), **XLNET_MODEL)


# mask_emb (the query stream's start) sits in the encoder of Hugging Face's classes and
# in the PLM head here; lm_loss's weight is tied to the word embedding.
register(Family(
    name="xlnet", config_class="XLNetConfig", prefix="transformer", encoder=xlnet_encoder,
    pooler="", tokenizer_class="XLNetTokenizer", vocab_kind="sentencepiece",
    vocab_layout="albert", field_names=XLNET_FIELD_NAMES,
    heads={
        "pretraining": Head("XLNetLMHeadModel", lambda config: [
            ("transformer.mask_emb", "plm_head/mask_emb", XLNET_MASK_EMB),
            ("lm_loss.bias", "plm_head/output_bias", COPY)], pooler=False,
                            tied=("lm_loss.weight",)),
        "base": Head("XLNetModel", lambda config: [
            ("mask_emb", "plm_head/mask_emb", XLNET_MASK_EMB)], base_prefix=False,
                     pooler=False),
    },
    # untie_r: every layer has its own r_w / r_r / r_s biases (XLNet's released models).
    hf_fields=lambda config: dict(d_head=config.head_dim, attn_type="bi", untie_r=True,
                                  bi_data=False, mem_len=None, reuse_len=None),
    model_fields=_xlnet_model_fields, check=_xlnet_check))


# --- configs --------------------------------------------------------------------------------


def hf_config(config: common.ModelConfig, family: str = "bert", **overrides):
  """The family's `transformers` config with the sizes of an encoderx ModelConfig."""
  import transformers  # pylint: disable=g-import-not-at-top
  fam = family_named(family)
  fields = {hf_name: getattr(config, name) for name, hf_name in fam.field_names.items()}
  fields.update(fam.hf_fields(config))
  fields.update(overrides)
  return getattr(transformers, fam.config_class)(**fields)


def model_fields(hf_config_dict: Mapping[str, object]) -> tuple[str, dict]:
  """(family, encoderx model fields, `family` included) of a Hugging Face config.json;
  the inverse of hf_config. Raises ConversionError for what encoderx cannot represent."""
  family = hf_config_dict.get("model_type")
  if family not in FAMILIES:
    raise ConversionError(f"model_type {family!r} has no conversion rules here; known: "
                          f"{', '.join(FAMILIES)}.")
  fields = {name: hf_config_dict[hf_name]
            for name, hf_name in FAMILIES[family].field_names.items()
            if hf_name in hf_config_dict}
  position_type = hf_config_dict.get("position_embedding_type", "absolute")
  if position_type != "absolute":
    raise ConversionError(f"position_embedding_type {position_type!r} is not supported "
                          "(only 'absolute').")
  fields.update(FAMILIES[family].model_fields(hf_config_dict))
  fields["family"] = family
  return family, fields


def hf_model(config: common.ModelConfig, family: str = "bert", head: str | None = None,
             **overrides):
  """A freshly initialized PyTorch model of the family's class `head` (default: the
  first, most complete one) with these sizes."""
  import transformers  # pylint: disable=g-import-not-at-top
  fam = family_named(family)
  spec = fam.heads[head or next(iter(fam.heads))]
  return getattr(transformers, spec.hf_class)(hf_config(config, family,
                                                        **{**spec.hf_fields, **overrides}))


def hf_pretraining_model(config: common.ModelConfig, family: str = "bert", **overrides):
  """The family's pretraining class (its first head), freshly initialized."""
  return hf_model(config, family, None, **overrides)


# --- conversion -----------------------------------------------------------------------------
# Buffers some classes save beside their weights; they are not parameters.
BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")
# encoderx parameters of the encoder proper: every one must convert.
ENCODER_PARTS = ("encoder_model/embeddings", "encoder_model/encoder")


def _numpy(value) -> np.ndarray:
  if hasattr(value, "detach"):  # a torch tensor
    value = value.detach().cpu().float().numpy()
  return np.asarray(value)


def part(path: str) -> str:
  """The model part a parameter belongs to: 'mlm_head', 'encoder_model/pooler', ..."""
  parts = path.split("/")
  return "/".join(parts[:2]) if parts[0] == "encoder_model" else parts[0]


def is_buffer(name: str) -> bool:
  return any(name.endswith(buffer) for buffer in BUFFERS)


def _flat_params(params, config: common.ModelConfig) -> dict[str, np.ndarray]:
  """Unboxed, unscanned, without the vocabulary's padding rows, by path."""
  params = nn.unbox(params)
  if config.scan_layers:
    params = unstack_layers(params, config.num_layers)
  params = embeddings.resize_vocabulary(params, config.vocab_size)
  return {"/".join(k): v for k, v in
          flax.traverse_util.flatten_dict(jax.device_get(params)).items()}


def exportable_heads(params, config: common.ModelConfig, family: str) -> list[str]:
  """The family's heads whose class holds nothing the params lack, most complete first."""
  fam = family_named(family)
  have = set(_flat_params(params, config))
  return [name for name in fam.heads
          if all(path in have for _, path, _ in class_rules(config, family, name))]


def export_state_dict(params, config: common.ModelConfig, family: str = "bert",
                      head: str | None = None,
                      drop: tuple[str, ...] | None = ()) -> tuple[dict, str, list[str]]:
  """encoderx params -> (HF state dict of numpy arrays, head, parts left out).

  `head` picks the class (default: the family's most complete class whose parts the
  params all have). Every weight of the class must come from a parameter, and every
  parameter must go to a weight, but for whole parts (heads, the pooler) named in
  `drop` (None: any part but the encoder's). Raises ConversionError naming the rest.
  The vocabulary's padding rows (model.vocab_multiple) are left out: the class has
  `vocab_size` rows, as config.json says.
  """
  fam = family_named(family)
  fam.check(config)
  flat = _flat_params(params, config)
  if head is None:
    candidates = exportable_heads(params, config, family)
    if not candidates:
      raise ConversionError(f"no {family} class fits parameters with parts "
                            f"{', '.join(sorted({part(p) for p in flat}))}.")
    head = candidates[0]
  fam.export_check(config, head)
  rules = class_rules(config, family, head)
  hf_class = fam.heads[head].hf_class
  if (config.pooler_act != fam.pooler_act
      and any(path.startswith("encoder_model/pooler/") for _, path, _ in rules)):
    raise ConversionError(f"model.pooler_act={config.pooler_act!r}: {hf_class}'s pooler "
                          f"applies {fam.pooler_act}.")
  missing = sorted(path for _, path, _ in rules if path not in flat)
  if missing:
    raise ConversionError(f"{hf_class} needs parameters these lack: {', '.join(missing)}.")
  used = {path for _, path, _ in rules}
  left = sorted(path for path in flat if path not in used)
  unread = {path for _, path, _ in fam.unread(config)}
  refused = [p for p in left if p not in unread and (
      part(p) in ENCODER_PARTS or (drop is not None and part(p) not in drop))]
  if refused:
    raise ConversionError(f"{hf_class} has no place for: {', '.join(refused)}.")
  state_dict = {}
  for hf_name, path, transform in rules:  # the blocks of a fused weight in rule order
    value = transform.to_hf(np.asarray(flat[path], np.float32), config)
    state_dict[hf_name] = (np.concatenate([state_dict[hf_name], value])
                           if hf_name in state_dict else value)
  return state_dict, head, sorted({p if p in unread else part(p) for p in left})


def to_hf(params, config: common.ModelConfig, family: str = "bert",
          head: str | None = None) -> dict[str, np.ndarray]:
  """encoderx params -> HF state dict (numpy arrays) of the class holding all of them;
  inverse of `from_hf`. Anything left over is a ConversionError."""
  return export_state_dict(params, config, family, head)[0]


def import_state_dict(state_dict: Mapping[str, object], config: common.ModelConfig,
                      family: str = "bert", head: str | None = None,
                      unused_heads: bool = False,
                      prefer: str | None = None) -> tuple[dict, str, list[str]]:
  """HF state dict -> (encoderx params as a nested dict of numpy arrays, head, unused).

  `head` names the class the weights are of (default: the family's class whose weights
  are all there and leave the fewest over; `prefer` breaks ties). Every weight of that
  class converts; a weight left over is a ConversionError. With `unused_heads`, weights
  may be of a class with no rules here (BertForQuestionAnswering, ...): its encoder (and
  pooler) convert and its head weights are returned in `unused`; the encoder's must
  still all convert. The vocabulary parameters come padded with zero rows to
  `config.padded_vocab_size` (model.vocab_multiple); export drops those rows again.
  """
  fam = family_named(family)
  fam.check(config)
  unread = {hf_name for hf_name, _, _ in fam.unread(config)}
  names = {name for name in state_dict if not is_buffer(name)
           and name.removeprefix(f"{fam.prefix}.") not in unread}
  candidates = [(name, class_rules(config, family, name),
                 set(fam.heads[name].tied_names(config)))
                for name in ([head] if head else fam.heads)]
  if unused_heads and not head:
    encoder = fam.encoder(config, f"{fam.prefix}.")
    if fam.pooler:
      pooler = dense(f"{fam.prefix}.{fam.pooler}", "encoder_model/pooler/dense")
      candidates.append(("encoder", encoder + pooler, set()))
    candidates.append(("encoder", encoder, set()))
  fits = []
  for name, rules, tied in candidates:
    needed = {hf_name for hf_name, _, _ in rules}
    fits.append((len(needed - names), len(names - needed - tied), name != prefer, name,
                 rules, needed, tied))
  absent, _, _, head, rules, needed, tied = min(fits, key=lambda fit: fit[:3])
  hf_class = fam.heads[head].hf_class if head in fam.heads else f"the {family} encoder"
  if absent:
    raise ConversionError(f"the weights lack what {hf_class} has: "
                          f"{', '.join(sorted(needed - names))}.")
  left = sorted(names - needed - tied)
  encoder_names = {hf_name for hf_name, _, _ in fam.encoder(config, f"{fam.prefix}.")
                   + fam.encoder(config, "")}
  refused = [n for n in left if not unused_heads or n in encoder_names
             or n.startswith((f"{fam.prefix}.embeddings.", f"{fam.prefix}.encoder.",
                              "embeddings.", "encoder."))]
  if refused:
    raise ConversionError(f"weights with no {family} conversion rule ({hf_class}): "
                          f"{', '.join(refused)}.")
  flat = {tuple(path.split("/")): transform.to_flax(_numpy(state_dict[hf_name]), config)
          for hf_name, path, transform in rules}
  params = embeddings.resize_vocabulary(flax.traverse_util.unflatten_dict(flat),
                                        config.padded_vocab_size)
  if config.scan_layers:
    params = stack_layers(params)
  return params, head, left


def from_hf(state_dict: Mapping[str, object], config: common.ModelConfig,
            family: str = "bert", expected=None, head: str | None = None) -> dict:
  """HF state dict -> encoderx params (nested dict of numpy arrays); every weight must
  convert. `expected` (an encoderx param tree, e.g. from `jax.eval_shape(model.init,
  ...)`) makes every missing or misshapen parameter an error too."""
  params, _, _ = import_state_dict(state_dict, config, family, head)
  if expected is not None:
    check_tree(params, expected)
  return params


_LAYER = re.compile(r"^layer_(\d+)$")


def stack_layers(params: dict) -> dict:
  """Per-layer params (layer_0, layer_1, ...) -> the nn.scan layout (layers/layer); the
  encoder's other parameters (e.g. DeBERTa's relative table) stay as they are, and so do
  leading layers whose parameters differ from the last's (a pre-norm first layer without
  its attention norm, model.first_attention_norm: encoderx/models/encoder.py scans the
  layers after it)."""
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


def check_tree(params, expected) -> None:
  """Raises ConversionError listing missing, unexpected and misshapen parameters."""
  got = {k: np.shape(v) for k, v in flax.traverse_util.flatten_dict(params).items()}
  want = {k: tuple(v.shape) for k, v in
          flax.traverse_util.flatten_dict(nn.unbox(expected)).items()}
  problems = [f"missing {'/'.join(k)}" for k in want.keys() - got.keys()]
  problems += [f"unexpected {'/'.join(k)}" for k in got.keys() - want.keys()]
  problems += [f"{'/'.join(k)}: shape {got[k]} != {want[k]}"
               for k in want.keys() & got.keys() if got[k] != want[k]]
  if problems:
    raise ConversionError("converted weights do not fit the model: "
                          + "; ".join(sorted(problems)))

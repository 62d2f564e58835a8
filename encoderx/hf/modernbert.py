"""ModernBERT <-> Hugging Face `modernbert` (transformers models/modernbert/).

Followed: transformers models/modernbert/modeling_modernbert.py (ModernBertEmbeddings,
ModernBertAttention's fused Wqkv, ModernBertMLP's fused Wi, ModernBertEncoderLayer
whose layer 0 has no attn_norm, ModernBertModel's final_norm, ModernBertPredictionHead,
ModernBertForMaskedLM / ForSequenceClassification / ForTokenClassification /
ForQuestionAnswering) and configuration_modernbert.py (layer_types, rope_parameters,
local_attention); AnswerDotAI/ModernBERT src/bert_layers/ (the model those classes
reproduce).

A ModernBERT is these encoderx fields (MODEL): rotary positions with theta per layer
kind, pre-norm LayerNorms (an embedding norm, none before layer 0's attention, a final
norm), a GeGLU feed-forward, local layers between global ones, biases as configured,
no token types; the MLM head's transform and the task classes' `head` are its
ModernBertPredictionHead (dense, activation, norm): our MLM transform and our pooler
(with model.heads.pooler_norm, also applied to every token by the token classification and
QA heads: model.heads.token_transform).
"""
from __future__ import annotations

from typing import Mapping

from encoderx.hf import base
from encoderx.hf import rules as hf_rules
from encoderx.models import model_config

# encoderx model field (by path) -> ModernBertConfig field.
FIELD_NAMES = {
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "intermediate_size": "intermediate_size",
    "hidden_act": "hidden_activation",
    "embeddings.max_positions": "max_position_embeddings",
    "norm.eps": "norm_eps",
    "init.range": "initializer_range",
    "init.cutoff": "initializer_cutoff_factor",
    "attention.dropout": "attention_dropout",
    "hidden_dropout": "mlp_dropout",
    "attention.bias": "attention_bias",
    "feed_forward.bias": "mlp_bias",
    "norm.bias": "norm_bias",
    "heads.decoder_bias": "decoder_bias",
    "heads.classifier_bias": "classifier_bias",
    "attention.window": "local_attention",
    "heads.tie_word_embeddings": "tie_word_embeddings",
    "heads.pooler_act": "classifier_activation"}
# ModernBertConfig's defaults of those fields: what a config.json that leaves one out
# means.
HF_DEFAULTS = dict(
    hidden_activation="gelu", max_position_embeddings=8192, norm_eps=1e-5,
    initializer_range=0.02, initializer_cutoff_factor=2.0, attention_dropout=0.0,
    mlp_dropout=0.0, attention_bias=False, mlp_bias=False, norm_bias=False,
    decoder_bias=True, classifier_bias=False, local_attention=128,
    tie_word_embeddings=True, classifier_activation="gelu")
# The encoderx fields of every ModernBERT (those FIELD_NAMES does not cover).
MODEL = {
    "attention.variant": "standard",
    "embeddings.position": "rotary",
    "embeddings.type_vocab_size": 0,
    "embeddings.position_offset": 0,
    "embeddings.layer_norm": True,
    "norm.kind": "layer_norm",
    "norm.position": "pre",
    "norm.first_attention": False,
    "feed_forward.kind": "gated",
    "attention.num_kv_heads": 0,
    "heads.mlm_transform": True,
    "heads.pooler_norm": True,
    "heads.token_transform": True,
    "layout.sharing": "none"}
POOLINGS = {"cls": "first_token", "mean": "mean"}  # classifier_pooling -> ours
GLOBAL, LOCAL = "full_attention", "sliding_attention"  # Hugging Face's layer_types


def encoder(config: model_config.ModelConfig, prefix: str) -> list[base.Rule]:
  """The token embedding and its norm, the layers (Wqkv fused: query, key, value rows;
  Wi fused: the activated `intermediate` rows, then the `linear` ones), the final
  norm. Weights under `prefix` ('model.' or '')."""
  norm_bias, attention_bias = config.norm.bias, config.attention.bias
  mlp_bias = config.feed_forward.bias
  embeddings = "encoder_model/embeddings"
  rules = [(f"{prefix}embeddings.tok_embeddings.weight",
            f"{embeddings}/word_embeddings/embedding", hf_rules.COPY)]
  rules += hf_rules.layer_norm(f"{prefix}embeddings.norm", f"{embeddings}/layer_norm", norm_bias)
  for i in range(config.num_layers):
    layer, flax_layer = f"{prefix}layers.{i}", f"encoder_model/encoder/layer_{i}"
    attention = f"{flax_layer}/attention/self_attention"
    if i > 0:  # layer 0's attn_norm is Identity (model.norm.first_attention=False)
      rules += hf_rules.layer_norm(f"{layer}.attn_norm", f"{flax_layer}/attention/layer_norm",
                             norm_bias)
    for j, name in enumerate(("query", "key", "value")):
      rules += hf_rules.dense(f"{layer}.attn.Wqkv", f"{attention}/{name}", hf_rules.rows(hf_rules.HEADS_IN, j, 3),
                        hf_rules.rows(hf_rules.HEADS_BIAS, j, 3), attention_bias)
    rules += hf_rules.dense(f"{layer}.attn.Wo", f"{attention}/out", hf_rules.HEADS_OUT,
                      use_bias=attention_bias)
    rules += hf_rules.layer_norm(f"{layer}.mlp_norm", f"{flax_layer}/ffn/layer_norm", norm_bias)
    for j, name in enumerate(("intermediate", "linear")):
      rules += hf_rules.dense(f"{layer}.mlp.Wi", f"{flax_layer}/ffn/{name}", hf_rules.rows(hf_rules.LINEAR, j, 2),
                        hf_rules.rows(hf_rules.COPY, j, 2), mlp_bias)
    rules += hf_rules.dense(f"{layer}.mlp.Wo", f"{flax_layer}/ffn/output", use_bias=mlp_bias)
  return rules + hf_rules.layer_norm(f"{prefix}final_norm", "encoder_model/encoder/final_layer_norm",
                               norm_bias)


def _mlm(config: model_config.ModelConfig) -> list[base.Rule]:
  """ModernBertForMaskedLM's head (dense, norm) and decoder (its bias; its weight when
  not tied to the token embedding)."""
  rules = (hf_rules.dense("head.dense", "mlm_head/transform", use_bias=config.heads.classifier_bias)
           + hf_rules.layer_norm("head.norm", "mlm_head/layer_norm", config.norm.bias))
  if config.heads.decoder_bias:
    rules.append(("decoder.bias", "mlm_head/output_bias", hf_rules.COPY))
  if not config.heads.tie_word_embeddings:
    rules.append(("decoder.weight", "mlm_head/output_embeddings/embedding", hf_rules.COPY))
  return rules


def _task(classifier: str):
  """A task class's rules: its ModernBertPredictionHead (our pooler) and `classifier`
  (our `classifier`, or the QA head's `qa_outputs`)."""
  return lambda config: (
      hf_rules.dense("head.dense", "encoder_model/pooler/dense",
                     use_bias=config.heads.classifier_bias)
      + hf_rules.layer_norm("head.norm", "encoder_model/pooler/layer_norm", config.norm.bias)
      + hf_rules.dense("classifier", classifier))


def global_every(layer_types: list[str]) -> int:
  """n such that layer i is global exactly when i % n == 0 (Hugging Face's
  global_attn_every_n_layers), from config.json's layer_types."""
  if LOCAL not in layer_types:
    return 1
  for every in range(1, len(layer_types) + 1):
    if all((lt == GLOBAL) == (i % every == 0) for i, lt in enumerate(layer_types)):
      return every
  raise base.ConversionError(f"layer_types {layer_types}: encoderx's local layers are "
                           "those not every n-th from the first (global_attn_every_n_layers).")


def check(config: model_config.ModelConfig) -> None:
  differ = {name: config.field(name) for name, value in MODEL.items()
            if config.field(name) != value and name != "attention.num_kv_heads"}
  if config.kv_heads != config.num_heads:
    differ["attention.num_kv_heads"] = config.attention.num_kv_heads
  if differ:
    raise base.ConversionError(f"model fields {differ} have no Hugging Face ModernBERT "
                             f"equivalent (it has {MODEL}).")
  if config.embeddings.size != config.hidden_size:
    raise base.ConversionError(f"model.embeddings.size={config.embeddings.size} != hidden_size: "
                             "Hugging Face ModernBERT has no embedding projection.")
  if config.heads.pooling not in POOLINGS.values():
    raise base.ConversionError(f"model.heads.pooling={config.heads.pooling!r}: "
                             "Hugging Face ModernBERT pools 'first_token' (cls) or 'mean'.")
  if config.heads.pooler_act != config.hidden_act:
    raise base.ConversionError(f"model.heads.pooler_act={config.heads.pooler_act!r} != hidden_act="
                             f"{config.hidden_act!r}: Hugging Face ModernBERT's MLM and task "
                             "heads share one activation (classifier_activation).")


def hf_fields(config: model_config.ModelConfig) -> dict:
  """ModernBertConfig's fields beyond FIELD_NAMES: the layer kinds, rotary theta per
  kind, pooling. The special token ids are the vocabulary's, not the released model's
  (ModernBertConfig's defaults, of its 50,368-token vocabulary): None here, the exported
  tokenizer's in an export (export/writer.py)."""
  layer_types = [GLOBAL if config.is_global_layer(i) else LOCAL
                 for i in range(config.num_layers)]
  rope = {kind: {"rope_type": "default", "rope_theta": float(theta)} for kind, theta in (
      (GLOBAL, config.embeddings.rope_theta),
      (LOCAL, config.embeddings.local_rope_theta or config.embeddings.rope_theta))}
  return dict(layer_types=layer_types, rope_parameters=rope,
              global_attn_every_n_layers=config.attention.global_every,
              classifier_pooling={v: k for k, v in POOLINGS.items()}[
                  config.heads.pooling],
              embedding_dropout=config.hidden_dropout, classifier_dropout=0.0,
              initializer_cutoff_factor=config.init.cutoff,
              pad_token_id=None, bos_token_id=None, eos_token_id=None, cls_token_id=None,
              sep_token_id=None)


def model_fields(hf_config: Mapping) -> dict:
  """encoderx fields of a ModernBertConfig (config.json): transformers 5's layer_types
  and rope_parameters, or the older global_attn_every_n_layers, global_rope_theta and
  local_rope_theta."""
  get = hf_config.get
  if get("model_type", "modernbert") != "modernbert":
    raise base.ConversionError(f"a config.json of model_type {get('model_type')!r} is not a "
                             "ModernBERT's (model_type 'modernbert').")
  fields = {name: get(hf_name, HF_DEFAULTS.get(hf_name)) for name, hf_name in
            FIELD_NAMES.items() if hf_name in hf_config or hf_name in HF_DEFAULTS}
  if fields["heads.pooler_act"] != fields["hidden_act"]:
    raise base.ConversionError(
        f"classifier_activation {fields['heads.pooler_act']!r} != hidden_activation "
        f"{fields['hidden_act']!r}: encoderx's MLM head applies hidden_act.")
  if get("rope_scaling"):
    raise base.ConversionError(f"rope_scaling {get('rope_scaling')}: only plain rotary "
                             "positions are supported.")
  rope = get("rope_parameters") or {}
  thetas = {}
  for kind, legacy, default in ((GLOBAL, "global_rope_theta", 160_000.0),
                                (LOCAL, "local_rope_theta", 10_000.0)):
    parameters = rope.get(kind) or {}
    if parameters.get("rope_type", "default") != "default":
      raise base.ConversionError(f"rope_parameters[{kind!r}] of rope_type "
                               f"{parameters['rope_type']!r}: only 'default' is supported.")
    thetas[kind] = float(parameters.get("rope_theta", get(legacy, default)))
  layer_types = get("layer_types")
  every = global_every(layer_types) if layer_types else get("global_attn_every_n_layers", 3)
  pooling = get("classifier_pooling", "cls")
  if pooling not in POOLINGS:
    raise base.ConversionError(f"classifier_pooling {pooling!r}: only 'cls' and 'mean'.")
  cutoff = get("initializer_cutoff_factor", 2.0)
  return {**fields, **MODEL, "embeddings.rope_theta": thetas[GLOBAL],
          "embeddings.local_rope_theta": thetas[LOCAL], "attention.global_every": every,
          "heads.pooling": POOLINGS[pooling], "init.scheme": "megatron",
          "init.cutoff": 3.0 if cutoff is None else cutoff}


FAMILY = base.Family(
    name="modernbert", config_class="ModernBertConfig", prefix="model", encoder=encoder,
    pooler="", tokenizer_class="PreTrainedTokenizerFast", vocab_kind="byte_bpe",
    vocab_layout="bert",
    field_names=FIELD_NAMES,
    heads={
        "mlm": base.Head("ModernBertForMaskedLM", _mlm, pooler=False, tied=lambda config: (
            ("decoder.weight",) if config.heads.tie_word_embeddings else ())),
        "sequence_classification": base.Head("ModernBertForSequenceClassification",
                                           _task("classifier"), pooler=False, labels=True),
        "token_classification": base.Head("ModernBertForTokenClassification",
                                        _task("classifier"), pooler=False, labels=True),
        "question_answering": base.Head("ModernBertForQuestionAnswering", _task("qa_outputs"),
                                      pooler=False, hf_fields=dict(num_labels=2)),
        "base": base.Head("ModernBertModel", base_prefix=False, pooler=False),
    },
    hf_fields=hf_fields, model_fields=model_fields, check=check, pooler_act="gelu")

"""EuroBERT <-> Hugging Face `eurobert` (transformers models/eurobert/).

Followed: transformers models/eurobert/modeling_eurobert.py (EuroBertModel: no embedding
norm, EuroBertDecoderLayer's pre-norm RMSNorms input_layernorm and
post_attention_layernorm, EuroBertAttention's grouped-query q/k/v/o_proj, EuroBertMLP's
SwiGLU gate/up/down_proj, the final norm; EuroBertForMaskedLM's untied lm_head,
EuroBertForSequenceClassification's dense + GELU + classifier with classifier_pooling
bos / mean / late, EuroBertForTokenClassification's classifier) and
configuration_eurobert.py. transformers 5.23 has no EuroBertForQuestionAnswering.

A EuroBERT is these encoderx fields (MODEL): rotary positions (one theta), pre-norm
RMSNorms without an embedding norm, a SwiGLU feed-forward, key-value heads
(model.attention.num_kv_heads), biases as attention_bias and mlp_bias say, the MLM head without
transform, scored by its own table (model.heads.tie_word_embeddings False) with a bias as
mlp_bias; the sequence classifier's dense + GELU is our pooler.
"""
from __future__ import annotations

from typing import Mapping

from encoderx.hf import base
from encoderx.hf import rules as hf_rules
from encoderx.models import model_config

# encoderx model field (by path) -> EuroBertConfig field.
FIELD_NAMES = {
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "intermediate_size": "intermediate_size",
    "hidden_act": "hidden_act",
    "embeddings.max_positions": "max_position_embeddings",
    "norm.eps": "rms_norm_eps",
    "init.range": "initializer_range",
    "attention.dropout": "attention_dropout",
    "attention.num_kv_heads": "num_key_value_heads",
    "attention.bias": "attention_bias",
    "feed_forward.bias": "mlp_bias",
    "heads.tie_word_embeddings": "tie_word_embeddings"}
# EuroBertConfig's defaults of those fields.
HF_DEFAULTS = dict(
    hidden_act="silu", max_position_embeddings=8192, rms_norm_eps=1e-5,
    initializer_range=0.02, attention_dropout=0.0, attention_bias=False, mlp_bias=False,
    tie_word_embeddings=False)
# The encoderx fields of every EuroBERT (those FIELD_NAMES does not cover).
MODEL = {
    "attention.variant": "standard",
    "embeddings.position": "rotary",
    "embeddings.type_vocab_size": 0,
    "embeddings.position_offset": 0,
    "embeddings.layer_norm": False,
    "norm.kind": "rms_norm",
    "norm.bias": False,
    "norm.position": "pre",
    "norm.first_attention": True,
    "feed_forward.kind": "gated",
    "attention.window": 0,
    "heads.mlm_transform": False,
    "heads.pooler_act": "gelu",
    "heads.pooler_norm": False,
    "heads.classifier_bias": True,
    "heads.token_transform": False,
    "layout.sharing": "none"}
POOLINGS = {"bos": "first_token", "mean": "mean", "late": "late"}  # classifier_pooling

# Key and value projections of num_kv_heads heads: [kv_heads*dim, hidden] <->
# [hidden, kv_heads, dim].
KV_HEADS_IN = base.Transform(lambda x, c: x.T.reshape(x.shape[1], -1, c.head_dim),
                           lambda x, c: x.reshape(x.shape[0], -1).T)
KV_HEADS_BIAS = base.Transform(lambda x, c: x.reshape(-1, c.head_dim),
                             lambda x, c: x.reshape(-1))


def encoder(config: model_config.ModelConfig, prefix: str) -> list[base.Rule]:
  """The token embedding, the layers, the final norm; weights under `prefix`."""
  bias, mlp_bias = config.attention.bias, config.feed_forward.bias
  rules = [(f"{prefix}embed_tokens.weight", "encoder_model/embeddings/word_embeddings/embedding",
            hf_rules.COPY)]
  for i in range(config.num_layers):
    layer, flax_layer = f"{prefix}layers.{i}", f"encoder_model/encoder/layer_{i}"
    attention = f"{flax_layer}/attention/self_attention"
    rules += hf_rules.layer_norm(f"{layer}.input_layernorm", f"{flax_layer}/attention/layer_norm",
                           use_bias=False)
    rules += hf_rules.dense(f"{layer}.self_attn.q_proj", f"{attention}/query", hf_rules.HEADS_IN,
                      hf_rules.HEADS_BIAS, bias)
    for name, ours in (("k_proj", "key"), ("v_proj", "value")):
      rules += hf_rules.dense(f"{layer}.self_attn.{name}", f"{attention}/{ours}", KV_HEADS_IN,
                        KV_HEADS_BIAS, bias)
    rules += hf_rules.dense(f"{layer}.self_attn.o_proj", f"{attention}/out", hf_rules.HEADS_OUT,
                      use_bias=bias)
    rules += hf_rules.layer_norm(f"{layer}.post_attention_layernorm", f"{flax_layer}/ffn/layer_norm",
                           use_bias=False)
    for name, ours in (("gate_proj", "intermediate"), ("up_proj", "linear"),
                       ("down_proj", "output")):
      rules += hf_rules.dense(f"{layer}.mlp.{name}", f"{flax_layer}/ffn/{ours}", use_bias=mlp_bias)
  return rules + hf_rules.layer_norm(f"{prefix}norm", "encoder_model/encoder/final_layer_norm",
                               use_bias=False)


def _mlm(config: model_config.ModelConfig) -> list[base.Rule]:
  """EuroBertForMaskedLM's lm_head: its weight (when not tied) and bias (mlp_bias)."""
  rules = [] if config.heads.tie_word_embeddings else [
      ("lm_head.weight", "mlm_head/output_embeddings/embedding", hf_rules.COPY)]
  return rules + ([("lm_head.bias", "mlm_head/output_bias", hf_rules.COPY)]
                  if config.heads.decoder_bias else [])


def check(config: model_config.ModelConfig) -> None:
  differ = {name: config.field(name) for name, value in MODEL.items()
            if config.field(name) != value}
  if differ:
    raise base.ConversionError(f"model fields {differ} have no Hugging Face EuroBERT "
                             f"equivalent (it has {MODEL}).")
  if config.embeddings.size != config.hidden_size:
    raise base.ConversionError(f"model.embeddings.size={config.embeddings.size} != hidden_size: "
                             "Hugging Face EuroBERT has no embedding projection.")
  if config.heads.decoder_bias != config.feed_forward.bias:
    raise base.ConversionError(f"model.heads.decoder_bias={config.heads.decoder_bias} != mlp_bias="
                             f"{config.feed_forward.bias}: Hugging Face EuroBERT's lm_head has "
                             "a bias "
                             "exactly when its feed-forward has (mlp_bias).")


def hf_fields(config: model_config.ModelConfig) -> dict:
  """EuroBertConfig's fields beyond FIELD_NAMES. The special token ids are the
  vocabulary's, not the released model's (EuroBertConfig's defaults, of its 128,256-token
  vocabulary): None here (mask_token_id, which must be an int, keeps its default), the
  exported tokenizer's in an export (export/writer.py), the run's vocabulary's in the
  PyTorch counterparts (tools/parity/adapter_base.hf_model)."""
  return dict(num_key_value_heads=config.kv_heads, head_dim=config.head_dim,
              rope_parameters={"rope_type": "default",
                               "rope_theta": float(config.embeddings.rope_theta)},
              classifier_pooling={v: k for k, v in POOLINGS.items()}[config.heads.pooling],
              pad_token_id=None, bos_token_id=None, eos_token_id=None)


def model_fields(hf_config: Mapping) -> dict:
  """encoderx fields of a EuroBertConfig (config.json): rope_parameters (transformers 5)
  or rope_theta (older configs), classifier_pooling (or the released configs'
  clf_pooling)."""
  get = hf_config.get
  if get("model_type", "eurobert") != "eurobert":
    raise base.ConversionError(f"a config.json of model_type {get('model_type')!r} is not a "
                             "EuroBERT's (model_type 'eurobert').")
  fields = {name: get(hf_name, HF_DEFAULTS.get(hf_name)) for name, hf_name in
            FIELD_NAMES.items() if hf_name in hf_config or hf_name in HF_DEFAULTS}
  fields["attention.num_kv_heads"] = fields.get("attention.num_kv_heads") or 0
  hidden, heads = hf_config["hidden_size"], hf_config["num_attention_heads"]
  if get("head_dim") not in (None, hidden // heads):
    raise base.ConversionError(f"head_dim {get('head_dim')} != hidden_size / "
                             f"num_attention_heads = {hidden // heads} is not supported.")
  if get("rope_scaling"):
    raise base.ConversionError(f"rope_scaling {get('rope_scaling')}: only plain rotary "
                             "positions are supported.")
  rope = get("rope_parameters") or {}
  if rope.get("rope_type", "default") != "default":
    raise base.ConversionError(f"rope_parameters of rope_type {rope['rope_type']!r}: only "
                             "'default' is supported.")
  pooling = get("classifier_pooling", get("clf_pooling", "late"))
  if pooling not in POOLINGS:
    raise base.ConversionError(f"classifier_pooling {pooling!r}: only {', '.join(POOLINGS)}.")
  return {**fields, **MODEL, "embeddings.rope_theta": float(
              rope.get("rope_theta", get("rope_theta", 10_000.0))),
          "heads.decoder_bias": fields["feed_forward.bias"],
          "heads.pooling": POOLINGS[pooling], "hidden_dropout": 0.0, "init.scheme": "bert",
          "init.cutoff": 0.0}


FAMILY = base.Family(
    name="eurobert", config_class="EuroBertConfig", prefix="model", encoder=encoder,
    pooler="", tokenizer_class="PreTrainedTokenizerFast", vocab_kind="byte_bpe",
    vocab_layout="eurobert",
    field_names=FIELD_NAMES,
    heads={
        "mlm": base.Head("EuroBertForMaskedLM", _mlm, pooler=False, tied=lambda config: (
            ("lm_head.weight",) if config.heads.tie_word_embeddings else ())),
        # dense + GELU (our pooler, model.heads.pooler_act 'gelu'), then the classifier.
        "sequence_classification": base.Head(
            "EuroBertForSequenceClassification", lambda config: hf_rules.dense(
                "dense", "encoder_model/pooler/dense") + hf_rules.dense("classifier", "classifier"),
            pooler=False, labels=True),
        "token_classification": base.Head("EuroBertForTokenClassification",
                                        hf_rules.classifier(), pooler=False, labels=True),
        "base": base.Head("EuroBertModel", base_prefix=False, pooler=False),
    },
    hf_fields=hf_fields, model_fields=model_fields, check=check, pooler_act="gelu")

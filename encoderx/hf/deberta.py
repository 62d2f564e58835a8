"""DeBERTa v2 and v3 (Hugging Face model_type 'deberta-v2').

Followed: transformers models/deberta_v2/modeling_deberta_v2.py (DebertaV2Embeddings,
DebertaV2Encoder, DisentangledSelfAttention, ContextPooler, DebertaV2ForMaskedLM).
"""
from __future__ import annotations

from typing import Mapping

from encoderx.hf import base, bert, rules
from encoderx.models import model_config

LAYER = dict(
    rules.BERT_LAYER, query="attention.self.query_proj", key="attention.self.key_proj",
    value="attention.self.value_proj")


def encoder(config: model_config.ModelConfig, hf: str) -> list[base.Rule]:
  """BERT's embeddings and layers under DeBERTa's names, plus the relative distance table
  and its LayerNorm (`encoder.rel_embeddings`, `encoder.LayerNorm`) and, without
  share_att_key, each layer's position projections. The position table is the
  encoder's only with absolute positions in the input (position_biased_input); the
  token-type table only with token types."""
  flax_path = "encoder_model/embeddings"
  tables = ["word_embeddings"] + (["position_embeddings"]
                                  if config.embeddings.position == "absolute" else []) + (
      ["token_type_embeddings"] if config.embeddings.type_vocab_size > 0 else [])
  encoder_rules = [
      (f"{hf}embeddings.{table}.weight", f"{flax_path}/{table}/embedding", rules.COPY)
      for table in tables] + rules.layer_norm(f"{hf}embeddings.LayerNorm",
                                              f"{flax_path}/layer_norm")
  if config.attention.variant == "disentangled":
    relative = "encoder_model/encoder/relative"
    encoder_rules += [(f"{hf}encoder.rel_embeddings.weight",
                       f"{relative}/relative_embeddings", rules.COPY)] + rules.layer_norm(
                           f"{hf}encoder.LayerNorm", f"{relative}/layer_norm")
  own_projections = [] if (config.attention.share_att_key
                           or config.attention.variant != "disentangled") else [
      (name, projection) for term, name, projection in (
          ("c2p", "pos_key_proj", "position_key"), ("p2c", "pos_query_proj", "position_query"))
      if term in config.attention.relative_terms]
  for i in range(config.num_layers):
    hf_layer, layer = f"{hf}encoder.layer.{i}", f"encoder_model/encoder/layer_{i}"
    encoder_rules += rules.layer_rules(hf_layer, layer, LAYER)
    for name, projection in own_projections:
      encoder_rules += rules.dense(
          f"{hf_layer}.attention.self.{name}",
          f"{layer}/attention/self_attention/{projection}", rules.HEADS_IN, rules.HEADS_BIAS)
  return encoder_rules


def _check(config: model_config.ModelConfig) -> None:
  if config.embeddings.size != config.hidden_size:
    raise base.ConversionError(
        f"model.embeddings.size={config.embeddings.size} != hidden_size: Hugging Face "
        "DeBERTa projects embeddings before their LayerNorm, without bias; encoderx's "
        "DeBERTa needs model.embeddings.size = hidden_size.")
  if config.layout.sharing != "none":
    raise base.ConversionError(f"model.layout.sharing={config.layout.sharing!r} has no "
                               "Hugging Face DeBERTa equivalent (its layers are distinct).")
  if (config.attention.variant not in ("disentangled", "standard")
      or config.embeddings.position_offset):
    raise base.ConversionError(
        f"model.attention.variant={config.attention.variant!r} / position_offset="
        f"{config.embeddings.position_offset}: Hugging Face DeBERTa has "
        "disentangled (or standard) attention with positions from 0.")


def _export_check(config: model_config.ModelConfig, head: str) -> None:
  if config.heads.enhanced_mask_decoder and head in ("mlm", "mlm_legacy"):
    raise base.ConversionError(
        "model.heads.enhanced_mask_decoder=True: Hugging Face DeBERTa has no enhanced mask "
        "decoder, so its MLM logits would differ; export the encoder (--head=base: "
        "the decoder is the MLM head's alone) or a model trained with "
        "model.heads.enhanced_mask_decoder=False.")


def _hf_fields(config: model_config.ModelConfig) -> dict:
  """DebertaV2Config's fields for an encoderx model (see _model_fields); the pooler of
  the classification class is our pooler (dense + tanh on the first token)."""
  relative = config.attention.variant == "disentangled"
  return dict(relative_attention=relative, pos_att_type=list(config.attention.relative_terms),
              position_buckets=config.attention.position_buckets or -1,
              max_relative_positions=config.attention.max_relative_positions,
              share_att_key=config.attention.share_att_key,
              norm_rel_ebd="layer_norm" if relative else "none",
              position_biased_input=config.embeddings.position == "absolute",
              pooler_hidden_act="tanh",
              legacy=False)  # the MLM head named as DeBERTa's checkpoints name it


def _model_fields(hf_config: Mapping) -> dict:
  """encoderx fields of a DebertaV2Config: disentangled attention when
  relative_attention (BERT's attention otherwise), absolute positions in the input when
  position_biased_input; no enhanced mask decoder (Hugging Face's models have none)."""
  get = hf_config.get
  if get("conv_kernel_size", 0):
    raise base.ConversionError("DeBERTa's convolution layer (conv_kernel_size, DeBERTa-v2 "
                               "xlarge and larger) is not supported.")
  hidden, heads = hf_config["hidden_size"], hf_config["num_attention_heads"]
  if get("embedding_size", hidden) != hidden:
    raise base.ConversionError("DeBERTa with embedding_size != hidden_size is not "
                               "supported.")
  if get("attention_head_size", hidden // heads) != hidden // heads:
    raise base.ConversionError("attention_head_size must be hidden_size / "
                               "num_attention_heads.")
  if get("pooler_hidden_act", "tanh") != "tanh" and get("architectures") and any(
      "SequenceClassification" in name for name in get("architectures")):
    raise base.ConversionError(f"pooler_hidden_act {get('pooler_hidden_act')!r}: "
                               "encoderx's pooler is tanh.")
  terms = get("pos_att_type") or ()
  terms = [t.strip() for t in (terms.lower().split("|") if isinstance(terms, str)
                               else terms)]
  if set(terms) - {"c2p", "p2c"}:
    raise base.ConversionError(f"pos_att_type {terms}: only 'c2p' and 'p2c' are "
                               "supported.")
  fields = {"embeddings.position": "absolute" if get("position_biased_input", True)
            else "none", "attention.variant": "standard",
            "embeddings.type_vocab_size": get("type_vocab_size", 0),
            "norm.eps": get("layer_norm_eps", 1e-7), "heads.enhanced_mask_decoder": False}
  if get("relative_attention", False):
    norm = [n.strip() for n in str(get("norm_rel_ebd", "none")).lower().split("|")]
    if "layer_norm" not in norm:
      raise base.ConversionError("relative attention without norm_rel_ebd='layer_norm' "
                                 "(DeBERTa v1's) is not supported.")
    max_relative = get("max_relative_positions", -1)
    fields.update({
        "attention.variant": "disentangled",
        "attention.relative_terms": tuple(t for t in ("c2p", "p2c") if t in terms),
        "attention.position_buckets": max(get("position_buckets", -1), 0),
        "attention.max_relative_positions": (max_relative if max_relative >= 1
                                             else hf_config["max_position_embeddings"]),
        "attention.share_att_key": bool(get("share_att_key", False))})
  return fields


def _mlm(legacy: bool) -> list[base.Rule]:
  """DeBERTa's own checkpoints' head names (`lm_predictions.lm_head`, Hugging Face's
  legacy=False) or Hugging Face's legacy ones (`cls.predictions`, BERT's): the same
  weights."""
  if legacy:
    return bert.MLM
  return rules.mlm_head("lm_predictions.lm_head.dense", "lm_predictions.lm_head.LayerNorm",
                        "lm_predictions.lm_head.bias")


FAMILY = base.Family(
    name="deberta-v2", config_class="DebertaV2Config", prefix="deberta",
    encoder=encoder, pooler="", tokenizer_class="DebertaV2Tokenizer",
    vocab_kind="sentencepiece", vocab_layout="deberta",
    heads={
        "mlm": base.Head("DebertaV2ForMaskedLM", lambda config: _mlm(False),
                         pooler=False),
        "mlm_legacy": base.Head("DebertaV2ForMaskedLM", lambda config: _mlm(True),
                                pooler=False, tied=bert.TIED, hf_fields=dict(legacy=True)),
        # ContextPooler (dense + pooler_hidden_act on the first token, 'tanh' here) is our
        # pooler; then a linear classifier.
        "sequence_classification": base.Head(
            "DebertaV2ForSequenceClassification", lambda config: rules.dense(
                "pooler.dense", "encoder_model/pooler/dense") + rules.dense(
                    "classifier", "classifier"), pooler=False, labels=True),
        **rules.token_heads("DebertaV2"),
        "base": base.Head("DebertaV2Model", base_prefix=False, pooler=False),
    },
    hf_fields=_hf_fields, model_fields=_model_fields, check=_check,
    export_check=_export_check,
    # Released v3 checkpoints keep the enhanced mask decoder's position table, which
    # their encoder does not read (position_biased_input=False; Hugging Face ignores it).
    unread=lambda config: [] if config.embeddings.position == "absolute" else [
        ("embeddings.position_embeddings.weight",
         "encoder_model/embeddings/position_embeddings/embedding", rules.COPY)])

"""ALBERT (google-research/albert; transformers models/albert/modeling_albert.py):
factorized embeddings and groups of shared layers."""
from __future__ import annotations

from typing import Mapping

from encoderx.hf import base, rules
from encoderx.models import model_config


def encoder(config: model_config.ModelConfig, hf: str) -> list[base.Rule]:
  """ALBERT's layers are groups of shared layers: `layout.sharing='all'` is one group (the
  released models; our `shared_layer`), 'none' is one group per layer (HF
  num_hidden_groups = num_hidden_layers). Embeddings are always mapped to the hidden
  size (`embedding_hidden_mapping_in`, our Embeddings' `projection`)."""
  encoder_rules = rules.embedding_rules(hf) + rules.dense(
      f"{hf}encoder.embedding_hidden_mapping_in", "encoder_model/embeddings/projection")
  groups = ["shared_layer"] if config.layout.sharing == "all" else [
      f"layer_{i}" for i in range(config.num_layers)]
  for group, layer in enumerate(groups):
    encoder_rules += rules.layer_rules(
        f"{hf}encoder.albert_layer_groups.{group}.albert_layers.0",
        f"encoder_model/encoder/{layer}", rules.ALBERT_LAYER)
  return encoder_rules


def _check(config: model_config.ModelConfig) -> None:
  if config.layout.sharing not in ("all", "none"):
    raise base.ConversionError(
        f"model.layout.sharing={config.layout.sharing!r} has no Hugging Face ALBERT "
        "equivalent; ALBERT shares 'all' layers or (one group per layer) none.")
  if config.embeddings.size == config.hidden_size:
    raise base.ConversionError("Hugging Face ALBERT always projects embeddings to the "
                               "hidden size; set model.embeddings.size below "
                               "model.hidden_size.")
  if (config.attention.variant != "standard" or config.embeddings.position != "absolute"
      or config.embeddings.position_offset):
    raise base.ConversionError("Hugging Face ALBERT has standard attention with absolute "
                               "positions from 0.")


def _model_fields(hf_config: Mapping) -> dict:
  groups = hf_config.get("num_hidden_groups", 1)
  if hf_config.get("inner_group_num", 1) != 1 or groups not in (
      1, hf_config["num_hidden_layers"]):
    raise base.ConversionError("ALBERT with inner_group_num != 1 or num_hidden_groups "
                               "other than 1 or num_hidden_layers is not supported.")
  return {"embeddings.size": hf_config["embedding_size"],
          "layout.sharing": "all" if groups == 1 else "none"}


MLM = rules.mlm_head("predictions.dense", "predictions.LayerNorm", "predictions.bias")
TIED = ("predictions.decoder.weight", "predictions.decoder.bias")

FAMILY = base.Family(
    name="albert", config_class="AlbertConfig", prefix="albert", encoder=encoder,
    pooler="pooler", tokenizer_class="AlbertTokenizer",
    vocab_kind="sentencepiece", vocab_layout="albert",
    heads={
        "pretraining": base.Head("AlbertForPreTraining", lambda config: MLM + rules.dense(
            "sop_classifier.classifier", "sentence_head/classifier"), tied=TIED),
        "mlm": base.Head("AlbertForMaskedLM", lambda config: MLM, pooler=False,
                         tied=TIED),
        "sequence_classification": base.Head("AlbertForSequenceClassification",
                                             rules.classifier(), labels=True),
        **rules.token_heads("Albert"),
        "base": base.Head("AlbertModel", base_prefix=False),
    },
    hf_fields=lambda config: dict(
        embedding_size=config.embeddings.size,
        num_hidden_groups=1 if config.layout.sharing == "all" else config.num_layers),
    model_fields=_model_fields, check=_check)

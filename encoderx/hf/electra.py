"""ELECTRA (google-research/electra; transformers models/electra/modeling_electra.py):
BERT's encoder with an optional embedding projection; the discriminator and the
generator are classes of their own."""
from __future__ import annotations

from encoderx.hf import base, rules
from encoderx.models import model_config


def encoder(config: model_config.ModelConfig, hf: str) -> list[base.Rule]:
  """BERT's encoder under `electra.`, and `embeddings_project` (our Embeddings'
  `projection`) when the embedding size differs from the hidden size."""
  encoder_rules = rules.bert_encoder(config, hf)
  if config.embeddings.size != config.hidden_size:
    encoder_rules += rules.dense(f"{hf}embeddings_project",
                                 "encoder_model/embeddings/projection")
  return encoder_rules


def _check(config: model_config.ModelConfig) -> None:
  if config.layout.sharing != "none":
    raise base.ConversionError(f"model.layout.sharing={config.layout.sharing!r} has no "
                               "Hugging Face ELECTRA equivalent (its layers are distinct).")
  if (config.attention.variant != "standard" or config.embeddings.position != "absolute"
      or config.embeddings.position_offset):
    raise base.ConversionError(
        f"model.attention.variant={config.attention.variant!r} / position_embedding="
        f"{config.embeddings.position!r}: Hugging Face ELECTRA has "
        "standard attention with absolute positions from 0.")


FAMILY = base.Family(
    name="electra", config_class="ElectraConfig", prefix="electra", encoder=encoder,
    pooler="", tokenizer_class="ElectraTokenizer", vocab_kind="wordpiece",
    heads={
        # The discriminator (the electra method's transferable parameters: rtd_head).
        "pretraining": base.Head("ElectraForPreTraining", lambda config: rules.dense(
            "discriminator_predictions.dense", "rtd_head/transform") + rules.dense(
                "discriminator_predictions.dense_prediction", "rtd_head/classifier"),
                                 pooler=False),
        # The generator, of its own (smaller) config. Hugging Face's generator head
        # applies GELU whatever hidden_act says (ElectraGeneratorPredictions), as
        # ELECTRA's models use.
        "mlm": base.Head("ElectraForMaskedLM", lambda config: rules.mlm_head(
            "generator_predictions.dense", "generator_predictions.LayerNorm",
            "generator_lm_head.bias"), pooler=False, tied=("generator_lm_head.weight",)),
        # ElectraClassificationHead: dense + GELU on the first token (our pooler with
        # model.heads.pooler_act='gelu'), then a linear classifier.
        "sequence_classification": base.Head(
            "ElectraForSequenceClassification", lambda config: rules.dense(
                "classifier.dense", "encoder_model/pooler/dense") + rules.dense(
                    "classifier.out_proj", "classifier"), pooler=False, labels=True),
        **rules.token_heads("Electra"),
        "base": base.Head("ElectraModel", base_prefix=False, pooler=False),
    },
    hf_fields=lambda config: dict(embedding_size=config.embeddings.size),
    model_fields=lambda hf_config: {
        "embeddings.size": hf_config.get("embedding_size", hf_config["hidden_size"]),
        "heads.pooler_act": "gelu"},
    check=_check, pooler_act="gelu")

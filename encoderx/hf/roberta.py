"""RoBERTa (transformers models/roberta/modeling_roberta.py): BERT's encoder, positions
numbered after the padding id, no pretraining class with a sentence head."""
from __future__ import annotations

from encoderx.hf import base, rules
from encoderx.models import model_config


def _check(config: model_config.ModelConfig) -> None:
  if config.embeddings.position_offset < 1:
    raise base.ConversionError("Hugging Face RoBERTa numbers positions from pad_token_id "
                               "+ 1; model.embeddings.position_offset must be at least 1 "
                               "(RoBERTa's is 2).")
  rules.refuse_unless_plain(config, "RoBERTa", offset=config.embeddings.position_offset)


FAMILY = base.Family(
    name="roberta", config_class="RobertaConfig", prefix="roberta",
    encoder=rules.bert_encoder, pooler="pooler.dense", tokenizer_class="RobertaTokenizer",
    vocab_kind="byte_bpe", vocab_layout="roberta",
    heads={
        "mlm": base.Head("RobertaForMaskedLM", lambda config: rules.mlm_head(
            "lm_head.dense", "lm_head.layer_norm", "lm_head.bias"), pooler=False,
                         tied=("lm_head.decoder.weight", "lm_head.decoder.bias")),
        # Its head is BERT's pooler (dense + tanh on the first token) then a linear
        # classifier: our pooler and classifier (modeling_roberta.py,
        # RobertaClassificationHead).
        "sequence_classification": base.Head(
            "RobertaForSequenceClassification", lambda config: rules.dense(
                "classifier.dense", "encoder_model/pooler/dense") + rules.dense(
                    "classifier.out_proj", "classifier"), pooler=False, labels=True),
        **rules.token_heads("Roberta"),
        "base": base.Head("RobertaModel", base_prefix=False),
    },
    # Positions start after the padding id: pad_token_id is position_offset - 1.
    hf_fields=lambda config: dict(pad_token_id=config.embeddings.position_offset - 1,
                                  bos_token_id=0, eos_token_id=2),
    model_fields=lambda hf_config: {
        "embeddings.position_offset": int(hf_config.get("pad_token_id", 1)) + 1},
    check=_check)

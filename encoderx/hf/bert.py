"""BERT (google-research/bert; transformers models/bert/modeling_bert.py), and SpanBERT,
whose released models are BERTs without the SBO head (`model.family='bert'`)."""
from __future__ import annotations

from encoderx.hf import base, rules

MLM = rules.mlm_head("cls.predictions.transform.dense",
                     "cls.predictions.transform.LayerNorm", "cls.predictions.bias")
TIED = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")

FAMILY = base.Family(
    name="bert", config_class="BertConfig", prefix="bert", encoder=rules.bert_encoder,
    pooler="pooler.dense", tokenizer_class="BertTokenizer", vocab_kind="wordpiece",
    heads={
        "pretraining": base.Head("BertForPreTraining", lambda config: MLM + rules.dense(
            "cls.seq_relationship", "sentence_head/classifier"), tied=TIED),
        "mlm": base.Head("BertForMaskedLM", lambda config: MLM, pooler=False, tied=TIED),
        "sequence_classification": base.Head("BertForSequenceClassification",
                                             rules.classifier(), labels=True),
        **rules.token_heads("Bert"),
        "base": base.Head("BertModel", base_prefix=False),
    },
    check=lambda config: rules.refuse_unless_plain(config, "BERT"))

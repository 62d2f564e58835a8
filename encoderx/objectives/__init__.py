"""Pretraining objectives: one module per objective, built by name from a config."""
from __future__ import annotations

import ml_collections

from encoderx.objectives import base, mlm, plm, sbo, sentence


def mlm_config(mlm_fields, vocabulary, max_predictions: int | None = None) -> mlm.MlmConfig:
  return mlm.MlmConfig(
      mask_id=vocabulary.mask_id, special_ids=tuple(vocabulary.special_ids),
      vocab_size=vocabulary.vocab_size, rate=mlm_fields.rate,
      mask_token_prob=mlm_fields.mask_token_prob,
      random_token_prob=mlm_fields.random_token_prob,
      max_predictions=max_predictions or mlm_fields.max_predictions,
      unit=mlm_fields.unit, max_ngram=mlm_fields.max_ngram,
      span_geometric_p=mlm_fields.span_geometric_p,
      max_span_words=mlm_fields.max_span_words,
      rate_schedule=tuple((int(end), float(rate)) for end, rate in mlm_fields.rate_schedule),
      eval_rate=mlm_fields.eval_rate)


# Objective name -> (config.objective, vocabulary, MLM cap) -> the objective.
BUILDERS = {
    "mlm": lambda objective_config, vocabulary, max_predictions: mlm.MaskedLanguageModel(
        mlm_config(objective_config.mlm, vocabulary, max_predictions)),
    **{name: (lambda objective_config, vocabulary, max_predictions, name=name:
              sentence.SentenceClassification(name=name)) for name in sentence.NAMES},
    "sbo": lambda objective_config, vocabulary, max_predictions: sbo.SpanBoundary(),
}
NAMES = tuple(BUILDERS)


def build(objective_config, vocabulary, max_predictions: int | None = None
          ) -> tuple[base.Objective, ...]:
  """`config.objective` -> objectives, in the order of `names`.

  `max_predictions` overrides the MLM cap (the long-sequence phase of BERT's recipe).
  """
  return tuple(BUILDERS[name](objective_config, vocabulary, max_predictions)
               for name in objective_config.names)


def model_heads(objectives) -> tuple[str, ...]:
  return tuple(dict.fromkeys(objective.head for objective in objectives))


def config_section() -> ml_collections.ConfigDict:
  """config.objective: which objectives a pretraining run sums, their weights, the
  masking (objective.mlm) and XLNet's permutation LM (objective.plm)."""
  return ml_collections.ConfigDict(dict(
      names=("mlm", "nsp"),
      # The loss is the sum over `names` of weight x that objective's mean loss.
      weights=ml_collections.ConfigDict({name: 1.0 for name in NAMES}),
      mlm=mlm.config_section(),
      plm=plm.config_section(),
  ))

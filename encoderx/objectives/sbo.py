"""Span boundary objective (SpanBERT): predict each masked token of a unit from the
encodings of the tokens just outside the unit and the token's offset inside it.

It adds no masking of its own: it scores the MLM objective's predictions (the same
`masked_ids` and weights), reading the unit boundaries that `mlm.mask_tokens` returns,
so its loss adds to the MLM loss as in the paper. The config requires a whole-word
masking unit with it (`objective.mlm.unit`: 'span' for SpanBERT, or 'word' / 'ngram').
"""
from __future__ import annotations

import dataclasses

import jax

from encoderx.objectives import base, mlm


@dataclasses.dataclass(frozen=True)
class SpanBoundary:
  name: str = "sbo"
  head: str = "sbo"

  def prepare(self, batch: dict, key: jax.Array, step=None) -> dict:
    del key, step
    return batch

  def denominator(self, batch: dict) -> jax.Array:
    return mlm.prediction_count(batch)

  def terms(self, outputs: dict, batch: dict) -> dict[str, jax.Array]:
    return base.classification_terms(outputs["sbo_logits"], batch["masked_ids"],
                                     batch["masked_weights"])

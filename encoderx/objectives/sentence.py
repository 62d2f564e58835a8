"""Sentence-level objectives on the pooled [CLS]: next-sentence prediction (BERT) and
sentence-order prediction (ALBERT).

The data builder sets `sentence_label` (NSP: 0 B follows A, 1 B is from another
document; SOP: 0 A and B in order, 1 swapped); this objective only scores the two-way
classifier.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from encoderx.data import segment_pairs
from encoderx.objectives import base

# The sentence objectives: what the sentence-pair builder labels pairs for.
NAMES = segment_pairs.LABEL_MODES


@dataclasses.dataclass(frozen=True)
class SentenceClassification:
  name: str = "nsp"
  head: str = "sentence"

  def prepare(self, batch: dict, key: jax.Array, step=None) -> dict:
    del key, step
    return batch

  def denominator(self, batch: dict) -> jax.Array:
    return jnp.asarray(batch["sentence_label"].shape[0], jnp.float32)

  def terms(self, outputs: dict, batch: dict) -> dict[str, jax.Array]:
    """Over the batch's examples: padding rows of a whole split's evaluation
    (`example_weight` 0.0) count for nothing."""
    labels = batch["sentence_label"]
    weights = batch.get("example_weight", jnp.ones(labels.shape, jnp.float32))
    return base.classification_terms(outputs["sentence_logits"], labels, weights)

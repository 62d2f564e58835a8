"""Sentence-pair regression (STS-B style): a score for each pair, trained by MSE.

The data path and predictions are classification's (encoderx/methods/classify.py:
labelled TSV / CSV / JSONL rows, [CLS] A [SEP] B [SEP], whole-split evaluation); the
label column holds a number, and the head is BertForSequenceClassification's with one
output (num_labels=1: a linear score on the pooled [CLS], mean squared error), as BERT
fine-tunes STS-B. Evaluation reports Pearson's and Spearman's correlation (scipy) of the
scores with the gold ones, and the MSE.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from encoderx.evaluation import scores
from encoderx.methods import base as method_lib
from encoderx.methods import classify, finetune
from encoderx.models import finetuning

METRICS = ("pearson", "spearman", "mse")


# Pearson and Spearman (scipy): encoderx/evaluation/scores.py.
correlations = scores.correlations


class Similarity(classify.Classification):
  """A scalar score over the encoder's pooled [CLS] (sentence pairs), trained by MSE."""
  name = "similarity"
  METRICS = METRICS
  PREDICTION_HEADER = ("prediction",)

  def build_model(self):
    self.labels = ()
    return finetuning.SequenceClassifier(
        self.model_config, num_labels=1, pooling=self.config.finetune.pooling,
        dropout=self.config.finetune.classifier_dropout)

  @property
  def label_list(self):
    return None  # the label column holds scores

  def describe_labels(self, labels: np.ndarray) -> str:
    return f"scores {labels.min():g} to {labels.max():g}, mean {labels.mean():.3f}"

  def _scores(self, params, batch, key=None):
    return self.apply(params, batch, key)[:, 0]

  def loss(self, params, state, batch, key, denominators, update, carry):
    del update, carry
    errors = jnp.square(self._scores(params, batch, key) - batch["label"])
    sums = {"squared_error": errors.sum(), "count": jnp.asarray(errors.shape[0], jnp.float32)}
    return errors.sum() / denominators["examples"], method_lib.LossOutput(sums, state)

  def summarize(self, sums):
    return {"mse": sums["squared_error"] / jnp.maximum(sums["count"], 1.0)}

  def evaluate(self, params, state, batch, key):
    del state, key
    return {"scores": self._scores(params, batch), "labels": batch["label"],
            "weights": batch["example_weight"]}

  def summarize_evaluation(self, outputs: list) -> dict[str, float]:
    rows = finetune.real_rows(outputs)
    metrics = correlations(rows["scores"], rows["labels"])
    metrics["mse"] = float(np.mean(np.square(rows["scores"] - rows["labels"])))
    return metrics

  def describe_head(self) -> dict:
    return {"regression": True, "pooling": self.config.finetune.pooling}

  def export_fields(self) -> dict:
    """One output, a score (transformers' regression problem: MSE)."""
    return {"num_labels": 1, "problem_type": "regression"}

  def predict(self, params, state, batch):
    del state
    return {"score": self._scores(params, batch)}

  def prediction_columns(self, predictions: dict, index: int) -> list[str]:
    return [f"{float(predictions['score'][index]):.7g}"]  # enough digits to rank

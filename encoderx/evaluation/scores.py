"""Scores of a classifier's and a regressor's predictions, from scikit-learn and scipy:
what the classify and similarity methods report, and GLUE's official metrics
(encoderx/evaluation/glue.py)."""
from __future__ import annotations

import numpy as np


def classification_metrics(labels: np.ndarray, predictions: np.ndarray,
                           num_labels: int) -> dict[str, float]:
  """Accuracy, F1 (binary: of label 1; else macro) and Matthews correlation
  (sklearn.metrics accuracy_score, f1_score, matthews_corrcoef)."""
  from sklearn import metrics  # pylint: disable=g-import-not-at-top
  f1 = metrics.f1_score(labels, predictions, average="binary" if num_labels == 2
                        else "macro", zero_division=0)
  return {"accuracy": float(metrics.accuracy_score(labels, predictions)),
          "f1": float(f1), "mcc": float(metrics.matthews_corrcoef(labels, predictions))}


def correlations(predictions: np.ndarray, gold: np.ndarray) -> dict[str, float]:
  """Pearson's and Spearman's correlation of two score lists (scipy.stats pearsonr,
  spearmanr); 0 where either list is constant (undefined there)."""
  from scipy import stats  # pylint: disable=g-import-not-at-top
  if len(gold) < 2 or np.ptp(predictions) == 0 or np.ptp(gold) == 0:
    return {"pearson": 0.0, "spearman": 0.0}
  return {"pearson": float(stats.pearsonr(predictions, gold).statistic),
          "spearman": float(stats.spearmanr(predictions, gold).statistic)}

"""Sequence classification fine-tuning: single sentences or sentence pairs.

Labelled rows of `config.finetune.train_file` / `dev_file` (TSV, CSV or JSONL, columns
named in the config) feed a seqio Task (encoderx/data/classification.py); the model is
the encoder with a classifier on the pooled (or first-token) representation
(encoderx/models/finetuning.py). The loss is the mean cross-entropy; evaluation runs on
the whole dev file and reports accuracy, F1 (of label 1 for two labels, macro
otherwise), Matthews correlation and the loss, from scikit-learn. Start from a
pretrained encoder with `--init_from` (another run, or hf:DIR).
"""
from __future__ import annotations

import collections
import logging

import jax
import jax.numpy as jnp
import numpy as np
import optax

from encoderx import errors
from encoderx import files as files_lib
from encoderx.methods import base as method_lib
from encoderx.data import labelled
from encoderx.evaluation import scores
from encoderx.methods import finetune
from encoderx.models import finetuning

logger = logging.getLogger("encoderx")

POOLINGS = ("pooler", "first_token")
METRICS = ("accuracy", "f1", "mcc", "loss")


def training_labels(finetune) -> tuple[str, ...]:
  """config.finetune.labels, or the distinct labels of the training file, sorted."""
  if finetune.labels:
    return tuple(str(label) for label in finetune.labels)
  rows = labelled.read_rows(finetune.train_file, [finetune.label_column], finetune.format)
  return tuple(sorted({row[finetune.label_column] for _, row in rows}))


# Accuracy, F1 and Matthews correlation (scikit-learn): encoderx/evaluation/scores.py.
classification_metrics = scores.classification_metrics


class Classification(finetune.ReadsLabelledFiles, finetune.FineTuning):
  """A classifier over the encoder, trained by cross-entropy."""
  name = "classify"
  METRICS = METRICS
  export_heads = ("sequence_classification",)

  def build_model(self):
    self.labels = training_labels(self.config.finetune)
    return finetuning.SequenceClassifier(
        self.model_config, num_labels=len(self.labels),
        pooling=self.config.finetune.pooling,
        dropout=self.config.finetune.classifier_dropout)

  @classmethod
  def validate(cls, config) -> None:
    super().validate(config)
    finetune, fail = config.finetune, errors.fail
    errors.check_choice("finetune.format", finetune.format, ("",) + labelled.FORMATS)
    errors.check_choice("finetune.pooling", finetune.pooling, POOLINGS)
    if not finetune.text_column or not finetune.label_column:
      fail("finetune.text_column" if not finetune.text_column else "finetune.label_column",
           "is empty.")

  # --- data ------------------------------------------------------------------------------
  @property
  def label_list(self) -> tuple[str, ...] | None:
    """The labels whose ids the examples carry (None: scores, for regression)."""
    return self.labels

  def _task(self, files: dict, with_labels: bool = True):
    from encoderx.data import classification  # pylint: disable=g-import-not-at-top
    return classification.register_task(
        files, self.config.finetune, self.label_list, self.vocabulary,
        self.config.data.vocab.to_dict(),
        token_types=self.model_config.embeddings.type_vocab_size > 1,
        shuffle_buffer=self.config.data.shuffle_buffer, with_labels=with_labels)

  def task(self):
    finetune = self.config.finetune
    return self._task({"train": finetune.train_file, "validation": finetune.dev_file})

  def check_data(self) -> None:
    from encoderx.data import classification  # pylint: disable=g-import-not-at-top
    finetune = self.config.finetune
    for split, path in (("train", finetune.train_file), ("dev", finetune.dev_file)):
      _, examples = classification.read_examples(path, finetune, self.label_list)
      logger.info("%s: %d examples, %s", split, len(examples["label"]),
                  self.describe_labels(np.asarray(examples["label"])))

  def describe_labels(self, labels: np.ndarray) -> str:
    counts = collections.Counter(labels.tolist())
    return ", ".join(f"{self.labels[i]}: {counts[i]}" for i in range(len(self.labels)))

  # --- the train step --------------------------------------------------------------------
  def loss(self, params, state, batch, key, denominators, update, carry):
    del update, carry
    logits = self.apply(params, batch, key)
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"])
    correct = (jnp.argmax(logits, -1) == batch["label"]).astype(jnp.float32)
    sums = {"loss_sum": losses.sum(), "correct": correct.sum(),
            "count": jnp.asarray(losses.shape[0], jnp.float32)}
    return losses.sum() / denominators["examples"], method_lib.LossOutput(sums, state)

  def summarize(self, sums):
    count = jnp.maximum(sums["count"], 1.0)
    return {"classification_loss": sums["loss_sum"] / count,
            "accuracy": sums["correct"] / count}

  # --- evaluation ------------------------------------------------------------------------
  def evaluate(self, params, state, batch, key):
    del state, key
    logits = self.apply(params, batch)
    return {"predictions": jnp.argmax(logits, -1), "labels": batch["label"],
            "losses": optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]),
            "weights": batch["example_weight"]}

  def summarize_evaluation(self, outputs: list) -> dict[str, float]:
    rows = finetune.real_rows(outputs)
    metrics = classification_metrics(rows["labels"], rows["predictions"], len(self.labels))
    metrics["loss"] = float(rows["losses"].mean())
    return metrics

  def describe_head(self) -> dict:
    return {"labels": list(self.labels), "pooling": self.config.finetune.pooling}

  def export_fields(self) -> dict:
    return finetune.label_fields(self.labels)

  # --- predictions -----------------------------------------------------------------------
  def predict(self, params, state, batch):
    del state
    probabilities = jax.nn.softmax(self.apply(params, batch), axis=-1)
    return {"label": jnp.argmax(probabilities, -1),
            "probability": jnp.max(probabilities, -1)}

  def prediction_batches(self, path: str, batch_size: int):
    from encoderx.data import classification, pipeline  # pylint: disable=g-import-not-at-top
    rows, _ = classification.read_examples(path, self.config.finetune, self.label_list,
                                           with_labels=False)
    task = self._task({"predict": path}, with_labels=False)
    return rows, pipeline.whole_split(task, "predict", self.config.data.seq_length,
                                      batch_size)

  def prediction_columns(self, predictions: dict, index: int) -> list[str]:
    """The predicted label and its probability."""
    return [self.labels[int(predictions["label"][index])],
            f"{float(predictions['probability'][index]):.4f}"]

  PREDICTION_HEADER = ("prediction", "probability")

  def write_predictions(self, rows, predictions, path: str) -> int:
    """A TSV: the input's line, its text column(s), the prediction columns and the
    file's own label when it has one."""
    finetune = self.config.finetune
    texts = [finetune.text_column] + ([finetune.text_pair_column]
                                      if finetune.text_pair_column else [])
    gold = any(row[finetune.label_column] for _, row in rows)
    lines = [["line", *texts, *self.PREDICTION_HEADER] + (["label"] if gold else [])]
    for index, (number, row) in enumerate(rows):
      lines.append([str(number), *(row[t] for t in texts),
                    *self.prediction_columns(predictions, index)]
                   + ([row[finetune.label_column]] if gold else []))
    files_lib.write_atomically(path, "".join(
        "\t".join(field.replace("\t", " ") for field in line) + "\n" for line in lines))
    return len(rows)

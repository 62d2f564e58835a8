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
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax

from encoderx import config as config_lib
from encoderx import files as files_lib
from encoderx import method as method_lib
from encoderx.data import classification, labelled, pipeline, tasks
from encoderx.models import finetuning, pretraining

logger = logging.getLogger("encoderx")

POOLINGS = ("pooler", "first_token")
METRICS = ("accuracy", "f1", "mcc", "loss")


def training_labels(finetune) -> tuple[str, ...]:
  """config.finetune.labels, or the distinct labels of the training file, sorted."""
  if finetune.labels:
    return tuple(str(label) for label in finetune.labels)
  rows = labelled.read_rows(finetune.train_file, [finetune.label_column], finetune.format)
  return tuple(sorted({row[finetune.label_column] for _, row in rows}))


def classification_metrics(labels: np.ndarray, predictions: np.ndarray,
                           num_labels: int) -> dict[str, float]:
  """Accuracy, F1 (binary: of label 1; else macro) and Matthews correlation."""
  from sklearn import metrics  # pylint: disable=g-import-not-at-top
  f1 = metrics.f1_score(labels, predictions, average="binary" if num_labels == 2
                        else "macro", zero_division=0)
  return {"accuracy": float(metrics.accuracy_score(labels, predictions)),
          "f1": float(f1), "mcc": float(metrics.matthews_corrcoef(labels, predictions))}


class Classification(method_lib.Method):
  """A classifier over the encoder, trained by cross-entropy."""
  name = "classify"
  export_heads = ("sequence_classification",)

  def __init__(self, config):
    super().__init__(config)
    self.vocabulary = tasks.build_vocabulary(config.data.vocab)
    self.model_config = method_lib.model_config(config, self.vocabulary)
    self.labels = training_labels(config.finetune)
    self.model = finetuning.SequenceClassifier(
        self.model_config, num_labels=len(self.labels), pooling=config.finetune.pooling,
        dropout=config.finetune.classifier_dropout)

  @classmethod
  def validate(cls, config) -> None:
    finetune, fail = config.finetune, config_lib.fail
    for field in ("train_file", "dev_file"):
      path = finetune[field]
      if not path:
        fail(f"finetune.{field}", "is empty; name a TSV, CSV or JSONL file of labelled "
             "examples.")
      if not os.path.isfile(os.path.expanduser(path)):
        fail(f"finetune.{field}", f"'{path}' is not a file.")
      try:
        labelled.file_format(path, finetune.format)
      except labelled.LabelledDataError as error:
        fail(f"finetune.{field}", str(error))
    config_lib.check_choice("finetune.format", finetune.format, ("",) + labelled.FORMATS)
    config_lib.check_choice("finetune.pooling", finetune.pooling, POOLINGS)
    if not finetune.text_column or not finetune.label_column:
      fail("finetune.text_column" if not finetune.text_column else "finetune.label_column",
           "is empty.")
    if not 0.0 <= finetune.classifier_dropout < 1.0:
      fail("finetune.classifier_dropout",
           f"must be in [0, 1), got {finetune.classifier_dropout}.")
    if config.eval.best_metric:
      config_lib.check_choice("eval.best_metric", config.eval.best_metric, METRICS)

  # --- data ------------------------------------------------------------------------------
  def _task(self, files: dict, with_labels: bool = True):
    return classification.register_task(
        files, self.config.finetune, self.labels, self.vocabulary,
        self.config.data.vocab.to_dict(), token_types=self.model_config.type_vocab_size > 1,
        shuffle_buffer=self.config.data.shuffle_buffer, with_labels=with_labels)

  def task(self):
    finetune = self.config.finetune
    return self._task({"train": finetune.train_file, "validation": finetune.dev_file})

  def check_data(self) -> None:
    finetune = self.config.finetune
    for split, path in (("train", finetune.train_file), ("dev", finetune.dev_file)):
      _, examples = classification.read_examples(path, finetune, self.labels)
      counts = collections.Counter(examples["label"])
      logger.info("%s: %d examples, %s", split, len(examples["label"]), ", ".join(
          f"{self.labels[i]}: {counts[i]}" for i in range(len(self.labels))))

  # --- parameters ------------------------------------------------------------------------
  def init(self, key):
    batch = pretraining.init_batch(1, 8)
    return {"params": self.model.init({"params": key, "dropout": key}, batch)["params"]}

  # --- the train step --------------------------------------------------------------------
  def denominators(self, batch):
    return {"examples": jnp.asarray(batch["label"].shape[0], jnp.float32)}

  def _logits(self, params, batch, key=None):
    return self.model.apply({"params": params}, batch, deterministic=key is None,
                            rngs=None if key is None else {"dropout": key}).astype(jnp.float32)

  def loss(self, params, state, batch, key, denominators, update, carry):
    del update, carry
    logits = self._logits(params, batch, key)
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
    logits = self._logits(params, batch)
    return {"predictions": jnp.argmax(logits, -1), "labels": batch["label"],
            "losses": optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]),
            "weights": batch["example_weight"]}

  def summarize_evaluation(self, outputs: list) -> dict[str, float]:
    joined = {k: np.concatenate([o[k] for o in outputs]) for k in outputs[0]}
    real = joined["weights"] > 0
    metrics = classification_metrics(joined["labels"][real], joined["predictions"][real],
                                     len(self.labels))
    metrics["loss"] = float(joined["losses"][real].mean())
    return metrics

  def describe(self) -> dict:
    return {"model": method_lib.describe_model(self.model_config),
            "labels": list(self.labels), "pooling": self.config.finetune.pooling}

  def export_fields(self) -> dict:
    return {"id2label": dict(enumerate(self.labels)),
            "label2id": {label: i for i, label in enumerate(self.labels)}}

  # --- predictions -----------------------------------------------------------------------
  def predict(self, params, state, batch):
    del state
    probabilities = jax.nn.softmax(self._logits(params, batch), axis=-1)
    return {"label": jnp.argmax(probabilities, -1),
            "probability": jnp.max(probabilities, -1)}

  def prediction_batches(self, path: str, batch_size: int):
    rows, _ = classification.read_examples(path, self.config.finetune, self.labels,
                                           with_labels=False)
    task = self._task({"predict": path}, with_labels=False)
    return rows, pipeline.whole_split(task, "predict", self.config.data.seq_length,
                                      batch_size)

  def write_predictions(self, rows, predictions, path: str) -> None:
    """A TSV: the input's line, its text column(s), the predicted label and its
    probability (and the file's own label, when it has one)."""
    finetune = self.config.finetune
    texts = [finetune.text_column] + ([finetune.text_pair_column]
                                      if finetune.text_pair_column else [])
    gold = any(row[finetune.label_column] for _, row in rows)
    lines = [["line", *texts, "prediction", "probability"] + (["label"] if gold else [])]
    for (number, row), label, probability in zip(rows, predictions["label"],
                                                 predictions["probability"]):
      lines.append([str(number), *(row[t] for t in texts), self.labels[int(label)],
                    f"{float(probability):.4f}"] + ([row[finetune.label_column]] if gold
                                                     else []))
    files_lib.write_atomically(path, "".join(
        "\t".join(field.replace("\t", " ") for field in line) + "\n" for line in lines))

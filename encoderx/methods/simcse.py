"""SimCSE: sentence embeddings trained by contrast (Gao, Yao and Chen, 2021), evaluated by
Spearman's correlation of cosine similarities with STS scores.

Unsupervised (`simcse.kind="unsupervised"`): each sentence of the training file
(every distinct value of its text column, and of its text_pair column when set) goes
through the encoder twice; dropout is the only difference between the two views. The
loss is the cross-entropy of picking a sentence's other view among the batch's second
views by cosine similarity / temperature (0.05): the other sentences of the batch are
the negatives. Supervised (`"supervised"`): rows of (text, text_pair[,
hard_negative_column]) give anchor and positive (and a hard negative, added to the
candidates). This follows princeton-nlp/SimCSE simcse/models.py (cl_forward: one
direction, z1 against z2 then z3); the embedding is the configured pooling
(`finetune.pooling`: "mean" or "first_token") of the encoder's outputs, without
SimCSE's training-time MLP over [CLS]. With train.grad_accum_steps > 1 the negatives
are those of the micro-batch.

The dev file is STS-style (text, text_pair, a score in label_column): evaluation embeds
both sides, scores pairs by cosine similarity and reports Spearman's (and Pearson's)
correlation with the gold scores. `python -m encoderx.embed --init_from=WORKDIR` embeds
with the trained encoder.
"""
from __future__ import annotations

import functools
import logging

import jax
import jax.numpy as jnp
import ml_collections

from encoderx import errors
from encoderx.methods import base as method_lib
from encoderx.data import labelled
from encoderx.methods import finetune, similarity
from encoderx.models import finetuning
from encoderx.objectives import contrastive

logger = logging.getLogger("encoderx")

MODES = ("unsupervised", "supervised")
# Batch features of each view: the anchor's are the model's own names.
VIEWS = {"text": "", "text_pair": "pair_", "hard_negative": "negative_"}


def view(batch: dict, prefix: str) -> dict:
  """The model's input features of one view of the batch."""
  from encoderx.data import example_tasks  # pylint: disable=g-import-not-at-top
  return {name: batch[prefix + name] for name in example_tasks.MODEL_FEATURES}


def config_section() -> ml_collections.ConfigDict:
  """config.simcse: what the contrast is between."""
  return ml_collections.ConfigDict(dict(
      # "unsupervised" (every sentence of the training file's text columns, twice through
      # dropout) or "supervised" (rows of text, text_pair and optionally
      # hard_negative_column).
      kind="unsupervised",
      hard_negative_column="",
      temperature=0.05,  # of the cosine similarities in the contrastive loss
  ))


class ScoresStsPairs:
  """Mixed into the embedding methods (simcse, contrastive): the dev file holds STS pairs
  (finetune.text_column, text_pair_column, a score in label_column), scored by the
  Spearman (and Pearson) correlation of the cosine similarities of their embeddings."""
  METRICS = ("spearman", "pearson")

  def dev_columns(self) -> dict:
    """{'text', 'text_pair', 'label' (the score)} of the dev file."""
    from encoderx.data import classification  # pylint: disable=g-import-not-at-top
    _, examples = classification.read_examples(self.config.finetune.dev_file,
                                               self.config.finetune, labels=None)
    return examples

  def evaluate(self, params, state, batch, key):
    del state, key
    first, second = (contrastive.unit(self.apply(params, view(batch, prefix)))
                     for prefix in ("", "pair_"))
    return {"scores": jnp.sum(first * second, -1), "labels": batch["label"],
            "weights": batch["example_weight"]}

  def summarize_evaluation(self, outputs: list) -> dict[str, float]:
    rows = finetune.real_rows(outputs)
    return similarity.correlations(rows["scores"], rows["labels"])


class SimCSE(ScoresStsPairs, finetune.ReadsLabelledFiles, finetune.FineTuning):
  """Contrastive training of the encoder's pooled output (see the module docstring)."""
  name = "simcse"
  config_sections = ("data", "finetune", "simcse")

  @classmethod
  def config_fields(cls):
    return {**super().config_fields(), "simcse": config_section()}

  def build_model(self):
    return finetuning.SentenceEncoder(self.model_config, pooling=self.config.finetune.pooling)

  @classmethod
  def validate(cls, config) -> None:
    super().validate(config)
    finetune_config, simcse_config, fail = config.finetune, config.simcse, errors.fail
    errors.check_choice("simcse.kind", simcse_config.kind, MODES)
    errors.check_choice("finetune.pooling", finetune_config.pooling,
                            finetuning.SENTENCE_POOLINGS)
    if not finetune_config.text_pair_column:
      fail("finetune.text_pair_column", "is empty; the dev file's pairs (and supervised "
           "training pairs) are text_column and text_pair_column.")
    if simcse_config.hard_negative_column and simcse_config.kind != "supervised":
      fail("simcse.hard_negative_column", "is for simcse.kind='supervised'.")
    if simcse_config.temperature <= 0:
      fail("simcse.temperature", f"must be positive, got {simcse_config.temperature}.")

  # --- data ------------------------------------------------------------------------------
  @property
  def supervised(self) -> bool:
    return self.config.simcse.kind == "supervised"

  def training_columns(self) -> dict:
    """Unsupervised: {'text': every distinct sentence}; supervised: {'text',
    'text_pair'[, 'hard_negative']} per row."""
    finetune_config = self.config.finetune
    names = {"text": finetune_config.text_column, "text_pair": finetune_config.text_pair_column}
    if self.supervised and self.config.simcse.hard_negative_column:
      names["hard_negative"] = self.config.simcse.hard_negative_column
    rows = labelled.read_rows(finetune_config.train_file, list(names.values()),
                              finetune_config.format)
    if self.supervised:
      return {field: [row[column] for _, row in rows] for field, column in names.items()}
    sentences = dict.fromkeys(row[column] for _, row in rows for column in names.values())
    return {"text": list(sentences)}

  def task(self):
    from encoderx.data import example_tasks  # pylint: disable=g-import-not-at-top
    finetune_config = self.config.finetune
    columns = {"train": self.training_columns, "validation": self.dev_columns}
    prefixes = dict(VIEWS) if self.supervised else {"text": ""}
    if not (self.supervised and self.config.simcse.hard_negative_column):
      prefixes.pop("hard_negative", None)
    return example_tasks.register(
        "simcse", [finetune_config.to_dict(), self.config.simcse.to_dict(),
                   self.config.data.vocab.to_dict()], columns,
        self.vocabulary,
        [functools.partial(encode_split, train_prefixes=prefixes)],
        self.config.data.shuffle_buffer)

  def check_data(self) -> None:
    train, dev = self.training_columns(), self.dev_columns()
    logger.info("train: %d %s; dev: %d scored pairs", len(train["text"]),
                "pairs" if self.supervised else "distinct sentences", len(dev["text"]))

  # --- the train step --------------------------------------------------------------------
  def loss(self, params, state, batch, key, denominators, update, carry):
    del update, carry
    keys = jax.random.split(key, 3)
    anchors = self.apply(params, view(batch, ""), keys[0])
    if self.supervised:
      candidates = [self.apply(params, view(batch, "pair_"), keys[1])]
      if "negative_input_ids" in batch:
        candidates.append(self.apply(params, view(batch, "negative_"), keys[2]))
    else:  # the same sentences again, with other dropout masks
      candidates = [self.apply(params, view(batch, ""), keys[1])]
    losses, correct = contrastive.ranking_losses(
        anchors, jnp.concatenate(candidates, axis=0), 1 / self.config.simcse.temperature)
    sums = {"loss_sum": losses.sum(), "correct": correct.sum(),
            "count": jnp.asarray(losses.shape[0], jnp.float32)}
    return losses.sum() / denominators["examples"], method_lib.LossOutput(sums, state)

  def summarize(self, sums):
    count = jnp.maximum(sums["count"], 1.0)
    return {"contrastive_loss": sums["loss_sum"] / count,
            "accuracy": sums["correct"] / count}  # the positive ranked first

  def describe_head(self) -> dict:
    return {"pooling": self.config.finetune.pooling}


def encode_split(dataset, sequence_length, output_features, train_prefixes):
  """Training rows hold the fields of `train_prefixes`; dev rows a scored pair."""
  from encoderx.data import classification  # pylint: disable=g-import-not-at-top
  if "label" in dataset.element_spec:
    train_prefixes = {"text": "", "text_pair": "pair_"}
  return classification.encode_each(dataset, sequence_length, output_features,
                                    train_prefixes)

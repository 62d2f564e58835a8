"""Cross-encoder rerankers: a (query, document) pair through the encoder as one sequence,
[CLS] query [SEP] document [SEP], and one logit from BertForSequenceClassification's head
(num_labels=1: dropout and a linear layer on the pooled [CLS]), as sentence-transformers'
CrossEncoder scores a pair (sentence_transformers/cross_encoder/model.py, CrossEncoder).

Rows of config.finetune.train_file (TSV, CSV or JSONL): the query in
finetune.text_column, the document or positive in finetune.text_pair_column, and by
`rerank.loss` (each mirrors a loss of sentence-transformers 6.2's cross_encoder/losses/,
with its default activation and scale, on the same logits):

  binary      a 0/1 label in finetune.label_column; binary cross-entropy with logits
              (binary_cross_entropy.py, BinaryCrossEntropyLoss), mean over rows.
  listwise    negatives in rerank.negative_columns; the softmax cross-entropy of the
              positive among it and its negatives, on scale * sigmoid(logits)
              (multiple_negatives_ranking.py, MultipleNegativesRankingLoss with the hard
              negatives only, num_negatives=0: defaults sigmoid and scale 10).
  margin_mse  a teacher's scores in rerank.score_columns (the positive's, then each
              negative's); the mean squared error of the margins s_pos - s_neg_i against
              the teacher's t_pos - t_neg_i (margin_mse.py, MarginMSELoss).
  listnet     the same columns; the cross-entropy of softmax(logits) against the teacher's
              softmax(t) over the row's documents, i.e. the KL divergence to the teacher
              plus the teacher's entropy, with the same gradient (list_net.py,
              ListNetLoss).

(sentence-transformers' cross_encoder CrossEntropyLoss is classification over
num_labels > 1 classes, not a ranking of documents: `listwise` mirrors the loss that
ranks a positive among its negatives.) `rerank.activation` overrides the loss's default
activation (applied to the logits before every loss, as each of those losses'
activation_fn is) and `rerank.scale` listwise's scale.

The dev file holds (query, positive, rerank.dev_negative_columns...) rows: each row's
documents are reranked by the model and scored as a query whose one relevant document
is the positive: MRR@10 and nDCG@10 of encoderx/evaluation/retrieval.py.
`python -m encoderx.retrieval --rerank_with=RUN` reranks a first-stage ranking with the
trained model (encoderx/retrieval/reranking.py).
"""
from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from encoderx import errors
from encoderx.data import labelled
from encoderx.evaluation import retrieval as retrieval_scores
from encoderx.methods import base as method_lib
from encoderx.methods import finetune, simcse
from encoderx.models import finetuning

logger = logging.getLogger("encoderx")

LOSSES = ("binary", "listwise", "margin_mse", "listnet")
DISTILLATION = ("margin_mse", "listnet")
# Each loss as sentence-transformers' cross_encoder/losses names it (an export's card).
REFERENCE_LOSSES = {"binary": "BinaryCrossEntropyLoss",
                    "listwise": "MultipleNegativesRankingLoss", "margin_mse": "MarginMSELoss",
                    "listnet": "ListNetLoss"}
ACTIVATIONS = ("identity", "sigmoid")
# sentence-transformers' defaults: each loss' activation_fn, MNRL's scale.
DEFAULT_ACTIVATION = {"binary": "identity", "listwise": "sigmoid", "margin_mse": "identity",
                      "listnet": "identity"}
DEFAULT_LISTWISE_SCALE = 10.0
METRICS = (f"mrr@{retrieval_scores.MRR_AT}", f"ndcg@{retrieval_scores.NDCG_AT}")


def config_section() -> ml_collections.ConfigDict:
  """config.rerank: the loss and the columns it reads."""
  return ml_collections.ConfigDict(dict(
      loss="binary",  # binary, listwise, margin_mse or listnet (see the module docstring)
      # The training rows' negatives (listwise, margin_mse, listnet), one column each.
      negative_columns=("negative",),
      # The teacher's scores (margin_mse, listnet): the positive's column, then one for
      # each negative column, in order.
      score_columns=(),
      # The dev rows' negatives: each dev row's positive is ranked among them.
      dev_negative_columns=("negative",),
      activation="",  # "identity" or "sigmoid"; "": the loss's (DEFAULT_ACTIVATION)
      scale=0.0,      # listwise: the logits' factor; 0: sentence-transformers' 10
  ))


def doc_prefix(index: int) -> str:
  """The batch features' prefix of a row's index-th document (0: the model's names)."""
  return f"doc{index}_" if index else ""


# --- the losses, per row, on logits [rows, documents] after the activation ---------------
def activated(logits: jax.Array, activation: str) -> jax.Array:
  return jax.nn.sigmoid(logits) if activation == "sigmoid" else logits


def binary_losses(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """[rows]: BCE with logits of each row's one document against its 0/1 label."""
  return optax.sigmoid_binary_cross_entropy(logits[:, 0], labels)


def listwise_losses(logits: jax.Array, scale: float) -> jax.Array:
  """[rows]: the cross-entropy of document 0 (the positive) among the row's documents."""
  return optax.softmax_cross_entropy_with_integer_labels(
      logits * scale, jnp.zeros(logits.shape[0], jnp.int32))


def margin_mse_losses(logits: jax.Array, teacher: jax.Array) -> jax.Array:
  """[rows]: the mean over the row's negatives of the squared error of the margins."""
  margins = logits[:, :1] - logits[:, 1:]
  return jnp.mean(jnp.square(margins - (teacher[:, :1] - teacher[:, 1:])), axis=-1)


def listnet_losses(logits: jax.Array, teacher: jax.Array) -> jax.Array:
  """[rows]: the cross-entropy of the logits' softmax against the teacher's softmax."""
  return optax.softmax_cross_entropy(logits, jax.nn.softmax(teacher, axis=-1))


def row_losses(config, logits: jax.Array, batch: dict) -> jax.Array:
  """[rows]: config.rerank.loss of the logits [rows, documents] (see row_losses' users)."""
  rerank = config.rerank
  logits = activated(logits, activation(rerank))
  if rerank.loss == "binary":
    return binary_losses(logits, batch["label"])
  if rerank.loss == "listwise":
    return listwise_losses(logits, rerank.scale or DEFAULT_LISTWISE_SCALE)
  if rerank.loss == "margin_mse":
    return margin_mse_losses(logits, batch["teacher"])
  return listnet_losses(logits, batch["teacher"])


def activation(rerank) -> str:
  """The activation the loss applies to the logits (what a reranker's score is)."""
  return rerank.activation or DEFAULT_ACTIVATION[rerank.loss]


def ranking_scores(scores: np.ndarray) -> dict[str, float]:
  """MRR@10 and nDCG@10 of rows of scores [rows, documents] whose document 0 is the one
  relevant document."""
  qrels = {str(row): {"0": 1} for row in range(scores.shape[0])}
  run = {str(row): {str(doc): float(score) for doc, score in enumerate(row_scores)}
         for row, row_scores in enumerate(scores)}
  measured = retrieval_scores.scores(qrels, run)
  return {name: measured[name] for name in METRICS}


class Reranking(finetune.ReadsLabelledFiles, finetune.FineTuning):
  """A one-logit cross-encoder over (query, document) pairs (see the module docstring)."""
  name = "rerank"
  METRICS = METRICS
  config_sections = ("data", "finetune", "rerank")
  cuts_to_buckets = False  # a row's documents are features of their own (doc1_ ...)
  export_heads = ("sequence_classification",)

  @classmethod
  def config_fields(cls):
    return {**super().config_fields(), "rerank": config_section()}

  def build_model(self):
    return finetuning.SequenceClassifier(
        self.model_config, num_labels=1, pooling=self.config.finetune.pooling,
        dropout=self.config.finetune.classifier_dropout)

  @classmethod
  def validate(cls, config) -> None:
    super().validate(config)
    rerank, fail = config.rerank, errors.fail
    errors.check_choice("rerank.loss", rerank.loss, LOSSES)
    errors.check_choice("rerank.activation", rerank.activation, ("",) + ACTIVATIONS)
    errors.check_choice("finetune.pooling", config.finetune.pooling,
                        ("pooler", "first_token"))
    if not config.finetune.text_column or not config.finetune.text_pair_column:
      fail("finetune.text_pair_column" if config.finetune.text_column
           else "finetune.text_column", "is empty; a row is (query, document).")
    if rerank.loss != "binary" and not rerank.negative_columns:
      fail("rerank.negative_columns", f"is empty; loss '{rerank.loss}' ranks a positive "
           "among negatives: name their columns.")
    if not rerank.dev_negative_columns:
      fail("rerank.dev_negative_columns", "is empty; the dev rows' positive is ranked "
           "among their negatives: name their columns.")
    expected = 1 + len(rerank.negative_columns)
    if rerank.loss in DISTILLATION and len(rerank.score_columns) != expected:
      fail("rerank.score_columns", f"loss '{rerank.loss}' needs the teacher's score of the "
           f"positive and of each of the {expected - 1} negatives: {expected} columns, got "
           f"{len(rerank.score_columns)}.")
    if rerank.loss not in DISTILLATION and rerank.score_columns:
      fail("rerank.score_columns", f"are read by margin_mse and listnet, not by loss "
           f"'{rerank.loss}'; leave them empty.")
    if rerank.scale < 0 or (rerank.scale and rerank.loss != "listwise"):
      fail("rerank.scale", f"is listwise's factor of the logits (> 0, or 0 for 10), got "
           f"{rerank.scale} with loss '{rerank.loss}'.")
    if config.finetune.length_buckets:
      fail("finetune.length_buckets", "rerank batches are not cut to buckets; set ().")

  # --- data ------------------------------------------------------------------------------
  def read_columns(self, path: str, negative_columns, with_labels: bool) -> dict:
    """{'text': queries, 'doc0', 'doc1'...: documents, and the targets the loss reads:
    'label' (binary) or 'teacher' (float32 [rows, documents])} of a file; a row with an
    empty text, a label that is not 0 or 1, or a teacher's score that is not a number is
    a LabelledDataError naming its line."""
    finetune_config, rerank = self.config.finetune, self.config.rerank
    texts = [finetune_config.text_column, finetune_config.text_pair_column,
             *negative_columns]
    targets = []
    if with_labels and rerank.loss == "binary":
      targets = [finetune_config.label_column]
    elif with_labels:
      targets = list(rerank.score_columns)
    rows = labelled.read_rows(path, texts + targets, finetune_config.format)
    for number, row in rows:
      empty = [column for column in texts if not row[column].strip()]
      if empty:
        raise labelled.LabelledDataError(
            f"'{path}' line {number}: column {empty[0]!r} is empty; every row needs a "
            f"query, a document and each negative column ({', '.join(texts)}).")
    columns = {"text": [row[texts[0]] for _, row in rows]}
    for index, column in enumerate(texts[1:]):
      columns[f"doc{index}"] = [row[column] for _, row in rows]
    if targets == [finetune_config.label_column]:
      labels = labelled.label_scores(rows, targets[0], path)
      for (number, row), label in zip(rows, labels):
        if label not in (0.0, 1.0):
          raise labelled.LabelledDataError(
              f"'{path}' line {number}: {targets[0]} {row[targets[0]]!r} is not 0 or 1 "
              "(binary: 1 relevant, 0 not).")
      columns["label"] = np.asarray(labels, np.float32)
    elif targets:
      columns["teacher"] = np.stack([labelled.label_scores(rows, column, path)
                                     for column in targets], axis=1).astype(np.float32)
    return columns

  def training_columns(self) -> dict:
    rerank = self.config.rerank
    negatives = () if rerank.loss == "binary" else rerank.negative_columns
    return self.read_columns(self.config.finetune.train_file, negatives, with_labels=True)

  def dev_columns(self) -> dict:
    return self.read_columns(self.config.finetune.dev_file,
                             self.config.rerank.dev_negative_columns, with_labels=False)

  def task(self):
    from encoderx.data import example_tasks  # pylint: disable=g-import-not-at-top
    token_types = self.model_config.embeddings.type_vocab_size > 1
    return example_tasks.register(
        "rerank", [self.config.finetune.to_dict(), self.config.rerank.to_dict(),
                   self.config.data.vocab.to_dict(), token_types],
        {"train": self.training_columns, "validation": self.dev_columns},
        self.vocabulary, [lambda dataset, sequence_length, output_features: encode_pairs(
            dataset, sequence_length, output_features, token_types)],
        self.config.data.shuffle_buffer)

  def check_data(self) -> None:
    train, dev = self.training_columns(), self.dev_columns()
    def documents(columns):
      return sum(1 for name in columns if name.startswith("doc"))
    logger.info("train: %d rows of %d documents; dev: %d queries, each ranking %d "
                "documents", len(train["text"]), documents(train), len(dev["text"]),
                documents(dev))

  # --- the train step --------------------------------------------------------------------
  def logits(self, params, batch: dict, key: jax.Array | None = None) -> jax.Array:
    """[rows, documents]: the logit of each row's (query, document) pairs, all through
    the model as one batch."""
    documents = sum(1 for name in batch if name.endswith("input_ids"))
    keys = [None] * documents if key is None else list(jax.random.split(key, documents))
    # One forward pass per document column, so that each has its own dropout mask, as
    # sentence-transformers runs each column through the model.
    return jnp.stack([self.apply(params, simcse.view(batch, doc_prefix(i)), keys[i])[:, 0]
                      for i in range(documents)], axis=1)

  def loss(self, params, state, batch, key, denominators, update, carry):
    del update, carry
    logits = self.logits(params, batch, key)
    losses = row_losses(self.config, logits, batch)
    sums = {"loss_sum": losses.sum(), "count": jnp.asarray(losses.shape[0], jnp.float32)}
    if logits.shape[1] > 1:  # the positive ranked first
      sums["correct"] = (jnp.argmax(logits, -1) == 0).astype(jnp.float32).sum()
    return losses.sum() / denominators["examples"], method_lib.LossOutput(sums, state)

  def summarize(self, sums):
    count = jnp.maximum(sums["count"], 1.0)
    summary = {"rerank_loss": sums["loss_sum"] / count}
    if "correct" in sums:
      summary["accuracy"] = sums["correct"] / count
    return summary

  # --- evaluation ------------------------------------------------------------------------
  def evaluate(self, params, state, batch, key):
    del state, key
    return {"scores": self.logits(params, batch), "weights": batch["example_weight"]}

  def summarize_evaluation(self, outputs: list) -> dict[str, float]:
    return ranking_scores(finetune.real_rows(outputs)["scores"])

  def reference_loss(self) -> str:
    return f"cross_encoder.losses.{REFERENCE_LOSSES[self.config.rerank.loss]}"

  def describe_head(self) -> dict:
    """What encoderx.export writes as a CrossEncoder: one label, and the activation of
    its scores (sigmoid when the loss trained sigmoid(logit), identity otherwise)."""
    return {"kind": "cross-encoder", "num_labels": 1,
            "activation": "sigmoid" if self.config.rerank.loss == "binary"
                          else activation(self.config.rerank),
            "pooling": self.config.finetune.pooling}


def encode_pairs(dataset, sequence_length, output_features, token_types: bool):
  """{'text', 'doc0', 'doc1', ...} -> the model's features of each (text, doc_i) pair,
  prefixed by doc_prefix(i); other fields (label, teacher) are kept."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from encoderx.data import classification  # pylint: disable=g-import-not-at-top
  vocabulary = output_features["input_ids"].vocabulary
  seq_length = sequence_length["input_ids"]
  documents = sorted((name for name in dataset.element_spec if name.startswith("doc")),
                     key=lambda name: int(name[3:]))

  def encode(example):
    query = classification.text_tokens(vocabulary, example["text"])
    encoded = {k: v for k, v in example.items() if k != "text" and k not in documents}
    for index, name in enumerate(documents):
      features = classification.pair_features(
          vocabulary, seq_length, query,
          classification.text_tokens(vocabulary, example[name]), token_types)
      encoded.update({doc_prefix(index) + k: v for k, v in features.items()})
    return encoded

  return dataset.map(encode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)

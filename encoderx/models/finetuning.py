"""Fine-tuning models: the shared encoder (EncoderModel) with a task head.

    SequenceClassifier  sentence representation -> [batch, labels] (a score for 1 label)
    TokenClassifier     every token -> [batch, length, labels] (tagging)
    SpanExtractor       every token -> start and end logits [batch, length] (extractive QA)
    SentenceEncoder     pooled tokens -> [batch, hidden] (embeddings, SimCSE)

Head names follow Hugging Face's classes (`classifier`, `qa_outputs`), whose heads they
are: BertForSequenceClassification, BertForTokenClassification,
BertForQuestionAnswering.
"""
from __future__ import annotations

import flax.linen as nn
import jax

from encoderx.models import model_config
from encoderx.models import common, heads, pretraining
from encoderx.models import dropout as dropout_lib

SENTENCE_POOLINGS = ("first_token", "mean", "last_token")


def sentence_representation(outputs: dict, pooling: str) -> jax.Array:
  """[batch, hidden]: the pooler's output ('pooler', BERT's tanh dense on the first
  token) or the encoder's output at the first token ('first_token')."""
  return outputs["pooled"] if pooling == "pooler" else outputs["hidden"][:, 0]


pool = heads.pool


class SequenceClassifier(nn.Module):
  """Encoder -> sentence representation -> dropout -> linear: [batch, num_labels]."""
  config: model_config.ModelConfig
  num_labels: int
  pooling: str = "pooler"
  dropout: float = 0.1

  def setup(self):
    self.encoder_model = pretraining.EncoderModel(self.config,
                                                  with_pooler=self.pooling == "pooler")
    self.dropout_layer = dropout_lib.Dropout(self.dropout)
    self.classifier = common.dense(self.config, self.num_labels, ("embed", None),
                                   "classifier", role="final")

  def __call__(self, batch: dict, deterministic: bool = True) -> jax.Array:
    x = sentence_representation(self.encoder_model(batch, deterministic), self.pooling)
    return self.classifier(self.dropout_layer(x, deterministic=deterministic))


def token_representations(encoder_model: pretraining.EncoderModel, batch: dict,
                          deterministic: bool) -> jax.Array:
  """[batch, length, hidden]: the encoder's outputs, each through the pooler's transform
  with model.heads.token_transform (ModernBERT's task heads: ModernBertPredictionHead on
  every token)."""
  hidden = encoder_model(batch, deterministic)["hidden"]
  if encoder_model.config.heads.token_transform:
    hidden = encoder_model.pooler.transform(hidden)
  return hidden


class TokenClassifier(nn.Module):
  """Encoder (-> the pooler's transform, model.heads.token_transform) -> dropout ->
  linear on every token: [batch, length, num_labels]."""
  config: model_config.ModelConfig
  num_labels: int
  dropout: float = 0.1

  def setup(self):
    self.encoder_model = pretraining.EncoderModel(
        self.config, with_pooler=self.config.heads.token_transform)
    self.dropout_layer = dropout_lib.Dropout(self.dropout)
    self.classifier = common.dense(self.config, self.num_labels, ("embed", None),
                                   "classifier", role="final")

  def __call__(self, batch: dict, deterministic: bool = True) -> jax.Array:
    hidden = token_representations(self.encoder_model, batch, deterministic)
    return self.classifier(self.dropout_layer(hidden, deterministic=deterministic))


class SpanExtractor(nn.Module):
  """Encoder (-> the pooler's transform, model.heads.token_transform) -> linear to two
  scores per token: (start, end) logits, each [batch, length] (BertForQuestionAnswering's
  qa_outputs, no dropout)."""
  config: model_config.ModelConfig

  def setup(self):
    self.encoder_model = pretraining.EncoderModel(
        self.config, with_pooler=self.config.heads.token_transform)
    self.qa_outputs = common.dense(self.config, 2, ("embed", None), "qa_outputs",
                                   role="final")

  def __call__(self, batch: dict, deterministic: bool = True) -> tuple[jax.Array, jax.Array]:
    logits = self.qa_outputs(token_representations(self.encoder_model, batch,
                                                   deterministic))
    return logits[..., 0], logits[..., 1]


class SentenceEncoder(nn.Module):
  """Encoder -> pooled tokens (see `pool`): [batch, hidden]; of packed rows (a batch with
  `token_text`, `text_start`, `text_end`: encoderx/data/packed_texts.py), each text's
  (heads.pool_packed): [texts, hidden]."""
  config: model_config.ModelConfig
  pooling: str = "mean"

  def setup(self):
    self.encoder_model = pretraining.EncoderModel(self.config, with_pooler=False)

  def __call__(self, batch: dict, deterministic: bool = True) -> jax.Array:
    hidden = self.encoder_model(batch, deterministic)["hidden"]
    if "token_text" in batch:
      return heads.pool_packed(hidden, batch["token_text"], batch["text_start"],
                               batch["text_end"], self.pooling)
    return pool(hidden, batch["segment_ids"], self.pooling)

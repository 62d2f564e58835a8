"""Fine-tuning models: the shared encoder (EncoderModel) with a task head."""
from __future__ import annotations

import flax.linen as nn
import jax

from encoderx.models import common, pretraining


def sentence_representation(outputs: dict, pooling: str) -> jax.Array:
  """[batch, hidden]: the pooler's output ('pooler', BERT's tanh dense on the first
  token) or the encoder's output at the first token ('first_token')."""
  return outputs["pooled"] if pooling == "pooler" else outputs["hidden"][:, 0]


class SequenceClassifier(nn.Module):
  """Encoder -> sentence representation -> dropout -> linear: [batch, num_labels]."""
  config: common.ModelConfig
  num_labels: int
  pooling: str = "pooler"
  dropout: float = 0.1

  def setup(self):
    self.encoder_model = pretraining.EncoderModel(self.config,
                                                  with_pooler=self.pooling == "pooler")
    self.dropout_layer = nn.Dropout(self.dropout)
    self.classifier = common.dense(self.config, self.num_labels, ("embed", None),
                                   "classifier")

  def __call__(self, batch: dict, deterministic: bool = True) -> jax.Array:
    x = sentence_representation(self.encoder_model(batch, deterministic), self.pooling)
    return self.classifier(self.dropout_layer(x, deterministic=deterministic))

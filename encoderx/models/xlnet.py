"""XLNet's pretraining model: the encoder with two-stream relative attention and a
memory of previous segments, and the permutation language modelling head.

Yang et al. 2019, as zihangdai/xlnet's modeling.py `transformer_xl` and `lm_loss`
compute it, and transformers' `XLNetLMHeadModel` (parity-tested on converted weights,
tests/test_xlnet.py). The content stream h starts from dropout(token embeddings) (no
position embedding, no LayerNorm: `embedding_layer_norm=False`), the query stream g
from dropout(a learned vector) at every predicted position; the layers carry both
(encoderx/models/two_stream_attention.py), and the last layer's query stream, dropped
out, is scored against the token embeddings plus a bias.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from encoderx.models import model_config
from encoderx.models import attention, common, pretraining, two_stream_attention
from encoderx.models import dropout as dropout_lib
from encoderx.models import embeddings as embeddings_lib


class PlmHead(nn.Module):
  """The query stream's start vector (XLNet's `mask_emb`) and the output layer tied to
  the token embeddings, with its own bias."""
  config: model_config.ModelConfig

  def setup(self):
    config = self.config
    self.mask_emb = self.param("mask_emb", common.initializer(config, ("embed",)),
                               (config.hidden_size,), config.weights_dtype)
    self.output_bias = embeddings_lib.output_bias(self, config)

  def query_start(self, shape: tuple[int, int]) -> jax.Array:
    """[batch, predictions] -> [batch, predictions, hidden]: the learned vector."""
    start = jnp.broadcast_to(self.mask_emb.astype(self.config.compute_dtype),
                             (*shape, self.config.hidden_size))
    return common.constrain_hidden(start)

  def __call__(self, hidden: jax.Array, embeddings) -> jax.Array:
    """[batch, predictions, hidden] -> [batch, predictions, padded_vocab]."""
    return embeddings.attend(hidden, self.output_bias)


class PermutationLanguageModel(nn.Module):
  """Embeddings + encoder (EncoderModel, so fine-tuning reads the same parameters) +
  PlmHead.

  `batch`: int32 [batch, length] input_ids, token_type_ids (XLNet's segments: 0, 1,
  and 2 for [CLS]), segment_ids, positions, plus `perm_visible` [batch, length, length]
  bool, `target_positions` [batch, predictions], `target_weights` [batch, predictions]
  (see two_stream_attention.TwoStreamInputs) and, for bidirectional data, `reversed`
  [batch]. `memory`: None, or {'hidden': [batch, layers, memory, hidden] what entered
  each layer in previous segments, 'valid': [batch, memory] bool}.
  Returns {'logits': [batch, predictions, vocab], 'layer_inputs': [layers, batch,
  length, hidden] (the content stream entering each layer: what a memory keeps)}.
  """
  config: model_config.ModelConfig

  def setup(self):
    self.encoder_model = pretraining.EncoderModel(self.config, with_pooler=False)
    self.plm_head = PlmHead(self.config)
    self.dropout = dropout_lib.Dropout(self.config.hidden_dropout)

  def __call__(self, batch: dict, memory: dict | None = None,
               deterministic: bool = True) -> dict:
    embeddings = self.encoder_model.embeddings
    content = embeddings(batch["input_ids"], batch["token_type_ids"], batch["positions"],
                         deterministic)
    targets = batch["target_positions"]
    query = self.dropout(self.plm_head.query_start(targets.shape),
                         deterministic=deterministic)
    inputs = two_stream_attention.TwoStreamInputs(
        visible=batch["perm_visible"], target_positions=targets,
        target_weights=batch["target_weights"],
        memory_valid=None if memory is None else memory["valid"],
        reversed=batch.get("reversed"))
    context = attention.layer_context(batch).replace(
        variant_inputs=inputs,
        per_layer=None if memory is None else jnp.moveaxis(memory["hidden"], 1, 0))
    streams, layer_inputs = self.encoder_model.encoder(
        {two_stream_attention.CONTENT: content, two_stream_attention.QUERY: query},
        context, deterministic, collect_layer_inputs=True)
    output = self.dropout(streams[two_stream_attention.QUERY], deterministic=deterministic)
    return {"logits": self.plm_head(output, embeddings),
            "layer_inputs": layer_inputs[two_stream_attention.CONTENT]}


def init_batch(batch_size: int, seq_length: int, predictions: int) -> dict:
  """A batch of the shapes the model takes (for init and tracing)."""
  batch = pretraining.init_batch(batch_size, seq_length)
  batch["perm_visible"] = jnp.zeros([batch_size, seq_length, seq_length], bool)
  batch["target_positions"] = jnp.zeros([batch_size, predictions], jnp.int32)
  batch["target_weights"] = jnp.zeros([batch_size, predictions], jnp.float32)
  return batch

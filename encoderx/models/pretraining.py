"""The encoder and the pretraining model built from a config.

Inputs are a batch dict of int32 [batch, length] arrays:
  input_ids       token ids
  token_type_ids  segment A (0) / B (1)
  segment_ids     which packed sequence a token belongs to (1, 2, ...), 0 for padding;
                  tokens attend only within their own sequence
  positions       position of each token within its own sequence
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from encoderx.models import model_config
from encoderx.models import attention, common, embeddings, encoder, heads

# DeBERTa's enhanced mask decoder applies the last layer twice (microsoft/DeBERTa
# apps/models/masked_language_model.py: EnhancedMaskDecoder.emd_context_layer).
MASK_DECODER_STEPS = 2


class EncoderModel(nn.Module):
  """Embeddings + encoder stack (+ pooler): the part every task and family shares.

  Outputs `hidden` [batch, length, hidden], `pooled` [batch, hidden] with the pooler,
  with `with_mask_decoder` (DeBERTa's MLM) `mask_decoder` [batch, predictions,
  hidden]: what the enhanced mask decoder gives the MLM head at
  `batch['masked_positions']` (every position when absent), and with
  `with_layer_inputs` `layer_inputs` [layers, batch, length, hidden]: what entered each
  layer (the embeddings' output first; Hugging Face's hidden_states but the last).
  """
  config: model_config.ModelConfig
  with_pooler: bool = True
  with_mask_decoder: bool = False
  with_layer_inputs: bool = False

  def setup(self):
    self.embeddings = embeddings.Embeddings(self.config)
    self.encoder = encoder.Encoder(self.config)
    if self.with_pooler:
      self.pooler = heads.Pooler(self.config)

  def __call__(self, batch: dict, deterministic: bool = True) -> dict:
    x = self.embeddings(batch["input_ids"], batch["token_type_ids"], batch["positions"],
                        deterministic)
    context = self.encoder.with_relative(attention.layer_context(batch, self.config),
                                         deterministic)
    if self.with_mask_decoder or self.with_layer_inputs:
      hidden, layer_inputs = self.encoder(x, context, deterministic,
                                          collect_layer_inputs=True)
      last_input = layer_inputs[-1]
    else:
      hidden = self.encoder(x, context, deterministic)
    outputs = {"hidden": hidden}
    if self.with_layer_inputs:
      outputs["layer_inputs"] = layer_inputs
    if self.with_mask_decoder:
      outputs["mask_decoder"] = self.enhanced_mask_decoder(
          last_input, batch["positions"], context, deterministic,
          batch.get("masked_positions"))
    if self.with_pooler:
      outputs["pooled"] = self.pooler(hidden, batch["segment_ids"])
    return outputs

  def enhanced_mask_decoder(self, last_input: jax.Array, positions: jax.Array,
                            context: attention.LayerContext, deterministic: bool,
                            rows: jax.Array | None = None) -> jax.Array:
    """DeBERTa's EMD: absolute positions enter here only. Queries start as the last
    layer's input + the absolute position embeddings; the last layer (its parameters)
    is applied MASK_DECODER_STEPS times, each time to the previous step's output as
    queries, with keys and values the last layer's input.

    As microsoft/DeBERTa's EnhancedMaskDecoder.emd_context_layer (z_states +
    encoder_layers[-2], then encoder.layer[-1] twice with query_states), which then
    keeps the masked positions. A query's output depends on its own row alone, so only
    the `rows` [batch, predictions] are computed (every position when None):
    [batch, predictions, hidden].
    """
    query = last_input + self.embeddings.absolute_positions(positions)
    if rows is not None:
      query, context = heads.gather_positions(query, rows), context.at_queries(rows)
    for _ in range(MASK_DECODER_STEPS):
      query = self.encoder.last_layer(last_input, query, context, deterministic)
    return common.constrain_hidden(query)


class PretrainingModel(nn.Module):
  """The encoder with the heads its objectives need.

  `heads`: names among 'mlm', 'sentence' (NSP/SOP), 'sbo' (span boundary) and 'rtd'
  (replaced-token detection). `__call__` returns the encoder outputs plus `mlm_logits`
  [batch, predictions, vocab] at `batch['masked_positions']` (every position when
  absent; from the enhanced mask decoder's output with model.heads.enhanced_mask_decoder),
  `sentence_logits` [batch, 2], `sbo_logits` [batch, predictions, vocab] from
  `batch['masked_unit_left']`, `['masked_unit_right']` and `['masked_unit_offset']` (only
  when the batch has them) and `rtd_logits` [batch, length].
  """
  config: model_config.ModelConfig
  heads: tuple[str, ...] = ("mlm", "sentence")

  def setup(self):
    self.encoder_model = EncoderModel(
        self.config, with_pooler="sentence" in self.heads,
        with_mask_decoder="mlm" in self.heads and self.config.heads.enhanced_mask_decoder)
    if "mlm" in self.heads:
      self.mlm_head = heads.MlmHead(self.config)
    if "sentence" in self.heads:
      self.sentence_head = heads.SentenceHead(self.config)
    if "sbo" in self.heads:
      self.sbo_head = heads.SboHead(self.config)
    if "rtd" in self.heads:
      self.rtd_head = heads.RtdHead(self.config)

  def __call__(self, batch: dict, deterministic: bool = True) -> dict:
    outputs = self.encoder_model(batch, deterministic)
    if "mlm" in self.heads:
      if "mask_decoder" in outputs:  # at the masked positions already
        hidden = outputs["mask_decoder"]
      elif "masked_positions" in batch:
        hidden = heads.gather_positions(outputs["hidden"], batch["masked_positions"])
      else:
        hidden = outputs["hidden"]
      outputs["mlm_logits"] = self.mlm_head(hidden, self.encoder_model.embeddings)
    if "sentence" in self.heads:
      outputs["sentence_logits"] = self.sentence_head(outputs["pooled"])
    if "sbo" in self.heads and "masked_unit_left" in batch:
      outputs["sbo_logits"] = self.sbo_head(
          outputs["hidden"], batch["masked_unit_left"], batch["masked_unit_right"],
          batch["masked_unit_offset"], self.encoder_model.embeddings)
    if "rtd" in self.heads:
      outputs["rtd_logits"] = self.rtd_head(outputs["hidden"])
    return outputs


def init_batch(batch_size: int, seq_length: int, max_predictions: int = 0) -> dict:
  """A batch of zeros with the shapes (and dtypes) the model takes; for init and tracing."""
  batch = {name: jnp.zeros([batch_size, seq_length], jnp.int32)
           for name in ("input_ids", "token_type_ids", "segment_ids", "positions")}
  if max_predictions:
    for name in ("masked_positions", "masked_unit_left", "masked_unit_right",
                 "masked_unit_offset"):
      batch[name] = jnp.zeros([batch_size, max_predictions], jnp.int32)
  return batch


def count_params(params) -> int:
  return sum(x.size for x in jax.tree_util.tree_leaves(params))

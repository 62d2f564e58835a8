"""Model FLOPs of a training step, from the model config: what MFU is measured against.

Per token of a [batch, L] row, a training step (forward + backward, the backward costing
twice the forward) of a transformer encoder does, for each of its `layers` layers
(counted per layer *applied*: ALBERT's shared layers cost as much as separate ones):

    6 * (2 * H^2 + 2 * H * K + M * H * F)
                                   the q, k, v, output and feed-forward matmuls: K the
                                   keys' and values' width (H, or fewer heads' under
                                   grouped-query attention: EuroBERT), M 2 for a plain
                                   feed-forward and 3 for a gated one (GeGLU, SwiGLU:
                                   ModernBERT, EuroBERT)
  + 12 * L' * H                    attention scores q.k and their use on the values
                                   (2 * L' * H each, forward; x 3 with the backward),
                                   L' the keys a query sees: L in a global layer,
                                   min(L, W + 1) in a local one of window W (ModernBERT's
                                   |i - j| <= W / 2), the work its band needs

plus, once per token, `6 * E * H` where the embeddings (E wide) are projected to H
(ALBERT, ELECTRA's small models), and the pretraining head:

  + 6 * (H * E + E * V) * P / L    MLM: transform + scores against the vocabulary, on the
                                   P gathered predictions of each row only (encoderx's
                                   head); P = L where a head scores every position (Hugging
                                   Face's)
  + 6 * ((2H + S) * H + H * E + E * V) * P / L
                                   SpanBERT's span boundary head (SBO) beside the MLM:
                                   both boundary tokens and an S-wide offset embedding,
                                   two dense layers, scores against the vocabulary
  + 6 * (H^2 + H)                  ELECTRA's discriminator head on every token

(H hidden, F intermediate, E embedding width, V vocabulary, L sequence length; V is
`padded_vocab_size`, the rows the scores are computed for, padding rows of
model.vocab_multiple included: RoBERTa-base's 50,304, not 50,265). ELECTRA
adds its generator's count (its own sizes, MLM head on the predictions) to the
discriminator's. Not counted, as is usual for MFU (PaLM, appendix B): embedding
lookups, LayerNorm, activations, softmax, dropout and the optimizer; the sentence-level
heads (one per row); DeBERTa's relative-position terms (c2p, p2c add about two more
score matmuls per layer) and XLNet's query stream, which the formula's BERT-equivalent
count leaves out: the benchmark prints XLA's own count of the compiled step beside it.
"""
from __future__ import annotations

from encoderx.models import model_config
from encoderx.models import heads


def encoder_flops_per_token(model: model_config.ModelConfig, seq_length: int) -> float:
  """Forward + backward FLOPs per token of the embeddings' projection and the layers."""
  hidden, intermediate = model.hidden_size, model.intermediate_size
  kv_width = model.kv_heads * model.head_dim
  ffn_matrices = 3 if model.feed_forward.kind == "gated" else 2
  matmuls = 6 * (2 * hidden**2 + 2 * hidden * kv_width + ffn_matrices * hidden * intermediate)
  local_keys = min(seq_length, model.attention.window + 1)
  keys = sum(seq_length if model.is_global_layer(index) else local_keys
             for index in range(model.num_layers))
  projection = 6 * model.embeddings.size * hidden if model.embeddings.size != hidden else 0
  return model.num_layers * matmuls + 12 * keys * hidden + projection


def mlm_head_flops_per_token(model: model_config.ModelConfig, predictions_per_row: int,
                             seq_length: int) -> float:
  """Forward + backward FLOPs per token of the MLM head on `predictions_per_row`."""
  width = model.embeddings.size
  per_prediction = 6 * (model.hidden_size * width + width * model.padded_vocab_size)
  return per_prediction * predictions_per_row / seq_length


def sbo_head_flops_per_token(model: model_config.ModelConfig, predictions_per_row: int,
                             seq_length: int) -> float:
  """Forward + backward FLOPs per token of SpanBERT's span boundary head."""
  hidden, width = model.hidden_size, model.embeddings.size
  offset_width = heads.SboHead.position_size
  per_prediction = 6 * ((2 * hidden + offset_width) * hidden + hidden * width
                        + width * model.padded_vocab_size)
  return per_prediction * predictions_per_row / seq_length


def training_flops_per_token(model: model_config.ModelConfig, seq_length: int,
                             predictions_per_row: int,
                             generator: model_config.ModelConfig | None = None,
                             span_boundary: bool = False) -> float:
  """A pretraining step's model FLOPs per token (see the module doc): the encoder and an
  MLM head on `predictions_per_row` (and the SBO head with `span_boundary`); with a
  `generator` (ELECTRA), the generator's encoder and MLM head, plus the discriminator's
  per-token head instead of an MLM."""
  flops = encoder_flops_per_token(model, seq_length)
  if generator is None:
    flops += mlm_head_flops_per_token(model, predictions_per_row, seq_length)
    if span_boundary:
      flops += sbo_head_flops_per_token(model, predictions_per_row, seq_length)
    return flops
  return (flops + 6 * (model.hidden_size**2 + model.hidden_size)
          + encoder_flops_per_token(generator, seq_length)
          + mlm_head_flops_per_token(generator, predictions_per_row, seq_length))

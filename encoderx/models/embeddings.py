"""Token + learned absolute position (optional) + segment (token type) embeddings."""
from __future__ import annotations

import flax.linen as nn
import jax

from encoderx.models import common
from encoderx.models import dropout as dropout_lib


class Embeddings(nn.Module):
  """[batch, length] ids -> [batch, length, hidden].

  Row `positions + position_offset` of the position table embeds a position (RoBERTa's
  rows 0 and 1 are unused: its positions start after its padding id).

  `position_embedding='none'` leaves the positions out of the input (attention variants
  with relative positions); the table then exists only for DeBERTa's enhanced mask
  decoder (`absolute_positions`). `type_vocab_size=0` leaves the token type table out and
  `embedding_layer_norm=False` the LayerNorm (XLNet: dropout(token embeddings) alone).
  The tables have width `embedding_size`; when that is smaller than `hidden_size`
  (ALBERT's factorization, V x E + E x H) a projection maps E to H after LayerNorm.
  """
  config: common.ModelConfig

  def setup(self):
    config = self.config
    embed = lambda n, axes, name: nn.Embed(  # pylint: disable=g-long-lambda
        n, config.embedding_size, dtype=config.compute_dtype,
        param_dtype=config.weights_dtype,
        embedding_init=common.initializer(config, axes), name=name)
    self.word_embeddings = embed(config.vocab_size, ("vocab", "embed"), "word_embeddings")
    if config.position_embedding == "absolute" or config.enhanced_mask_decoder:
      self.position_embeddings = embed(config.max_position_embeddings,
                                       ("positions", "embed"), "position_embeddings")
    if config.type_vocab_size:
      self.token_type_embeddings = embed(config.type_vocab_size, (None, "embed"),
                                         "token_type_embeddings")
    if config.embedding_layer_norm:
      self.layer_norm = common.layer_norm(config, "layer_norm")
    self.dropout = dropout_lib.Dropout(config.hidden_dropout)
    if config.embedding_size != config.hidden_size:
      self.projection = common.dense(config, config.hidden_size, ("embed", "mlp"),
                                     "projection")

  def __call__(self, input_ids: jax.Array, token_type_ids: jax.Array,
               positions: jax.Array, deterministic: bool) -> jax.Array:
    x = self.word_embeddings(input_ids)
    if self.config.enhanced_mask_decoder and self.is_initializing():
      # The table is the encoder's even where the decoder does not run (fine-tuning).
      _ = self.position_embeddings.embedding
    if self.config.position_embedding == "absolute":
      x = x + self.absolute_positions(positions)
    if self.config.type_vocab_size:
      x = x + self.token_type_embeddings(token_type_ids)
    if self.config.embedding_layer_norm:
      x = self.layer_norm(x)
    x = self.dropout(x, deterministic=deterministic)
    if self.config.embedding_size != self.config.hidden_size:
      x = self.projection(x)
    return common.constrain_hidden(x)

  def absolute_positions(self, positions: jax.Array) -> jax.Array:
    """The position table's rows: [batch, length] -> [batch, length, embedding]."""
    return self.position_embeddings(positions + self.config.position_offset)

  def attend(self, x: jax.Array) -> jax.Array:
    """Scores against every token embedding (the tied output layer): [..., E] -> [..., V]."""
    return self.word_embeddings.attend(x.astype(self.config.compute_dtype))


"""Token + learned absolute position (optional) + segment (token type) embeddings, and
the scores against the token embeddings (the tied output layer of the LM heads).

The vocabulary-sized parameters have `config.padded_vocab_size` rows (`vocab_size`
rounded up to `vocab_multiple`, so that they split over the mesh): the word embedding
table, an untied output table (model.tie_word_embeddings=False) and the output biases of
the heads scored against them. `is_vocabulary_param` names them by path and
`resize_vocabulary` cuts or pads their rows; the padding rows are masked out of every
score (`vocabulary_scores`).
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from encoderx.models import common
from encoderx.models import dropout as dropout_lib

# The names of the vocabulary-sized parameters: the word embedding table (module
# `word_embeddings`, whatever its scope: DeBERTa-v3's GDES delta of it is
# `embedding_deltas/word_embeddings`, methods/electra.py) and a head's `output_bias`.
WORD_EMBEDDINGS = "word_embeddings"
OUTPUT_BIAS = "output_bias"
# An MLM head's own output table [vocab, embedding] (model.tie_word_embeddings=False).
OUTPUT_EMBEDDINGS = "output_embeddings"


def is_vocabulary_param(path: tuple[str, ...]) -> bool:
  """Whether the parameter at `path` (its names, any prefix) has a row per token."""
  return (WORD_EMBEDDINGS in path or OUTPUT_EMBEDDINGS in path
          or path[-1] == OUTPUT_BIAS)


def resize_vocabulary(params, rows: int):
  """`params` (a nested dict of unboxed numpy or jax arrays, of any method or scope) with
  every vocabulary parameter cut or zero-padded to `rows` rows; the others untouched.
  Cutting to `vocab_size` drops the padding rows (export); padding to
  `padded_vocab_size` adds them (import, --init_from)."""
  def resize(path, value):
    names = tuple(getattr(key, "key", key) for key in path)
    if not is_vocabulary_param(names) or value.shape[0] == rows:
      return value
    if value.shape[0] > rows:
      return value[:rows]
    pad = np.pad if isinstance(value, np.ndarray) else jnp.pad
    return pad(value, [(0, rows - value.shape[0])] + [(0, 0)] * (value.ndim - 1))
  return jax.tree_util.tree_map_with_path(resize, params)


def output_bias(module: nn.Module, config: common.ModelConfig) -> jax.Array:
  """A head's bias over the vocabulary [padded_vocab] (zeros), created in `module`."""
  return module.param(OUTPUT_BIAS, common.zeros(("vocab",)), (config.padded_vocab_size,),
                      config.weights_dtype)


def vocabulary_scores(config: common.ModelConfig, scores: jax.Array,
                      bias: jax.Array | None = None) -> jax.Array:
  """Scores [..., padded_vocab] + `bias` (a head's `output_bias`; None: none), the
  padding rows' set to the dtype's lowest value: softmax gives them 0 (exactly, in
  float32 and bfloat16), argmax and sampling never pick them, and no gradient reaches
  their rows or bias."""
  if bias is not None:
    scores = scores + bias.astype(scores.dtype)
  if config.padded_vocab_size == config.vocab_size:
    return scores
  real = jnp.arange(config.padded_vocab_size) < config.vocab_size
  return jnp.where(real, scores, jnp.finfo(scores.dtype).min)


class Embed(nn.Embed):
  """`nn.Embed` whose rows are gathered from the table in its own dtype (float32) and
  cast to the compute dtype after. `nn.Embed` casts the whole table first, so in a
  bfloat16 model the gradient's scatter-add summed every occurrence of an id in
  bfloat16: imprecise for ids that repeat thousands of times in a batch (token type 0,
  padding, position 0), and on GPU the slowest part of the step (the profile of a
  BERT-large step at 32 x 512 on an H200: 56 of its 143 ms in these scatters). The
  forward values are the same either way."""

  def __call__(self, inputs: jax.Array) -> jax.Array:
    if not jnp.issubdtype(inputs.dtype, jnp.integer):
      raise ValueError(f"Input type must be an integer, got {inputs.dtype}")
    dtype = self.embedding.dtype if self.dtype is None else self.dtype
    return jnp.take(self.embedding, inputs, axis=0).astype(dtype)


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
    embed = lambda n, axes, name, drawn=None: Embed(  # pylint: disable=g-long-lambda
        n, config.embedding_size, dtype=config.compute_dtype,
        param_dtype=config.weights_dtype,
        embedding_init=common.initializer(config, axes, drawn), name=name)
    # vocab_size rows drawn as an unpadded table's; the padding rows below them zeros.
    self.word_embeddings = embed(config.padded_vocab_size, ("vocab", "embed"),
                                 WORD_EMBEDDINGS, config.vocab_size)
    if config.position_embedding == "absolute" or config.enhanced_mask_decoder:
      self.position_embeddings = embed(config.max_position_embeddings,
                                       ("positions", "embed"), "position_embeddings")
    if config.type_vocab_size:
      self.token_type_embeddings = embed(config.type_vocab_size, (None, "embed"),
                                         "token_type_embeddings")
    if config.embedding_layer_norm:
      self.layer_norm = common.norm(config, "layer_norm")
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

  def attend(self, x: jax.Array, bias: jax.Array | None) -> jax.Array:
    """Scores against every token embedding plus a head's `bias` (`output_bias`; None:
    none): the tied output layer, [..., E] -> [..., padded_vocab], the padding rows
    masked (`vocabulary_scores`)."""
    config = self.config
    return vocabulary_scores(
        config, self.word_embeddings.attend(x.astype(config.compute_dtype)), bias)


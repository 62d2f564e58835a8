"""Token + learned absolute position (optional) + segment (token type) embeddings, and
the scores against the token embeddings (the tied output layer of the LM heads).

The vocabulary-sized parameters have `config.padded_vocab_size` rows (`vocab_size`
rounded up to `vocab_multiple`, so that they split over the mesh): the word embedding
table, an untied output table (model.heads.tie_word_embeddings=False) and the output biases of
the heads scored against them. `is_vocabulary_param` names them by path and
`resize_vocabulary` cuts or pads their rows; the padding rows are masked out of every
score (`vocabulary_scores`).
"""
from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from encoderx import errors
from encoderx.models import common
from encoderx.models import contraction
from encoderx.models import dropout as dropout_lib

POSITION_EMBEDDINGS = ("absolute", "rotary", "none")


@dataclasses.dataclass(frozen=True)
class EmbeddingsConfig:
  """config.model.embeddings: the input embeddings and how positions enter."""
  size: int = 0  # 0: hidden_size; smaller factorizes the embedding (ALBERT).
  # "absolute": a learned table of max_positions rows (BERT); "rotary": no table,
  # queries and keys rotated by the batch's positions (encoderx/models/rotary.py;
  # ModernBERT, EuroBERT); "none": no position embedding in the input (variants with
  # relative positions).
  position: str = "absolute"
  max_positions: int = 512
  # Added to every position id: RoBERTa's positions start after its padding id, at 2,
  # so its table has max length + 2 rows (514 for 512).
  position_offset: int = 0
  type_vocab_size: int = 2
  # False: the embeddings enter the first layer without a norm (XLNet, EuroBERT).
  layer_norm: bool = True
  # Rotary positions: the base of the frequencies (theta) in global layers, and in local
  # ones (0: rope_theta). ModernBERT: 160,000 and 10,000; EuroBERT: 250,000.
  rope_theta: float = 10000.0
  local_rope_theta: float = 0.0


def validate_embeddings(model) -> None:
  """config.model.embeddings' fields."""
  embeddings = model.embeddings
  if embeddings.max_positions <= 0:
    errors.fail("model.embeddings.max_positions",
                f"must be positive, got {embeddings.max_positions}.")
  if embeddings.size < 0:
    errors.fail("model.embeddings.size", "must be >= 0 (0 means the default).")
  if embeddings.position_offset < 0:
    errors.fail("model.embeddings.position_offset",
                f"must be >= 0, got {embeddings.position_offset}.")
  errors.check_choice("model.embeddings.position", embeddings.position, POSITION_EMBEDDINGS)
  if embeddings.rope_theta <= 0:
    errors.fail("model.embeddings.rope_theta",
                f"must be positive, got {embeddings.rope_theta}.")
  if embeddings.local_rope_theta < 0:
    errors.fail("model.embeddings.local_rope_theta", "must be positive (or 0: model."
                f"embeddings.rope_theta), got {embeddings.local_rope_theta}.")
  if embeddings.position == "rotary" and (model.hidden_size // model.num_heads) % 2:
    errors.fail("model.embeddings.position", "'rotary' rotates pairs of dimensions; the "
                f"head size hidden_size / num_heads = {model.hidden_size // model.num_heads}"
                " is odd.")


# The names of the vocabulary-sized parameters: the word embedding table (module
# `word_embeddings`, whatever its scope: DeBERTa-v3's GDES delta of it is
# `embedding_deltas/word_embeddings`, methods/electra.py) and a head's `output_bias`.
WORD_EMBEDDINGS = "word_embeddings"
OUTPUT_BIAS = "output_bias"
# An MLM head's own output table [vocab, embedding] (model.heads.tie_word_embeddings=False).
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


def output_bias(module: nn.Module, config: model_config.ModelConfig) -> jax.Array:
  """A head's bias over the vocabulary [padded_vocab] (zeros), created in `module`."""
  return module.param(OUTPUT_BIAS, common.zeros(("vocab",)), (config.padded_vocab_size,),
                      config.weights_dtype)


def vocabulary_scores(config: model_config.ModelConfig, x: jax.Array, table: jax.Array,
                      bias: jax.Array | None = None) -> jax.Array:
  """x [..., E] scored against every row of `table` [padded_vocab, E] (the token
  embeddings, or a head's own output table) + `bias` (a head's `output_bias`; None:
  none), in the compute dtype (contraction.scores), the padding rows' set to the dtype's
  lowest value: softmax gives them 0 (exactly, in float32 and bfloat16), argmax and
  sampling never pick them, and no gradient reaches their rows or bias."""
  dtype = config.compute_dtype
  scores = contraction.scores(x.astype(dtype), table.astype(dtype),
                              None if bias is None else bias.astype(dtype))
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
  config: model_config.ModelConfig

  def setup(self):
    config = self.config
    embed = lambda n, axes, name, drawn=None: Embed(  # pylint: disable=g-long-lambda
        n, config.embeddings.size, dtype=config.compute_dtype,
        param_dtype=config.weights_dtype,
        embedding_init=common.initializer(config, axes, drawn), name=name)
    # vocab_size rows drawn as an unpadded table's; the padding rows below them zeros.
    self.word_embeddings = embed(config.padded_vocab_size, ("vocab", "embed"),
                                 WORD_EMBEDDINGS, config.vocab_size)
    if config.embeddings.position == "absolute" or config.heads.enhanced_mask_decoder:
      self.position_embeddings = embed(config.embeddings.max_positions,
                                       ("positions", "embed"), "position_embeddings")
    if config.embeddings.type_vocab_size:
      self.token_type_embeddings = embed(config.embeddings.type_vocab_size, (None, "embed"),
                                         "token_type_embeddings")
    if config.embeddings.layer_norm:
      self.layer_norm = common.norm(config, "layer_norm")
    self.dropout = dropout_lib.Dropout(config.hidden_dropout)
    if config.embeddings.size != config.hidden_size:
      self.projection = common.dense(config, config.hidden_size, ("embed", "mlp"),
                                     "projection")

  def __call__(self, input_ids: jax.Array, token_type_ids: jax.Array,
               positions: jax.Array, deterministic: bool) -> jax.Array:
    x = self.word_embeddings(input_ids)
    if self.config.heads.enhanced_mask_decoder and self.is_initializing():
      # The table is the encoder's even where the decoder does not run (fine-tuning).
      _ = self.position_embeddings.embedding
    if self.config.embeddings.position == "absolute":
      x = x + self.absolute_positions(positions)
    if self.config.embeddings.type_vocab_size:
      x = x + self.token_type_embeddings(token_type_ids)
    if self.config.embeddings.layer_norm:
      x = self.layer_norm(x)
    x = self.dropout(x, deterministic=deterministic)
    if self.config.embeddings.size != self.config.hidden_size:
      x = self.projection(x)
    return common.constrain_hidden(x)

  def absolute_positions(self, positions: jax.Array) -> jax.Array:
    """The position table's rows: [batch, length] -> [batch, length, embedding]."""
    return self.position_embeddings(positions + self.config.embeddings.position_offset)

  def attend(self, x: jax.Array, bias: jax.Array | None) -> jax.Array:
    """Scores against every token embedding plus a head's `bias` (`output_bias`; None:
    none): the tied output layer, [..., E] -> [..., padded_vocab], the padding rows
    masked (`vocabulary_scores`)."""
    return vocabulary_scores(self.config, x, self.word_embeddings.embedding, bias)


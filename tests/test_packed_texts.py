"""An embedding model's training texts packed into rows (encoderx/data/packed_texts.py):
every text placed once, whole, in its own segment; packed embeddings equal padded ones
in every family with rotary or absolute positions and local layers; the contrastive
step equal with and without packing."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from encoderx.data import packed_texts
from encoderx.models import finetuning, model_config

from conftest import _tiny_config
from reference_models import fresh_params


def padded_texts(lengths, length: int, seed: int = 0, vocab: int = 100) -> dict:
  """Texts [chunks, texts, length] of `lengths` (a [chunks, texts] list): ids from 5,
  padding id 0, positions from 0, token types 0 and 1 (to see them moved)."""
  rng = np.random.default_rng(seed)
  lengths = np.asarray(lengths)
  real = np.arange(length) < lengths[..., None]
  return {"input_ids": np.where(real, rng.integers(5, vocab, real.shape), 0).astype(np.int32),
          "token_type_ids": np.where(real, rng.integers(0, 2, real.shape), 0).astype(np.int32),
          "segment_ids": real.astype(np.int32),
          "positions": np.where(real, np.arange(length), 0).astype(np.int32)}


def test_every_text_is_placed_once_whole_in_its_own_segment():
  rng = np.random.default_rng(1)
  lengths = rng.integers(2, 17, size=(3, 20))  # 3 chunks of 20 texts, rows of 16
  texts = padded_texts(lengths, 16)
  packed = packed_texts.pack(texts, rows_multiple=4)
  rows = packed["input_ids"].shape[1]
  assert rows in packed_texts.row_buckets(20, 4) and rows % 4 == 0
  assert rows < 20  # fewer rows than texts: padding removed
  for chunk in range(3):
    assert sorted(set(packed["token_text"][chunk].ravel()) - {20}) == list(range(20))
    flat = {name: packed[name][chunk].ravel() for name in packed_texts.PACKED_FEATURES}
    for text in range(20):
      start, end = packed["text_start"][chunk, text], packed["text_end"][chunk, text]
      assert end - start + 1 == lengths[chunk, text]
      assert start // 16 == end // 16  # one row
      span = slice(start, end + 1)
      for name in ("input_ids", "token_type_ids", "positions"):
        np.testing.assert_array_equal(flat[name][span],
                                      texts[name][chunk, text, :lengths[chunk, text]])
      assert len(set(flat["segment_ids"][span])) == 1 and flat["segment_ids"][start] > 0
      assert (packed["token_text"][chunk].ravel()[span] == text).all()
    # A row's segments are distinct texts; its padding is segment 0, text 20, id 0.
    padding = packed["segment_ids"][chunk] == 0
    assert (packed["token_text"][chunk][padding] == 20).all()
    assert (packed["input_ids"][chunk][padding] == 0).all()
  # Deterministic.
  again = packed_texts.pack(texts, rows_multiple=4)
  for name, value in packed.items():
    np.testing.assert_array_equal(value, again[name])


def test_row_buckets_are_few_and_hold_the_worst_case():
  assert packed_texts.row_buckets(64) == [8, 12, 16, 20, 24, 32, 40, 48, 64]
  assert packed_texts.row_buckets(64, 8) == [8, 16, 24, 32, 40, 48, 64]
  assert packed_texts.row_buckets(6, 4) == [4, 8]
  full = padded_texts([[16] * 6], 16)  # every text a whole row: the largest bucket
  assert packed_texts.pack(full, 4)["input_ids"].shape[1] == 8


@pytest.mark.parametrize("name", ["bert:tiny", "modernbert:tiny", "eurobert:tiny"])
def test_packed_embeddings_equal_padded_ones(name):
  """Absolute positions (BERT), rotary positions with local layers (ModernBERT, window
  8 here so that it cuts inside texts), rotary and grouped-query attention (EuroBERT):
  each text's embedding of packed rows equals its own padded row's, for every pooling."""
  config = _tiny_config(name)
  if config.model.attention.window:
    config.model.attention.window = 8
  resolved = model_config.ModelConfig.from_config(config.model, 200)
  lengths = [[3, 17, 9, 24, 5, 12, 30, 7]]
  texts = padded_texts(lengths, 32, vocab=200)
  packed = {n: jnp.asarray(v[0]) for n, v in packed_texts.pack(texts).items()}
  assert packed["input_ids"].shape[0] < 8
  padded = {n: jnp.asarray(texts[n][0]) for n in packed_texts.PACKED_FEATURES}
  for pooling in finetuning.SENTENCE_POOLINGS:
    model = finetuning.SentenceEncoder(resolved, pooling=pooling)
    params = fresh_params(model)
    apply = jax.jit(lambda batch: model.apply({"params": params}, batch))  # pylint: disable=cell-var-from-loop
    np.testing.assert_allclose(apply(packed), apply(padded), atol=2e-5, rtol=1e-4,
                               err_msg=f"{name} {pooling}")

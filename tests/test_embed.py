"""Sentence embeddings (encoderx.embed): the released MiniLM's mean-pooled, L2-normalized
embeddings match sentence-transformers'; the command writes the library call's array."""
import subprocess
import sys

import numpy as np
import pytest

from encoderx import embed

TEXTS = [
    "It is a truth universally acknowledged.",
    "A man is playing a guitar.",
    "",  # an empty line: [CLS] [SEP] only
    "Emma Woodhouse, handsome, clever, and rich, with a comfortable home and happy "
    "disposition, seemed to unite some of the best blessings of existence; and had lived "
    "nearly twenty-one years in the world with very little to distress or vex her.",
    "Café au lait — naïve résumé!",
    "A woman is slicing an onion.",
]


def test_minilm_mean_pooling_matches_sentence_transformers(minilm_directory):
  sentence_transformers = pytest.importorskip(
      "sentence_transformers", reason="sentence-transformers is not installed")
  reference = sentence_transformers.SentenceTransformer(
      str(minilm_directory), device="cpu").encode(TEXTS, normalize_embeddings=True)
  ours = embed.embed(TEXTS, f"hf:{minilm_directory}", pooling="mean", normalize=True,
                     batch_size=4)
  assert ours.shape == reference.shape == (len(TEXTS), 384)
  np.testing.assert_allclose(np.linalg.norm(ours, axis=-1), 1.0, atol=1e-5)
  cosines = (ours * reference).sum(-1) / np.linalg.norm(reference, axis=-1)
  assert cosines.min() >= 0.9999, cosines


def test_the_command_writes_the_library_call_in_input_order(minilm_directory, tmp_path):
  source = tmp_path / "sentences.txt"
  source.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
  output = tmp_path / "embeddings.npy"
  completed = subprocess.run(
      [sys.executable, "-m", "encoderx.embed", f"--init_from=hf:{minilm_directory}",
       f"--input={source}", f"--output={output}", "--pooling=cls", "--nonormalize",
       "--batch_size=4"],
      capture_output=True, text=True, check=False)
  assert completed.returncode == 0, completed.stderr[-2000:]
  assert f"wrote {len(TEXTS)} embeddings of 384 dimensions" in completed.stdout
  written = np.load(output)
  # One at a time (no padding, no sorting by length) gives the same rows.
  embedder = embed.Embedder(f"hf:{minilm_directory}", pooling="cls", normalize=False,
                            batch_size=1)
  single = np.concatenate([embedder([text]) for text in TEXTS])
  np.testing.assert_allclose(written, single, atol=1e-4)
  # not normalized: the flag wins over the model's Normalize module
  assert not np.allclose(np.linalg.norm(written, axis=-1), 1.0)

  missing = subprocess.run(
      [sys.executable, "-m", "encoderx.embed", f"--init_from=hf:{tmp_path}",
       f"--input={source}", f"--output={tmp_path / 'x.npy'}"],
      capture_output=True, text=True, check=False)
  assert missing.returncode == 2
  assert missing.stderr.strip().splitlines()[-1].startswith("encoderx: error: ")
  assert "config.json" in missing.stderr and not (tmp_path / "x.npy").exists()


def test_last_token_pooling_matches_sentence_transformers(minilm_directory):
  """--pooling=lasttoken takes each text's last real token ([SEP]) in a padded batch, as
  sentence-transformers' Pooling(pooling_mode="lasttoken") does."""
  sentence_transformers = pytest.importorskip(
      "sentence_transformers", reason="sentence-transformers is not installed")
  modules = pytest.importorskip("sentence_transformers.sentence_transformer.modules")
  transformer = modules.Transformer(str(minilm_directory))
  pooling = modules.Pooling(
      transformer.get_embedding_dimension(), pooling_mode="lasttoken")
  reference = sentence_transformers.SentenceTransformer(
      modules=[transformer, pooling], device="cpu").encode(TEXTS, batch_size=4)
  ours = embed.embed(TEXTS, f"hf:{minilm_directory}", pooling="lasttoken", normalize=False,
                     batch_size=4)
  np.testing.assert_allclose(ours, reference, atol=1e-4)

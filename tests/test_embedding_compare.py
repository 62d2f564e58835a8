"""The equal-budget embedding comparison (encoderx/tools/quality/embedding_compare.py) on
a tiny model: both sides train, and the scores it reports are those of the models it
trained."""
import jax
import numpy as np
import pytest

pytest.importorskip("sentence_transformers")

from encoderx import embed, retrieval  # noqa: E402
from encoderx.tools.parity import retrieval_compare, sts_compare  # noqa: E402
from encoderx.tools.quality import embedding_compare  # noqa: E402
from finetune_cases import stsb_subset  # noqa: E402


def test_both_sides_train_and_are_scored_as_their_saved_models(tmp_path):
  import sentence_transformers  # pylint: disable=g-import-not-at-top
  import tiny_hf  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  data = tmp_path / "stsb"
  data.mkdir()
  for name, rows in (("train.tsv", 120), ("dev.tsv", 16), ("test.tsv", 60)):
    stsb_subset(data, name, rows)
  init_from = tiny_hf.save_tiny_bert(tmp_path / "base", transformers.BertModel)
  result = embedding_compare.compare(init_from, str(data), seeds=[0], steps=2,
                                     batch_size=8, max_length=32, learning_rate=1e-3,
                                     keep=str(tmp_path / "models"),
                                     devices=jax.devices()[:1])
  assert result["steps"] == 2 and result["pairs"] == len(
      embedding_compare.training_pairs(str(data / "train.tsv"))) > 16
  seed = result["seeds"][0]
  for side in embedding_compare.SIDES:  # both trained: their cosines moved
    assert seed[side]["seconds"] > 0
    assert abs(seed[side]["spearman"] - result["start"]["spearman"]) > 1e-4, side

  # The sentence-transformers model's Spearman is its own encode()'s: the saved model,
  # read back through hf:, is the one it trained.
  st_model = tmp_path / "models" / "sentence_transformers-0"
  model = sentence_transformers.SentenceTransformer(str(st_model), device="cpu")
  first, second, gold = sts_compare.read_pairs(str(data / "test.tsv"))
  encode = lambda texts: model.encode(texts, normalize_embeddings=True)
  cosines = np.sum(encode(first) * encode(second), axis=-1)
  from scipy import stats  # pylint: disable=g-import-not-at-top
  assert seed["sentence_transformers"]["spearman"] == pytest.approx(
      stats.spearmanr(cosines, gold).statistic, abs=1e-4)
  # encoderx's figures are its run's final checkpoint's, scored directly.
  collection = retrieval_compare.write_stsb_set(str(data / "test.tsv"),
                                                str(tmp_path / "set"))
  embedder = embed.Embedder(str(tmp_path / "models" / "encoderx-0"), pooling="mean",
                            normalize=True, max_length=32)
  direct = retrieval.evaluate(embedder, collection)
  assert seed["encoderx"]["ndcg@10"] == pytest.approx(direct["ndcg@10"], abs=1e-6)

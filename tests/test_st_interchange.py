"""sentence-transformers interchange: an embedding run exports as a SentenceTransformer
directory and a one-score run as a CrossEncoder one, each giving encoderx's numbers; a
sentence-transformers directory given as hf:DIR embeds with its own pooling,
normalization and prompts (encoderx/export/interchange.py, encoderx/hf/st_directory.py)."""
import csv
import json
import logging
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from encoderx import embed, errors, export, retrieval, train
from encoderx.data import beir
from encoderx.hf import st_directory
from encoderx.methods import simcse

from finetune_cases import shrunk, simcse_config, stsb_subset  # pylint: disable=g-bad-import-order

sentence_transformers = pytest.importorskip("sentence_transformers")
ONE_DEVICE = jax.devices()[:1]
TEXTS = ["A man is playing a guitar.", "A woman is slicing an onion.", "",
         "Café au lait — naïve résumé!", "The cat sat on the mat by the door."]


@pytest.fixture(scope="module")
def simcse_run(tmp_path_factory):
  """A tiny unsupervised SimCSE run (mean pooling) with a best checkpoint."""
  directory = tmp_path_factory.mktemp("simcse")
  config = simcse_config(directory, "unsupervised")
  config.eval.best_metric = "spearman"
  train.run(config, str(directory / "run"), show_progress=False, devices=ONE_DEVICE)
  return directory / "run"


def _with_pooling(run, directory, pooling):
  """A copy of `run` whose config names another pooling (it has no parameters)."""
  copy = directory / f"run-{pooling}"
  shutil.copytree(run, copy)
  config = json.loads((copy / "config.json").read_text())
  config["finetune"]["pooling"] = pooling
  (copy / "config.json").write_text(json.dumps(config))
  return copy


@pytest.mark.parametrize("pooling", ["mean", "first_token"])
def test_a_simcse_run_loads_in_sentence_transformers_with_encoderx_embeddings(
    simcse_run, tmp_path, pooling):
  run = simcse_run if pooling == "mean" else _with_pooling(simcse_run, tmp_path, pooling)
  output = tmp_path / "st"
  if pooling == "mean":  # the command line
    completed = subprocess.run(
        [sys.executable, "-m", "encoderx.export", f"--workdir={run}", f"--output={output}",
         "--format=sentence-transformers"], capture_output=True, text=True, check=False)
    assert completed.returncode == 0, completed.stderr[-2000:]
  else:
    export.export_sentence_transformers(str(run), str(output))
  assert {"modules.json", "1_Pooling", "README.md"} <= set(os.listdir(output))
  assert not (output / "2_Normalize").exists()  # SimCSE's head does not normalize
  reference = sentence_transformers.SentenceTransformer(str(output), device="cpu")
  ours = embed.Embedder(str(run), pooling="mean" if pooling == "mean" else "cls")(TEXTS)
  np.testing.assert_allclose(reference.encode(TEXTS), ours, atol=1e-5)
  # And back: hf:DIR of the export embeds the same without flags.
  np.testing.assert_allclose(embed.Embedder(f"hf:{output}")(TEXTS), ours, atol=1e-5)
  card = (output / "README.md").read_text()
  assert "train.tsv" in card and "spearman" in card and "SimCSE" in card


def test_a_normalized_head_with_prompts_exports_them(simcse_run, tmp_path, monkeypatch):
  # The description the contrastive method gives (fabricated on the SimCSE run).
  monkeypatch.setattr(simcse.SimCSE, "describe_head", lambda self: {
      "pooling": "mean", "normalize": True, "matryoshka_dims": [32, 16],
      "prompts": {"query": "query: ", "document": "passage: "}})
  output = tmp_path / "st"
  export.export_sentence_transformers(str(simcse_run), str(output))
  assert (output / "2_Normalize").is_dir()
  model = sentence_transformers.SentenceTransformer(str(output), device="cpu")
  assert model.prompts == {"query": "query: ", "document": "passage: "}
  embedder = embed.Embedder(str(simcse_run), normalize=True)
  queries = embedder(["query: " + text for text in TEXTS])
  np.testing.assert_allclose(model.encode_query(TEXTS), queries, atol=1e-5)
  np.testing.assert_allclose(model.encode(TEXTS), embedder(TEXTS), atol=1e-5)  # no default
  imported = embed.Embedder(f"hf:{output}")  # takes normalize and the prompts
  np.testing.assert_allclose(imported(TEXTS, prompt_name="query"), queries, atol=1e-5)
  np.testing.assert_allclose(np.linalg.norm(queries, axis=-1), 1.0, atol=1e-5)
  assert "Matryoshka dimensions: 32, 16" in (output / "README.md").read_text()


def test_a_run_of_another_kind_is_refused_before_anything_is_written(simcse_run, tmp_path):
  output = tmp_path / "ce"
  with pytest.raises(errors.UserError, match="does not score pairs with one output"):
    export.export_cross_encoder(str(simcse_run), str(output))
  assert not output.exists()


def test_a_similarity_run_loads_as_a_cross_encoder_with_its_scores(tmp_path):
  from encoderx import configs  # pylint: disable=g-import-not-at-top
  config = shrunk(configs.get("finetune:similarity"))
  config.finetune.train_file = stsb_subset(tmp_path, "train.tsv", 32)
  config.finetune.dev_file = stsb_subset(tmp_path, "dev.tsv", 16)
  # Pairs that fit: cut at 16, some rows differed by ~2e-5 (CrossEncoder's fast
  # tokenizer cuts a pair otherwise than the closed form encoderx follows).
  config.data.seq_length = 128
  run = tmp_path / "run"
  train.run(config, str(run), show_progress=False, devices=ONE_DEVICE)
  _, predictions = train.predict(config, str(run), config.finetune.dev_file,
                                 devices=ONE_DEVICE)
  with open(predictions, encoding="utf-8") as f:
    rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
  output = tmp_path / "ce"
  best = int(os.listdir(run / "best")[0])  # the step predict reads
  export.export_cross_encoder(str(run), str(output), step=best)
  reranker = sentence_transformers.CrossEncoder(str(output), device="cpu")
  scores = reranker.predict([(r["text_a"], r["text_b"]) for r in rows])
  # 7 significant digits written: the head's score itself, no sigmoid.
  np.testing.assert_allclose(scores, [float(r["prediction"]) for r in rows], atol=1e-5)
  with pytest.raises(errors.UserError, match="does not train sentence embeddings"):
    export.export_sentence_transformers(str(run), str(tmp_path / "st"))
  assert not (tmp_path / "st").exists()


def test_retrieval_puts_the_query_and_document_prompts_before_their_texts():
  calls = []

  class Recording:  # an Embedder's interface, recording the prompt of each call
    prompts = {"query": "query: ", "document": "passage: "}

    def __call__(self, texts, show_progress=False, description="", prompt=None):
      calls.append((description, prompt))
      return np.eye(len(texts), 2, dtype=np.float32)

  collection = beir.Collection(corpus={"d1": "a", "d2": "b"}, queries={"q1": "x"},
                               qrels={"q1": {"d1": 1}})
  retrieval.rank(Recording(), collection, k=2)
  assert calls == [("queries", "query: "), ("corpus", "passage: ")]
  # No document prompt: none, not the model's default prompt (encode_document's choice).
  Recording.prompts = {"query": "query: ", "default": "always: "}
  calls.clear()
  retrieval.rank(Recording(), collection, k=2)
  assert calls == [("queries", "query: "), ("corpus", "")]


# --- import ---------------------------------------------------------------------------------
def test_minilm_embeds_as_sentence_transformers_does_without_flags(minilm_directory):
  reference = sentence_transformers.SentenceTransformer(str(minilm_directory), device="cpu")
  ours = embed.Embedder(f"hf:{minilm_directory}")(TEXTS)  # mean pooling, normalized
  np.testing.assert_allclose(ours, reference.encode(TEXTS), atol=1e-5)


def _fabricated(minilm_directory, directory, modules, pooling, settings):
  """all-MiniLM-L6-v2's encoder with other sentence-transformers modules."""
  directory.mkdir()
  for name in os.listdir(minilm_directory):
    if name.endswith((".json", ".txt", ".safetensors")):
      os.symlink(os.path.join(minilm_directory, name), directory / name)
  (directory / "1_Pooling").mkdir()
  for name, value in [("modules.json", modules), ("1_Pooling/config.json", pooling),
                      ("config_sentence_transformers.json", settings)]:
    (directory / name).unlink(missing_ok=True)
    (directory / name).write_text(json.dumps(value))
  return directory


MODULES = [{"idx": 0, "name": "0", "path": "",
            "type": "sentence_transformers.models.Transformer"},
           {"idx": 1, "name": "1", "path": "1_Pooling",
            "type": "sentence_transformers.sentence_transformer.modules.pooling.Pooling"}]


def test_cls_pooling_and_a_default_query_prompt_are_honoured(minilm_directory, tmp_path):
  directory = _fabricated(minilm_directory, tmp_path / "st", MODULES,
                          {"embedding_dimension": 384, "pooling_mode": "cls"},
                          {"prompts": {"query": "query: "}, "default_prompt_name": "query"})
  reference = sentence_transformers.SentenceTransformer(str(directory), device="cpu")
  embedder = embed.Embedder(f"hf:{directory}")
  ours = embedder(TEXTS)
  np.testing.assert_allclose(ours, reference.encode(TEXTS), atol=1e-5)
  assert not np.allclose(np.linalg.norm(ours, axis=-1), 1.0)  # no Normalize module
  plain = embed.Embedder(f"hf:{minilm_directory}", pooling="cls", normalize=False)
  np.testing.assert_allclose(ours, plain(["query: " + t for t in TEXTS]), atol=1e-5)
  # Flags win: mean pooling, normalized, as the released model.
  flagged = embed.Embedder(f"hf:{directory}", pooling="mean", normalize=True)
  np.testing.assert_allclose(flagged(TEXTS), embed.Embedder(f"hf:{minilm_directory}")(
      ["query: " + t for t in TEXTS]), atol=1e-5)
  with pytest.raises(errors.UserError, match="prompt 'document' is not one"):
    embedder(TEXTS, prompt_name="document")


def test_a_module_encoderx_cannot_reproduce_is_named(minilm_directory, tmp_path):
  dense = {"idx": 2, "name": "2", "path": "2_Dense",
           "type": "sentence_transformers.models.Dense"}
  directory = _fabricated(minilm_directory, tmp_path / "st", MODULES + [dense],
                          {"pooling_mode_mean_tokens": True}, {})
  with pytest.raises(errors.UserError, match=r"module 2 \(sentence_transformers.models."
                                             r"Dense in .*2_Dense\) is not one encoderx"):
    embed.Embedder(f"hf:{directory}")
  max_pooling = _fabricated(minilm_directory, tmp_path / "max", MODULES,
                            {"pooling_mode": ["mean", "max"]}, {})
  with pytest.raises(errors.UserError, match="pools by mean \\+ max"):
    embed.Embedder(f"hf:{max_pooling}")


def test_an_embedding_run_from_a_sentence_transformers_directory_takes_its_head(
    minilm_directory, tmp_path, caplog):
  """--init_from=hf:ST_DIR of a contrastive run: the directory's pooling, and its
  prompts where the run sets none; a head encoderx cannot reproduce leaves the run's,
  with a warning; a method without sentence embeddings takes nothing."""
  from encoderx import configs, initialize  # pylint: disable=g-import-not-at-top
  directory = _fabricated(minilm_directory, tmp_path / "st", MODULES,
                          {"embedding_dimension": 384, "pooling_mode": "cls"},
                          {"prompts": {"query": "query: ", "document": "passage: "}})
  config = configs.get("embedding:mnrl")
  config.init_from, config.contrastive.prompts.document = f"hf:{directory}", "doc: "
  with caplog.at_level(logging.INFO, logger="encoderx"):
    resolved = initialize.resolve(config).config
  assert resolved.finetune.pooling == "first_token"  # was the recipe's mean
  assert resolved.contrastive.prompts.query == "query: "  # the run set none
  assert resolved.contrastive.prompts.document == "doc: "  # the run's own
  assert "taking its sentence embedding (finetune.pooling='first_token', " \
         "contrastive.prompts.query='query: ')" in caplog.text
  max_pooling = _fabricated(minilm_directory, tmp_path / "max", MODULES,
                            {"pooling_mode": ["mean", "max"]}, {})
  config.init_from = f"hf:{max_pooling}"
  with caplog.at_level(logging.WARNING, logger="encoderx"):
    resolved = initialize.resolve(config).config
  assert resolved.finetune.pooling == "mean" and "is not taken (" in caplog.text
  classifier = configs.get("finetune:classify")
  classifier.init_from = f"hf:{directory}"
  assert initialize.resolve(classifier).config.finetune.pooling == (
      classifier.finetune.pooling)


# --- an embedding run as it was trained --------------------------------------------------
PROMPTS = {"query": "query: ", "document": "passage: "}
MATRYOSHKA_DIMS = (32, 16, 8)


@pytest.fixture(scope="module")
def contrastive_run(tmp_path_factory):
  """A tiny contrastive run from a tiny Hugging Face BERT (32 wide): mean pooling,
  normalized, query and document prompts, Matryoshka dimensions; 2 steps, a best
  checkpoint."""
  import test_contrastive  # pylint: disable=g-import-not-at-top
  import tiny_hf  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  directory = tmp_path_factory.mktemp("contrastive")
  config = test_contrastive.method_config(directory)
  config.init_from = tiny_hf.save_tiny_bert(directory / "base", transformers.BertModel)
  config.contrastive.prompts.query = PROMPTS["query"]
  config.contrastive.prompts.document = PROMPTS["document"]
  config.contrastive.matryoshka_dims = MATRYOSHKA_DIMS
  train.run(config, str(directory / "run"), show_progress=False, devices=ONE_DEVICE)
  return directory / "run"


def test_only_an_embedding_methods_head_gives_a_sentence_embedding():
  of_run_head = st_directory.of_run_head
  assert of_run_head({"labels": ["no", "yes"], "pooling": "first_token"}, 32) is None
  assert of_run_head({"regression": True, "pooling": "mean"}, 32) is None  # similarity
  assert of_run_head({"kind": "cross-encoder", "num_labels": 1}, 32) is None  # rerank
  assert of_run_head({"pooling": "first_token"}, 64) == st_directory.SentenceEmbedding(
      pooling="cls", max_seq_length=64)  # simcse's
  assert of_run_head({"pooling": "last_token", "normalize": True, "prompts": PROMPTS,
                      "matryoshka_dims": [16]}, 32) == st_directory.SentenceEmbedding(
      pooling="lasttoken", normalize=True, prompts=PROMPTS, max_seq_length=32)


def _unit(vectors):
  return vectors / np.linalg.norm(vectors, axis=-1, keepdims=True)


def test_a_contrastive_run_embeds_as_its_sentence_transformers_export_without_flags(
    contrastive_run, tmp_path):
  output = tmp_path / "st"
  export.export_sentence_transformers(str(contrastive_run), str(output))
  model = sentence_transformers.SentenceTransformer(str(output), device="cpu")
  embedder = embed.Embedder(str(contrastive_run))  # the run's own settings, no flags
  assert embedder.prompts == PROMPTS and embedder.embedding.normalize
  assert embedder.max_length == 32  # the run's data.seq_length, as the export's
  ours = {name: embedder(TEXTS, prompt_name=name) for name in PROMPTS}
  np.testing.assert_allclose(model.encode_query(TEXTS), ours["query"], atol=1e-5)
  np.testing.assert_allclose(model.encode_document(TEXTS), ours["document"], atol=1e-5)
  np.testing.assert_allclose(np.linalg.norm(ours["query"], axis=-1), 1.0, atol=1e-5)
  assert not np.allclose(ours["query"], ours["document"], atol=1e-3)  # prompts differ
  # Flags still win.
  flagged = embed.Embedder(str(contrastive_run), pooling="cls", normalize=False)
  plain = embed.Embedder(f"hf:{output}", pooling="cls", normalize=False)
  np.testing.assert_allclose(flagged(TEXTS, prompt_name="query"),
                             plain(["query: " + text for text in TEXTS]), atol=1e-5)
  # A Matryoshka size: sentence-transformers truncates after Normalize.
  for dim in MATRYOSHKA_DIMS[1:]:
    truncated = sentence_transformers.SentenceTransformer(str(output), device="cpu",
                                                          truncate_dim=dim)
    np.testing.assert_allclose(truncated.encode_document(TEXTS),
                               ours["document"][:, :dim], atol=1e-5)
    np.testing.assert_allclose(truncated.encode_query(TEXTS, normalize_embeddings=True),
                               _unit(ours["query"][:, :dim]), atol=1e-5)
  card = (output / "README.md").read_text()
  assert "MatryoshkaLoss(MultipleNegativesRankingLoss)" in card
  assert f"base_model: {contrastive_run.parent / 'base'}" in card
  assert "spearman" in card and "step 2" in card
  assert "Matryoshka dimensions: 32, 16, 8" in card
  settings = json.loads((output / "config_sentence_transformers.json").read_text())
  assert settings["matryoshka_dims"] == list(MATRYOSHKA_DIMS) and settings["prompts"] == PROMPTS
  assert json.loads((output / "sentence_bert_config.json").read_text()) == {
      "max_seq_length": 32, "do_lower_case": False}


def test_retrieval_of_a_run_puts_its_prompts_before_queries_and_documents(
    contrastive_run, tmp_path):
  import test_retrieval  # pylint: disable=g-import-not-at-top
  data = test_retrieval.write_beir(tmp_path / "beir", {
      "q1": "Who was rich?", "q2": "Who walked in the rain?"},
      [("q1", "d1", 1), ("q1", "d5", 1), ("q2", "d2", 1)])
  collection = beir.read_directory(str(data), "test")
  embedder = embed.Embedder(str(contrastive_run), normalize=True)  # as the command builds it
  ranked = retrieval.rank(embedder, collection, k=100)
  queries = embedder([PROMPTS["query"] + collection.queries[q] for q in ("q1", "q2")])
  documents = embedder([PROMPTS["document"] + text for text in collection.corpus.values()])
  for query, vector in zip(("q1", "q2"), queries):
    expected = dict(zip(collection.corpus, documents @ vector))
    assert ranked[query].keys() == expected.keys()
    for doc, score in ranked[query].items():
      assert score == pytest.approx(expected[doc], abs=1e-5)

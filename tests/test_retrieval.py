"""The retrieval command (encoderx/retrieval/): BEIR's layout read, and bad rows named
(encoderx/data/beir.py); nDCG@10, Recall@100 and MRR@10 from pytrec_eval against hand
computations (encoderx/evaluation/retrieval.py); faiss' exact search against numpy; the
command end to end from a tiny BERT saved as Hugging Face saves one; and the query and
document prompts of retrieval and mining against sentence-transformers' own choice."""
import json
import math
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import tiny_hf
from encoderx import embed, errors, mine, retrieval
from encoderx.data import beir
from encoderx.evaluation import retrieval as retrieval_scores

REPO = pathlib.Path(__file__).resolve().parent.parent
DOCS = {"d1": ("Emma", "Emma Woodhouse was handsome, clever and rich."),
        "d2": ("", "Anne walked to Bath in the rain."),
        "d3": ("Persuasion", "Captain Wentworth wrote a letter."),
        "d4": ("", "The ball at Netherfield was crowded."),
        "d5": ("", "Mr. Darcy was proud and rich.")}


def write_beir(root: pathlib.Path, queries: dict[str, str], qrels: list[tuple],
               docs=DOCS, split: str = "test") -> pathlib.Path:
  """A BEIR directory under root: corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv."""
  (root / "qrels").mkdir(parents=True, exist_ok=True)
  (root / "corpus.jsonl").write_text("".join(
      json.dumps({"_id": i, "title": title, "text": text}) + "\n"
      for i, (title, text) in docs.items()), encoding="utf-8")
  (root / "queries.jsonl").write_text("".join(
      json.dumps({"_id": i, "text": text}) + "\n" for i, text in queries.items()),
      encoding="utf-8")
  (root / "qrels" / f"{split}.tsv").write_text(
      "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t{s}\n" for q, d, s in qrels),
      encoding="utf-8")
  return root


# --- reading ---------------------------------------------------------------------------
def test_the_layout_reads_to_texts_and_judgements(tmp_path):
  root = write_beir(tmp_path, {"q1": "Who was rich?", "q2": "Who walked?", "q3": "unjudged"},
                    [("q1", "d1", 2), ("q1", "d5", 1), ("q2", "d2", 1), ("q2", "d4", 0)])
  collection = beir.read_directory(str(root))
  # The title joined before the text, as BEIR embeds a document; an empty one dropped.
  assert collection.corpus["d1"] == "Emma Emma Woodhouse was handsome, clever and rich."
  assert collection.corpus["d2"] == "Anne walked to Bath in the rain."
  assert collection.queries == {"q1": "Who was rich?", "q2": "Who walked?"}  # judged only
  assert collection.qrels == {"q1": {"d1": 2, "d5": 1}, "q2": {"d2": 1, "d4": 0}}


@pytest.mark.parametrize("where, content, message", [
    ("corpus.jsonl", '{"_id": "d1", "text": "a"}\n{"_id": "d2", "text": \n',
     "corpus.jsonl' line 2: not JSON"),
    ("corpus.jsonl", '{"_id": "d1", "text": "a"}\n["d2", "b"]\n',
     "corpus.jsonl' line 2: not a JSON object"),
    ("queries.jsonl", '{"_id": "q1", "text": "a"}\n{"text": "b"}\n',
     "queries.jsonl' line 2 lacks _id"),
    ("corpus.jsonl", '{"_id": "d1", "text": "a"}\n\n{"_id": "d1", "text": "b"}\n',
     "corpus.jsonl' line 3: _id 'd1' is that of line 1 too"),
    ("qrels/test.tsv", "query-id\tcorpus-id\tscore\nq1\td1\t1\nq1 d2 1\n",
     "test.tsv' line 3 has 1 fields; a judgement has 3"),
    ("qrels/test.tsv", "query-id\tcorpus-id\tscore\nq1\td1\thigh\n",
     "test.tsv' line 2: score 'high' is not an integer"),
    ("qrels/test.tsv", "query-id\tcorpus-id\tscore\nq1\td1\t1\nq9\td1\t1\n",
     "test.tsv' line 3: query-id 'q9' is not in queries.jsonl"),
    ("qrels/test.tsv", "query-id\tcorpus-id\tscore\nq1\td9\t1\n",
     "test.tsv' line 2: corpus-id 'd9' is not in corpus.jsonl"),
    ("qrels/test.tsv", "query-id\tcorpus-id\tscore\nq1\td1\t0\n",
     "test.tsv' judges no document relevant"),
])
def test_a_bad_row_is_named_by_file_and_line(tmp_path, where, content, message):
  root = write_beir(tmp_path, {"q1": "Who was rich?"}, [("q1", "d1", 1)])
  (root / where).write_text(content, encoding="utf-8")
  with pytest.raises(errors.UserError) as raised:  # RetrievalDataError, LabelledDataError
    beir.read_directory(str(root))
  assert message in str(raised.value) and "\n" not in str(raised.value)


def test_a_missing_file_or_split_is_named(tmp_path):
  root = write_beir(tmp_path, {"q1": "Who was rich?"}, [("q1", "d1", 1)], split="dev")
  with pytest.raises(beir.RetrievalDataError, match=r"split 'test' is not there "
                     r"\(splits: dev\)"):
    beir.read_directory(str(root))
  (root / "corpus.jsonl").unlink()
  with pytest.raises(beir.RetrievalDataError, match=r"no '.*corpus.jsonl'"):
    beir.read_directory(str(root), "dev")


# --- scores ----------------------------------------------------------------------------
def test_scores_are_the_hand_computed_ones():
  qrels = {"q1": {"d1": 2, "d4": 1, "d9": 0},  # graded
           "q2": {"d11": 1},                     # found at rank 11
           "q3": {"d6": 1, "d7": 1}}             # one of two found, first
  ranked = [f"d{i}" for i in range(12)]          # d0 .. d11, best first
  run = {"q1": {"d2": 0.9, "d1": 0.8, "d3": 0.7, "d4": 0.6},
         "q2": {doc: 1.0 - 0.01 * i for i, doc in enumerate(ranked)},
         "q3": {"d6": 0.5, "d8": 0.4}}
  # trec_eval's nDCG: gain = relevance, discount log2(rank + 1).
  ndcg_q1 = (2 / math.log2(3) + 1 / math.log2(5)) / (2 + 1 / math.log2(3))
  ndcg_q3 = 1 / (1 + 1 / math.log2(3))
  expected = {"ndcg@10": (ndcg_q1 + 0 + ndcg_q3) / 3,      # q2's document is past 10
              "recall@100": (1 + 1 + 0.5) / 3,
              "mrr@10": (1 / 2 + 0 + 1) / 3}               # q2: rank 11 counts 0 at 10
  got = retrieval_scores.scores(qrels, run)
  assert got.keys() == expected.keys()
  for name, value in expected.items():
    assert got[name] == pytest.approx(value, abs=1e-9), name
  # A judged query the run lacks scores 0 and counts in the mean.
  with_missing = retrieval_scores.scores({**qrels, "q4": {"d1": 1}}, run)
  assert with_missing["mrr@10"] == pytest.approx(expected["mrr@10"] * 3 / 4)


def test_the_cut_follows_trec_evals_order():
  # Ties by document id, descending, as trec_eval orders them.
  run = {"q": {"a": 0.5, "c": 0.5, "b": 0.9, "d": 0.1}}
  assert list(retrieval_scores.top(run, 3)["q"]) == ["b", "c", "a"]


def test_faiss_finds_numpys_exact_top_k():
  generator = np.random.default_rng(0)
  corpus = generator.normal(size=[300, 16]).astype(np.float32)
  queries = generator.normal(size=[7, 16]).astype(np.float32)
  found_scores, rows = retrieval.search(queries, corpus, k=20)
  products = queries @ corpus.T
  np.testing.assert_array_equal(rows, np.argsort(-products, axis=1)[:, :20])
  np.testing.assert_allclose(found_scores, np.take_along_axis(products, rows, 1), atol=1e-5)
  assert retrieval.search(queries, corpus[:5], k=20)[1].shape == (7, 5)  # k' = corpus


# --- the command -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
  """A tiny BERT as Hugging Face saves one (random weights, the bundled vocabulary)."""
  pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  return tiny_hf.save_tiny_bert(tmp_path_factory.mktemp("hf"), transformers.BertModel)


def test_the_command_scores_a_tiny_bert_end_to_end(tiny_bert, tmp_path):
  # Each query is a copy of its relevant document's text: cosine 1, ranked first, so
  # every score is 1; q3's second relevant document is found in the top 100 too.
  queries = {f"q{i}": f"{title} {text}".strip()
             for i, (title, text) in enumerate(DOCS.values(), start=1)}
  root = write_beir(tmp_path / "beir", queries,
                    [(f"q{i}", f"d{i}", 1) for i in range(1, 6)] + [("q3", "d5", 1)])
  output = tmp_path / "scores.json"
  completed = subprocess.run(
      [sys.executable, "-m", "encoderx.retrieval", f"--init_from={tiny_bert}",
       f"--data={root}", f"--output={output}", "--batch_size=2", "--max_length=32"],
      capture_output=True, text=True, check=False, cwd=REPO)
  assert completed.returncode == 0, completed.stderr[-2000:]
  written = json.loads(output.read_text())
  assert json.loads(completed.stdout) == written
  assert (written["queries"], written["corpus"], written["k"]) == (5, 5, 100)
  assert written["recall@100"] == 1.0
  # q3's two relevant documents: its copy first, d5 somewhere in the five.
  assert written["mrr@10"] == pytest.approx(1.0)
  assert 0.9 < written["ndcg@10"] <= 1.0
  # The library call gives the same.
  embedder = embed.Embedder(tiny_bert, pooling="mean", normalize=True, max_length=32,
                            batch_size=2)
  library = retrieval.evaluate(embedder, beir.read_directory(str(root)))
  assert {name: written[name] for name in library} == pytest.approx(library, abs=1e-6)

  (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\n")
  bad = subprocess.run(
      [sys.executable, "-m", "encoderx.retrieval", f"--init_from={tiny_bert}",
       f"--data={root}", f"--output={tmp_path / 'x.json'}"],
      capture_output=True, text=True, check=False, cwd=REPO)
  assert bad.returncode == 2
  assert bad.stderr.strip().splitlines()[-1] == (
      f"encoderx: error: '{root}/qrels/test.tsv' line 2 has 2 fields; a judgement has 3: "
      "query-id, corpus-id, score.")
  assert not (tmp_path / "x.json").exists()


def test_the_stsb_set_takes_distinct_sentences_and_pairs_scored_4_or_more(tmp_path):
  from encoderx.tools.parity import retrieval_compare  # pylint: disable=g-import-not-at-top
  pairs = tmp_path / "dev.tsv"
  pairs.write_text("score\ttext_a\ttext_b\n5.0\tA man sings.\tA man is singing.\n"
                   "4.0\tA cat sleeps.\tThe cat is asleep.\n"
                   "3.8\tA man sings.\tA woman sings.\n"
                   "4.4\tA man sings.\tA woman sings.\n"     # a second relevant document
                   "0.5\tA dog runs.\tA man is singing.\n",  # not a query, its doc kept once
                   encoding="utf-8")
  collection = retrieval_compare.write_stsb_set(str(pairs), str(tmp_path / "set"))
  assert collection.corpus == {"d0": "A man is singing.", "d1": "The cat is asleep.",
                               "d2": "A woman sings."}
  assert collection.queries == {"q0": "A man sings.", "q1": "A cat sleeps."}
  assert collection.qrels == {"q0": {"d0": 1, "d2": 1}, "q1": {"d1": 1}}
  assert beir.read_directory(str(tmp_path / "set")) == collection


# --- reranking -------------------------------------------------------------------------
def test_a_cross_encoder_reorders_the_top_and_both_stages_are_scored(tiny_bert,
                                                                     tiny_cross_encoder,
                                                                     tmp_path):
  torch = pytest.importorskip("torch")
  from sentence_transformers.cross_encoder import CrossEncoder  # pylint: disable=g-import-not-at-top
  queries = {"q1": "Who was rich?", "q2": "Who walked in the rain?", "q3": "A letter"}
  root = write_beir(tmp_path / "beir", queries,
                    [("q1", "d1", 1), ("q1", "d5", 1), ("q2", "d2", 1), ("q3", "d3", 1)])
  collection = beir.read_directory(str(root))
  embedder = embed.Embedder(tiny_bert, pooling="mean", normalize=True, max_length=32,
                            batch_size=2)
  first = retrieval.rank(embedder, collection, 100)
  reranker = retrieval.Reranker(tiny_cross_encoder, max_length=32, batch_size=2)
  reranked = retrieval.rerank(reranker, collection, first, top=3)
  # sentence-transformers' CrossEncoder scores the same pairs (its logits: Identity).
  cross_encoder = CrossEncoder(tiny_cross_encoder.removeprefix("hf:"), max_length=32)
  moved = 0
  for query, docs in first.items():
    first_order = list(retrieval_scores.top({query: docs}, 5)[query])
    pairs = [(queries[query], collection.corpus[doc]) for doc in first_order[:3]]
    expected = cross_encoder.predict(pairs, activation_fn=torch.nn.Identity())
    np.testing.assert_allclose(reranker(pairs), expected, atol=1e-5)
    order = list(retrieval_scores.top({query: reranked[query]}, 5)[query])
    assert order[:3] == [first_order[i] for i in np.argsort(-expected, kind="stable")]
    assert order[3:] == first_order[3:]  # past the top: the first stage's order
    moved += order != first_order
  assert moved  # the reranker changed some query's order
  # The command reports both stages: the first as before, the second under "reranked".
  output = tmp_path / "scores.json"
  completed = subprocess.run(
      [sys.executable, "-m", "encoderx.retrieval", f"--init_from={tiny_bert}",
       f"--data={root}", f"--output={output}", "--batch_size=2", "--max_length=32",
       f"--rerank_with={tiny_cross_encoder}", "--rerank_top=3"],
      capture_output=True, text=True, check=False, cwd=REPO)
  assert completed.returncode == 0, completed.stderr[-2000:]
  written = json.loads(output.read_text())
  stages = {"first": retrieval_scores.scores(collection.qrels, first),
            "reranked": retrieval_scores.scores(collection.qrels, reranked)}
  assert {name: written[name] for name in stages["first"]} == pytest.approx(
      stages["first"], abs=1e-6)
  assert (written["reranked"].pop("top"), written["reranked"].pop("rerank_with")) == (
      3, tiny_cross_encoder)
  assert written["reranked"] == pytest.approx(stages["reranked"], abs=1e-6)


def test_a_reranker_needs_a_one_score_head_and_a_top_within_k(tiny_bert, tmp_path):
  with pytest.raises(errors.UserError, match="no one-score head"):
    retrieval.Reranker(tiny_bert)  # a BertModel: no classifier
  root = write_beir(tmp_path / "beir", {"q1": "Who was rich?"}, [("q1", "d1", 1)])
  bad = subprocess.run(
      [sys.executable, "-m", "encoderx.retrieval", f"--init_from={tiny_bert}",
       f"--data={root}", f"--rerank_with={tiny_bert}", "--rerank_top=101"],
      capture_output=True, text=True, check=False, cwd=REPO)
  assert bad.returncode == 2
  assert bad.stderr.strip().splitlines()[-1].startswith(
      "encoderx: error: flag --rerank_top: must be in [1, --k=100]")


# --- the prompts, as sentence-transformers chooses them -------------------------------
@pytest.mark.parametrize("saved", [
    {"prompts": {"query": "query: ", "document": "passage: "}},
    {"prompts": {"title": "title: "}, "default_prompt_name": "title"},
    {"prompts": {"query": "query: ", "passage": "passage: "}, "default_prompt_name": "passage"},
    {}], ids=["query_and_document", "only_a_default", "passage_by_another_name", "none"])
def test_retrieval_and_mining_prompt_as_encode_query_and_encode_document(
    minilm_directory, tmp_path, saved):
  """all-MiniLM-L6-v2 with `saved` as its config_sentence_transformers.json: ranking
  embeds queries and documents as sentence-transformers' encode_query / encode_document
  do (the model's "query" / "document" prompt, else none: never its default prompt, nor
  "passage"), and mining puts the same prompts before anchors and corpus texts."""
  sentence_transformers = pytest.importorskip("sentence_transformers")
  pytest.importorskip("faiss")
  model_directory = tmp_path / "model"
  model_directory.mkdir()
  for name in os.listdir(minilm_directory):
    if name != "config_sentence_transformers.json":
      os.symlink(os.path.join(minilm_directory, name), model_directory / name)
  (model_directory / "config_sentence_transformers.json").write_text(
      json.dumps(saved), encoding="utf-8")
  reference = sentence_transformers.SentenceTransformer(str(model_directory), device="cpu")
  collection = beir.read_directory(str(write_beir(
      tmp_path / "beir", {"q1": "Who was rich?", "q2": "Where did Anne walk?"},
      [("q1", "d1", 1), ("q2", "d2", 1)])))
  embedder = embed.Embedder(f"hf:{model_directory}", normalize=True)
  embedded = []
  def recording(*args, **kwargs):
    embedded.append(embedder(*args, **kwargs))
    return embedded[-1]
  recording.prompts = embedder.prompts
  retrieval.rank(recording, collection, k=5)
  queries, documents = list(collection.queries.values()), list(collection.corpus.values())
  np.testing.assert_allclose(embedded[0], reference.encode_query(
      queries, normalize_embeddings=True), atol=1e-5)
  np.testing.assert_allclose(embedded[1], reference.encode_document(
      documents, normalize_embeddings=True), atol=1e-5)
  query_prompt, corpus_prompt = mine.MiningOptions().prompts(embedder.prompts)
  np.testing.assert_allclose(reference.encode(queries, prompt=query_prompt),
                             reference.encode_query(queries), atol=1e-6)
  np.testing.assert_allclose(reference.encode(documents, prompt=corpus_prompt),
                             reference.encode_document(documents), atol=1e-6)

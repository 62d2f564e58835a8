"""Hard-negative mining (encoderx.mine): the same negatives, in the same order, as
sentence-transformers' mine_hard_negatives on all-MiniLM-L6-v2 and STS-B pairs; random
draws from the same candidates; bad options, columns and outputs stop before any model
is loaded; the model's prompts are chosen as sentence-transformers chooses them, by name
or as text; the command writes the library's rows and never replaces a file unasked."""
import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest

from encoderx import embed, mine
from encoderx.data import labelled
import mining_reference  # pylint: disable=g-bad-import-order  (tests/ is on sys.path)
from finetune_cases import CORPORA  # pylint: disable=g-bad-import-order

STSB = CORPORA / "stsb" / "train.tsv"


@pytest.fixture(scope="module")
def pairs():
  """120 STS-B pairs scored >= 4 (a few anchors repeat, with two positives)."""
  if not STSB.is_file():
    pytest.skip(f"{STSB} is absent")
  rows = labelled.read_rows(str(STSB), ["score", "text_a", "text_b"])
  return [(r["text_a"], r["text_b"]) for _, r in rows if float(r["score"]) >= 4][:120]


@pytest.fixture(scope="module")
def models(minilm_directory, tmp_path_factory):
  """(sentence-transformers' MiniLM, encoderx's embedding function, the embedding cache
  folder of sentence-transformers): each side embeds the texts once for every test."""
  sentence_transformers = pytest.importorskip("sentence_transformers")
  pytest.importorskip("faiss")
  reference = sentence_transformers.SentenceTransformer(str(minilm_directory), device="cpu")
  embedder, seen = embed.Embedder(f"hf:{minilm_directory}", normalize=True), {}

  def embed_texts(texts, show_progress=False, description="", prompt=None):
    key = (prompt, tuple(texts))
    if key not in seen:
      seen[key] = embedder(texts, show_progress, description, prompt=prompt)
    return seen[key]
  return reference, embed_texts, str(tmp_path_factory.mktemp("st_cache"))


def _columns(mined):
  return {column: [row[column] for row in mined.rows] for column in mined.columns}


@pytest.mark.parametrize("options", [
    dict(range_max=20, absolute_margin=0.02, max_score=0.75, num_negatives=3),
    dict(range_max=8, relative_margin=0.1, max_score=0.6, num_negatives=3,
         output_format="n-tuple"),
    dict(range_min=2, range_max=10, min_score=0.3, num_negatives=2,
         output_format="labeled-pair"),
    dict(num_negatives=4, include_positives=True, output_format="n-tuple"),
    dict(num_negatives=2, absolute_margin=0.0, corpus=True),
], ids=["triplet-absolute-margin", "n-tuple-relative-margin", "labeled-pair-range-min",
        "include-positives", "separate-corpus"])
def test_the_negatives_are_sentence_transformers_ones(models, pairs, monkeypatch, options):
  reference_model, embed_texts, cache = models
  options = dict(options)
  if options.pop("corpus", False):  # STS-B dev sentences as further candidates
    rows = labelled.read_rows(str(STSB.with_name("dev.tsv")), ["text_a", "text_b"])
    options["corpus"] = [row["text_b"] for _, row in rows[:150]]
  reference = mining_reference.mine_hard_negatives(
      monkeypatch, pairs, reference_model, use_faiss=True, cache_folder=cache,
      output_scores=options.get("output_format") == "n-tuple", **options)
  corpus = options.pop("corpus", None)
  mined = mine.mine(pairs, embed_texts, mine.MiningOptions(**options), corpus)
  scores = reference.pop("scores", None)
  assert _columns(mined) == reference
  assert set(mined.skipped) == {k for k in options if "margin" in k or "score" in k}
  if scores is not None:  # n-tuple: [positive, negative_1..k] per row, the same scores
    if "max_score" in options:  # rows without 3 negatives left are dropped
      assert 0 < mined.missing < mined.possible
    np.testing.assert_allclose(np.asarray(scores)[:, 1:].ravel(), mined.negative_scores,
                               atol=1e-4)
  if options.get("include_positives"):  # the positive leads its candidates
    assert sum(row["negative_1"] == row["positive"] for row in mined.rows) > len(pairs) / 2


def test_random_draws_are_sentence_transformers_draws(models, pairs, monkeypatch):
  reference_model, embed_texts, cache = models
  options = dict(range_min=1, range_max=12, num_negatives=2, sampling_strategy="random")
  random.seed(5)  # what mine_hard_negatives draws with; encoderx draws with its own seed
  reference = mining_reference.mine_hard_negatives(
      monkeypatch, pairs, reference_model, use_faiss=True, cache_folder=cache, **options)
  drawn = mine.mine(pairs, embed_texts, mine.MiningOptions(seed=5, **options))
  assert _columns(drawn) == reference
  # The draws come from the candidates "top" ranks (ranks 1..11 here), not only its first.
  top = mine.mine(pairs, embed_texts, mine.MiningOptions(
      **{**options, "sampling_strategy": "top", "num_negatives": 11}))
  candidates = {(r["anchor"], r["negative"]) for r in top.rows}
  assert {(r["anchor"], r["negative"]) for r in drawn.rows} <= candidates
  first = mine.mine(pairs, embed_texts, mine.MiningOptions(
      **{**options, "sampling_strategy": "top"}))
  assert _columns(drawn) != _columns(first)


@pytest.mark.parametrize("options, argument, words", [
    (dict(absolute_margin=-0.1), "absolute_margin", "must be >= 0"),
    (dict(relative_margin=1.0), "relative_margin", "in [0, 1)"),
    (dict(range_min=5, range_max=5), "range_min", "smaller than range_max"),
    (dict(num_negatives=0), "num_negatives", "at least 1"),
    (dict(range_max=4, num_negatives=5), "num_negatives", "only 4 candidates"),
    (dict(sampling_strategy="hardest"), "sampling_strategy", "not one of"),
    (dict(include_positives=True), "include_positives", "n-tuple"),
    (dict(query_prompt="query: ", query_prompt_name="query"), "query_prompt_name",
     "both set the prompt before each anchor"),
    (dict(corpus_prompt="", corpus_prompt_name="document"), "corpus_prompt_name",
     "both set the prompt before each candidate"),
])
def test_bad_options_are_refused_when_made(options, argument, words):
  with pytest.raises(mine.MiningError) as caught:
    mine.MiningOptions(**options)
  assert caught.value.argument == argument and words in str(caught.value)


PROMPTS = {"query": "query: ", "document": "passage: ", "title": "title: "}


@pytest.fixture(scope="module")
def prompted_minilm(minilm_directory, tmp_path_factory):
  """all-MiniLM-L6-v2 keeping PROMPTS, "title" its default prompt."""
  directory = tmp_path_factory.mktemp("prompted")
  for name in os.listdir(minilm_directory):
    if name != "config_sentence_transformers.json":
      os.symlink(os.path.join(minilm_directory, name), directory / name)
  (directory / "config_sentence_transformers.json").write_text(
      json.dumps({"prompts": PROMPTS, "default_prompt_name": "title"}), encoding="utf-8")
  return directory


def test_prompts_are_chosen_as_sentence_transformers_chooses_them(
    models, prompted_minilm, pairs, monkeypatch):
  """No prompt option: the model's query and document prompts, not its default one;
  a name: the model's prompt of that name, the same rows as that prompt given as text."""
  sentence_transformers = pytest.importorskip("sentence_transformers")
  reference_model = sentence_transformers.SentenceTransformer(str(prompted_minilm),
                                                              device="cpu")
  embedder = embed.Embedder(f"hf:{prompted_minilm}", normalize=True)
  options = dict(range_max=12, num_negatives=2)
  named = dict(query_prompt_name="title", corpus_prompt_name="query")

  def ours(**prompts):
    return _columns(mine.mine(pairs, embedder, mine.MiningOptions(**options, **prompts)))
  def reference(**prompts):
    return mining_reference.mine_hard_negatives(monkeypatch, pairs, reference_model,
                                                use_faiss=True, **options, **prompts)
  by_default, by_name = ours(), ours(**named)
  assert by_default == reference() and by_name == reference(**named)
  assert by_name == ours(query_prompt="title: ", corpus_prompt="query: ")
  # Each choice changes the negatives: none of them is a prompt left out.
  _, plain, _ = models
  without = _columns(mine.mine(pairs, plain, mine.MiningOptions(**options)))
  assert len({json.dumps(rows) for rows in (without, by_default, by_name)}) == 3


def test_the_command_refuses_a_prompt_name_the_model_lacks_in_one_line_writing_nothing(
    prompted_minilm, tmp_path):
  """Once the model is loaded: before anything is embedded or written."""
  source, output = tmp_path / "pairs.tsv", tmp_path / "mined.jsonl"
  source.write_text("anchor\tpositive\nA cat.\tA kitten.\nA dog.\tA puppy.\n",
                    encoding="utf-8")
  completed = _run(f"--init_from=hf:{prompted_minilm}", f"--input={source}",
                   f"--output={output}", "--query_prompt_name=title",
                   "--corpus_prompt_name=passage", "--num_negatives=1")
  assert completed.returncode == 2, completed.stderr[-2000:]
  assert completed.stderr.strip().splitlines()[-1] == (
      "encoderx: error: --corpus_prompt_name: prompt 'passage' is not one of the model's: "
      "query, document, title.")
  assert sorted(tmp_path.iterdir()) == [source]


def test_bad_files_are_refused_naming_them(tmp_path):
  source = tmp_path / "pairs.tsv"
  source.write_text("query\tpositive\nA cat.\tA kitten.\n", encoding="utf-8")
  with pytest.raises(labelled.LabelledDataError, match="no column 'anchor'"):
    mine.read_pairs(str(source))
  assert mine.read_pairs(str(source), anchor_column="query") == [("A cat.", "A kitten.")]
  empty = tmp_path / "empty.jsonl"
  empty.write_text('{"anchor": "A cat.", "positive": " "}\n', encoding="utf-8")
  with pytest.raises(mine.MiningError, match="line 1: positive is empty"):
    mine.read_pairs(str(empty))
  options = mine.MiningOptions()
  with pytest.raises(mine.MiningError, match="extension"):
    mine.check_output(str(tmp_path / "out.parquet"), False, options)
  with pytest.raises(mine.MiningError, match="exists") as caught:
    mine.check_output(str(source), False, options)
  assert caught.value.remedy == "overwrite"
  mine.check_output(str(source), True, options)
  with pytest.raises(mine.MiningError, match=".jsonl"):
    mine.check_output(str(tmp_path / "o.tsv"), False,
                      mine.MiningOptions(output_format="labeled-list"))


def _run(*arguments):
  return subprocess.run([sys.executable, "-m", "encoderx.mine", *arguments],
                        capture_output=True, text=True, check=False)


def test_the_command_writes_the_library_rows_and_keeps_existing_files(
    minilm_directory, models, pairs, tmp_path):
  _, embed_texts, _ = models
  source, output = tmp_path / "pairs.jsonl", tmp_path / "mined.jsonl"
  source.write_text("".join(json.dumps({"q": a, "p": p}) + "\n" for a, p in pairs[:40]),
                    encoding="utf-8")
  command = [f"--init_from=hf:{minilm_directory}", f"--input={source}", f"--output={output}",
             "--anchor_column=q", "--positive_column=p", "--output_format=n-tuple",
             "--num_negatives=2", "--absolute_margin=0.05"]
  completed = _run(*command)
  assert completed.returncode == 0, completed.stderr[-2000:]
  assert "Mined 40 n-tuple rows from 40 pairs" in completed.stdout
  written = [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]
  expected = mine.mine(pairs[:40], embed_texts, mine.MiningOptions(
      num_negatives=2, absolute_margin=0.05, output_format="n-tuple"), anchor_column="q",
      positive_column="p")
  assert written == expected.rows and list(written[0]) == ["q", "p", "negative_1",
                                                            "negative_2"]

  before = output.read_bytes()
  # Refused before any model is loaded (here: a directory with none), the file untouched.
  again = _run(*command[1:], f"--init_from=hf:{tmp_path}")
  assert again.returncode == 2 and output.read_bytes() == before
  assert again.stderr.strip().splitlines()[-1] == (
      f"encoderx: error: --output: '{output}' exists; choose another output or overwrite "
      "it (--overwrite).")


def test_the_command_refuses_a_margin_out_of_range_in_one_line_writing_nothing(tmp_path):
  """Before a model is loaded (here: none where --init_from points) or a file made."""
  source, output = tmp_path / "pairs.tsv", tmp_path / "mined.jsonl"
  source.write_text("anchor\tpositive\nA cat.\tA kitten.\nA dog.\tA puppy.\n",
                    encoding="utf-8")
  completed = _run(f"--init_from=hf:{tmp_path / 'none'}", f"--input={source}",
                   f"--output={output}", "--relative_margin=1.5")
  assert completed.returncode == 2 and not output.exists()
  last = completed.stderr.strip().splitlines()[-1]
  assert last.startswith("encoderx: error: --relative_margin: relative_margin must be in "
                         "[0, 1)") and last.endswith("got 1.5."), last
  assert sorted(tmp_path.iterdir()) == [source]

"""Runs notebooks/embeddings.ipynb end to end (as tests/test_notebook.py runs the
quickstart, with its kernel helpers) at tiny sizes: from a tiny Hugging Face BERT, 2
steps of contrastive training, mining, 2 steps on the triplets, retrieval scores, the
sentence-transformers export encoding as encoderx does."""
from __future__ import annotations

import pathlib
import re

import nbclient
import nbformat
import pytest

from test_notebook import (  # pylint: disable=g-bad-import-order  (tests/ is on sys.path)
    CELL_TIMEOUT_S, cell_text, kernel_manager, tagged_cell)

NOTEBOOK = pathlib.Path(__file__).resolve().parents[1] / "notebooks" / "embeddings.ipynb"
STEPS, ROWS, QUERIES, DEV_ROWS = 2, 16, 8, 16  # two batches of 8; the dev rows hold 8 queries


def test_embeddings_notebook_runs(tmp_path):
  transformers = pytest.importorskip("transformers")
  import tiny_hf  # pylint: disable=g-import-not-at-top
  from finetune_cases import STSB  # pylint: disable=g-import-not-at-top
  if not (STSB / "train.tsv").exists():
    pytest.skip(f"the stsb corpus is not at {STSB}")
  nb = nbformat.read(NOTEBOOK, as_version=4)
  assert not any(c.outputs for c in nb.cells if c.cell_type == "code")  # committed clean
  base = tiny_hf.save_tiny_bert(tmp_path / "base", transformers.BertModel)
  temporary = tmp_path / "tmp"
  temporary.mkdir()
  env = {"EMBEDDINGS_BASE": base, "EMBEDDINGS_STSB": str(STSB),
         "EMBEDDINGS_ROWS": str(ROWS), "EMBEDDINGS_STEPS": str(STEPS),
         "EMBEDDINGS_BATCH": "8", "EMBEDDINGS_LENGTH": "32", "EMBEDDINGS_DEV_ROWS": str(DEV_ROWS),
         "EMBEDDINGS_QUERIES": str(QUERIES), "EMBEDDINGS_MARGIN": "0",
         "TF_CPP_MIN_LOG_LEVEL": "3", "TMPDIR": str(temporary),
         "IPYTHONDIR": str(tmp_path / "ipython")}
  nbclient.NotebookClient(nb, km=kernel_manager(tmp_path, env), timeout=CELL_TIMEOUT_S,
                          startup_timeout=120, allow_errors=False,
                          resources={"metadata": {"path": str(tmp_path)}}).execute()

  assert f"base {base}; {ROWS} pairs, {STEPS} steps" in cell_text(tagged_cell(nb, "parameters"))
  data = cell_text(tagged_cell(nb, "data"))
  assert f"{ROWS} training pairs, {DEV_ROWS} dev pairs; retrieval: {QUERIES} queries" in data, data
  assert str(temporary) in data  # everything is written under TMPDIR
  for tag in ("train", "retrain"):
    assert re.search(rf"{STEPS} steps, loss [\d.]+, dev Spearman -?[\d.]+",
                     cell_text(tagged_cell(nb, tag))), cell_text(tagged_cell(nb, tag))
  mined = cell_text(tagged_cell(nb, "mine"))
  assert "anchor:" in mined and "negative:" in mined, mined
  scores = re.findall(r"^\s*(\w+)\s+nDCG@10 ([\d.]+)", cell_text(tagged_cell(nb, "retrieval")),
                      re.MULTILINE)
  assert [name for name, _ in scores] == ["base", "first", "second"], scores
  assert all(0.0 <= float(score) <= 1.0 for _, score in scores)
  exported = cell_text(tagged_cell(nb, "export"))
  assert "SentenceTransformer: ['Transformer', 'Pooling', 'Normalize']" in exported, exported
  difference = float(re.search(r"encoderx vs sentence-transformers: (\S+)", exported)[1])
  assert difference <= 1e-5

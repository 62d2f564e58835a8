"""Runs notebooks/export.ipynb end to end (as tests/test_notebook.py runs the quickstart,
with its kernel helpers): pretrains 4 steps, exports, loads with transformers."""
from __future__ import annotations

import pathlib
import re

import nbclient
import nbformat

import test_notebook  # pylint: disable=g-bad-import-order  (tests/ is on sys.path)
from test_notebook import CELL_TIMEOUT_S, cell_text, kernel_manager, tagged_cell

NOTEBOOK = pathlib.Path(__file__).resolve().parents[1] / "notebooks" / "export.ipynb"
STEPS = test_notebook.STEPS  # the quickstart's: the same compiled programs


def test_export_notebook_runs(tmp_path):
  nb = nbformat.read(NOTEBOOK, as_version=4)
  assert not any(c.outputs for c in nb.cells if c.cell_type == "code")  # committed clean
  temporary = tmp_path / "tmp"
  temporary.mkdir()
  env = {"EXPORT_STEPS": str(STEPS), "TF_CPP_MIN_LOG_LEVEL": "3", "TMPDIR": str(temporary),
         "IPYTHONDIR": str(tmp_path / "ipython")}
  nbclient.NotebookClient(nb, km=kernel_manager(tmp_path, env), timeout=CELL_TIMEOUT_S,
                          startup_timeout=120, allow_errors=False,
                          resources={"metadata": {"path": str(tmp_path)}}).execute()

  assert f"trained {STEPS} steps in {temporary}" in cell_text(tagged_cell(nb, "train"))
  assert "wrote BertForPreTraining (bert) to" in cell_text(tagged_cell(nb, "export"))
  loaded = cell_text(tagged_cell(nb, "load"))
  assert "AutoModel: BertModel, tokenizer: BertTokenizer" in loaded, loaded
  assert "tokenizer ids equal encoderx's: True" in loaded, loaded
  difference = float(re.search(r"max abs difference encoderx vs transformers: (\S+)",
                               loaded)[1])
  assert difference <= 1e-4
  guesses = re.findall(r"^\s*\S+\s+[01]\.\d{3}$", cell_text(tagged_cell(nb, "fill")), re.MULTILINE)
  assert len(guesses) == 3, cell_text(tagged_cell(nb, "fill"))
  assert "arrays, e.g. encoder_model/" in cell_text(tagged_cell(nb, "npz"))

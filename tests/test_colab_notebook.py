"""notebooks/colab_accelerator.ipynb, without a TPU or GPU: it cannot run its purpose here,
and running it on CPU would repeat test_notebook.py's end-to-end run (minutes of
compilation). Checked instead: it is a clean notebook whose every cell is valid (IPython)
Python, the install cell asks for the accelerator's JAX build at the pinned version, and
its config cell, run here, gives a valid config of the requested length."""
import os
import re

import nbformat
from IPython.core.inputtransformer2 import TransformerManager

from conftest import REPO
from encoderx import config as config_lib

NOTEBOOK = REPO / "notebooks" / "colab_accelerator.ipynb"


def _cells():
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  nbformat.validate(notebook)
  return {tag: cell for cell in notebook.cells if cell.cell_type == "code"
          for tag in cell.metadata.get("tags", [])}, notebook


def test_the_notebook_is_clean_valid_python():
  tagged, notebook = _cells()
  assert set(tagged) == {"install", "devices", "config", "train"}
  for cell in notebook.cells:
    if cell.cell_type == "code":
      assert not cell.outputs and cell.execution_count is None
      compile(TransformerManager().transform_cell(cell.source), cell.id, "exec")


def test_it_installs_the_jax_build_of_the_pinned_version():
  install = _cells()[0]["install"].source
  setup = (REPO / "setup.py").read_text()
  version = re.search(r'"jax==([\d.]+)"', setup).group(1)
  assert f'"jax[tpu]=={version}"' in install and f'"jax[cuda12]=={version}"' in install
  assert '%pip install -q "encoderx @ git+{ENCODERX_REPO}@{ENCODERX_REF}"' in install


def test_its_config_cell_gives_the_tiny_config(monkeypatch):
  monkeypatch.setenv("NOTEBOOK_STEPS", "7")
  scope = {}
  exec(_cells()[0]["config"].source, scope)  # pylint: disable=exec-used
  config = scope["config"]
  assert config.train.steps == 7 and config.optimizer.warmup_steps == 6
  assert config.model.hidden_size == 128 and config.model.num_layers == 2
  config_lib.validate(config)

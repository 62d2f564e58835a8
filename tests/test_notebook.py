"""Runs notebooks/quickstart.ipynb end to end and checks what it shows.

The notebook runs in an ipykernel of this very interpreter (a kernel spec written to a
temporary directory, so no installed `python3` spec can point elsewhere), with
QUICKSTART_STEPS=4 and TMPDIR inside pytest's tmp_path: the work directory the notebook
creates with tempfile.mkdtemp() is removed with it and nothing is written to the repository.
Takes a couple of minutes on two CPU cores (mostly compilation). 4 steps, as
tests/test_export_notebook.py trains the same bert:tiny config: the same training and
evaluation programs, which the second of the two loads from the persistent compilation
cache (the learning-rate schedule, and so each program, depends on the step count).
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import sys

import nbclient
import nbformat
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager

NOTEBOOK = pathlib.Path(__file__).resolve().parents[1] / "notebooks" / "quickstart.ipynb"
KERNEL_NAME = "encoderx-notebook-test"
STEPS = 4  # tests/test_export_notebook.py's (see above)
CELL_TIMEOUT_S = 600

# Appended to the in-memory copy of the notebook: where the kernel's Python lives.
PROBE = ("import json, os, sys\n"
         "print(json.dumps({'prefix': sys.prefix, 'executable': sys.executable,\n"
         "                  'steps': os.environ.get('QUICKSTART_STEPS')}))")


def kernel_manager(tmp_path: pathlib.Path, env: dict[str, str]) -> AsyncKernelManager:
  """A kernel manager whose only kernel spec runs `sys.executable` with `env` added."""
  kernels = tmp_path / "kernels"
  (kernels / KERNEL_NAME).mkdir(parents=True)
  spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
          "display_name": "encoderx test kernel", "language": "python", "env": env}
  (kernels / KERNEL_NAME / "kernel.json").write_text(json.dumps(spec))
  specs = KernelSpecManager(kernel_dirs=[str(kernels)], ensure_native_kernel=False)
  return AsyncKernelManager(kernel_name=KERNEL_NAME, kernel_spec_manager=specs,
                            connection_file=str(tmp_path / "connection.json"))


def tagged_cell(nb, tag: str):
  tagged = [c for c in nb.cells if tag in c.get("metadata", {}).get("tags", [])]
  assert len(tagged) == 1, f"expected one cell tagged {tag!r}, found {len(tagged)}"
  return tagged[0]


def cell_text(cell) -> str:
  """What a cell printed, plus the text of its results and displays (such as a progress
  bar's text when ipywidgets renders it), each part on lines of its own."""
  parts = []
  for output in cell.outputs:
    if output.output_type == "stream" and output.name == "stdout":
      parts.append(output.text)
    elif output.output_type in ("execute_result", "display_data"):
      parts.append(output.get("data", {}).get("text/plain", ""))
  return "\n".join(parts)


def test_quickstart_notebook_runs(tmp_path):
  nb = nbformat.read(NOTEBOOK, as_version=4)

  # The committed notebook carries no outputs.
  for cell in nb.cells:
    if cell.cell_type == "code":
      assert not cell.outputs and cell.execution_count is None, cell.source[:60]

  nb.cells.append(nbformat.v4.new_code_cell(PROBE))
  temporary = tmp_path / "tmp"
  temporary.mkdir()
  env = {"QUICKSTART_STEPS": str(STEPS), "TF_CPP_MIN_LOG_LEVEL": "3",
         "TMPDIR": str(temporary), "IPYTHONDIR": str(tmp_path / "ipython")}
  client = nbclient.NotebookClient(
      nb, km=kernel_manager(tmp_path, env), timeout=CELL_TIMEOUT_S,
      startup_timeout=120, allow_errors=False,
      resources={"metadata": {"path": str(tmp_path)}})
  client.execute()  # raises CellExecutionError if a cell raises

  errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
            if o.output_type == "error"]
  assert not errors, errors

  # The kernel was this interpreter, with the environment the test gave it.
  probe = json.loads(cell_text(nb.cells[-1]).strip().splitlines()[-1])
  assert probe == {"prefix": sys.prefix, "executable": sys.executable,
                   "steps": str(STEPS)}

  # encoderx is importable here, so the install cell does nothing (no pip run).
  assert tagged_cell(nb, "install").outputs == []
  assert f"training: {STEPS} steps" in cell_text(tagged_cell(nb, "config"))

  train = cell_text(tagged_cell(nb, "train"))
  assert f"held-out evaluation after {STEPS} steps" in train
  metrics = dict(re.findall(r"^\s+(\w+)\s+(-?[\d.]+|nan|inf)\s*$", train, re.MULTILINE))
  assert {"mlm_accuracy", "mlm_loss", "nsp_accuracy", "nsp_loss"} <= set(metrics), train
  assert 0.0 <= float(metrics["mlm_accuracy"]) <= 1.0
  # The run wrote its checkpoints and metrics to a fresh directory under TMPDIR.
  workdir = pathlib.Path(re.search(r"^work directory: (.+)$", train, re.MULTILINE)[1])
  assert workdir.parent == temporary
  assert (workdir / "tensorboard").is_dir() and (workdir / "checkpoints").is_dir()

  inspected = cell_text(tagged_cell(nb, "inspect"))
  assert "[MASK]" in inspected and "predict" in inspected, inspected
  assert "[CLS]" in inspected and "[SEP]" in inspected

  plot = tagged_cell(nb, "plot")
  assert any(o.output_type == "display_data" and "image/png" in o.get("data", {})
             for o in plot.outputs), [o.output_type for o in plot.outputs]

  # Executing the notebook never touched the file in the repository.
  assert not any(c.outputs for c in nbformat.read(NOTEBOOK, as_version=4).cells
                 if c.cell_type == "code")

"""Modules that moved in the house's rebuild (docs/migration.md): importing or running an
old name (`python -m encoderx.bench`, `from encoderx import method`) stops with one line
naming the new one, instead of a bare "No module named". A leaf: imports nothing of
encoderx; encoderx/__init__.py installs `MovedModules`.
"""
from __future__ import annotations

import importlib.abc

# Old module -> where its contents live now.
MOVED_MODULES = {
    "encoderx.bench": "encoderx.tools.bench",
    "encoderx.bench_data": "encoderx.tools.bench_data",
    "encoderx.compare": "encoderx.tools.compare",
    "encoderx.plot": "encoderx.tools.plot",
    "encoderx.parity": "encoderx.tools.parity",
    "encoderx.flops": "encoderx.tools.flops",
    "encoderx.batch_inspector": "encoderx.tools.batch_inspector",
    "encoderx.method": "encoderx.methods.base and encoderx.methods.registry",
    "encoderx.export.hf": "encoderx.hf (engine, rules, families, one module per family)",
    "encoderx.export.hf_directory": "encoderx.hf.directory",
    "encoderx.export.tokenizer_files": "encoderx.hf.tokenizer_files",
    "encoderx.trainer": "encoderx.train.trainer",
    "encoderx.data.stream": "encoderx.data.shard_stream",
    "encoderx.data.streams": "encoderx.data.row_streams",
    "encoderx.data.preprocessors": "encoderx.data.example_builders",
    "encoderx.data.preprocessed": "encoderx.data.example_files",
}


class MovedModules(importlib.abc.MetaPathFinder):
  """Answers the old names with a ModuleNotFoundError that names the new module."""

  def find_spec(self, fullname, path, target=None):
    del path, target
    if fullname in MOVED_MODULES:
      # No `name=`: `from encoderx import method` would turn an error naming the missing
      # module itself into a bare "cannot import name".
      raise ModuleNotFoundError(f"{fullname} is now {MOVED_MODULES[fullname]} (see "
                                "docs/migration.md)")
    return None

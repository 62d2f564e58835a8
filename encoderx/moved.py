"""Modules that moved in the house's rebuild (docs/migration.md): importing or running an
old name (`python -m encoderx.bench`, `from encoderx import method`) stops with one line
naming the new one, instead of a bare "No module named". A leaf: imports nothing of
encoderx; encoderx/__init__.py installs `MovedModules`.
"""
from __future__ import annotations

import importlib.abc

# Old module -> where its contents live now.
MOVED_MODULES = {
    "encoderx.bench": "encoderx.tools.speed.bench",
    "encoderx.bench_data": "encoderx.tools.data.bench_data",
    "encoderx.compare": "encoderx.tools.quality.pretrain_compare",
    "encoderx.plot": "encoderx.tools.figures.plot",
    "encoderx.parity": "encoderx.tools.parity.step_parity",
    "encoderx.flops": "encoderx.tools.speed.flops",
    "encoderx.batch_inspector": "encoderx.tools.data.batch_inspector",
    "encoderx.method": "encoderx.methods.base and encoderx.methods.registry",
    "encoderx.export.hf": "encoderx.hf (engine, rules, families, one module per family)",
    "encoderx.export.hf_directory": "encoderx.hf.directory",
    "encoderx.export.tokenizer_files": "encoderx.hf.tokenizer_files",
    # The measuring tools, one package for what each measures (docs/design.md).
    "encoderx.tools.accelerator": "encoderx.tools.speed.accelerator",
    "encoderx.tools.batch_inspector": "encoderx.tools.data.batch_inspector",
    "encoderx.tools.bench": "encoderx.tools.speed.bench",
    "encoderx.tools.bench_data": "encoderx.tools.data.bench_data",
    "encoderx.tools.bench_models": "encoderx.tools.speed.bench_models",
    "encoderx.tools.compare": "encoderx.tools.quality.pretrain_compare",
    "encoderx.tools.costs": "encoderx.tools.speed.costs",
    "encoderx.tools.finetune_compare": "encoderx.tools.quality.finetune_compare",
    "encoderx.tools.finetune_padding": "encoderx.tools.data.finetune_padding",
    "encoderx.tools.finetune_steps": "encoderx.tools.speed.finetune_steps",
    "encoderx.tools.flops": "encoderx.tools.speed.flops",
    "encoderx.tools.long_context": "encoderx.tools.speed.long_context",
    "encoderx.tools.padding": "encoderx.tools.data.padding",
    "encoderx.tools.perf_page": "encoderx.tools.figures.perf_page",
    "encoderx.tools.plot": "encoderx.tools.figures.plot",
    "encoderx.tools.report": "encoderx.tools.figures.report",
    "encoderx.tools.retrieval_compare": "encoderx.tools.parity.retrieval_compare",
    "encoderx.tools.sts_compare": "encoderx.tools.parity.sts_compare",
    "encoderx.tools.timing": "encoderx.tools.speed.timing",
    "encoderx.tools.torch_adapters": "encoderx.tools.parity.torch_adapters",
    "encoderx.tools.torch_optim": "encoderx.tools.parity.torch_optim",
    "encoderx.tools.train_steps": "encoderx.tools.speed.train_steps",
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

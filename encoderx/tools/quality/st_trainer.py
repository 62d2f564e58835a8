"""sentence-transformers' own trainer (`SentenceTransformerTrainer`) without the `datasets`
package, which encoderx's pinned stack does not install: a stand-in module `datasets`
whose `Dataset` is a table of equal-length columns, as much of `datasets.Dataset` as the
trainer's training path uses (column_names, len, a row by index, a column by name,
from_dict). The training itself is sentence-transformers' code, unchanged: its batch
samplers (base/sampler.py: NoDuplicatesBatchSampler reads rows by index), data collator,
losses and transformers' Trainer loop. Only the automatic model card is left out
(`add_model_card_callback`, which the trainer's docstring says to override to remove
it): it reads the dataset's Arrow metadata (features, info) to describe the data.
"""
from __future__ import annotations

import importlib.machinery
import sys
import types


class Dataset:
  """A table of equal-length columns (datasets.Dataset's calls the trainer makes)."""

  def __init__(self, columns: dict[str, list]):
    self.columns = dict(columns)

  @classmethod
  def from_dict(cls, columns: dict[str, list]) -> "Dataset":
    return cls(columns)

  @property
  def column_names(self) -> list[str]:
    return list(self.columns)

  def __len__(self) -> int:
    return len(next(iter(self.columns.values())))

  def __getitem__(self, key):
    """A column by name; a row ({column: value}) by index (what a sampler reads)."""
    if isinstance(key, str):
      return self.columns[key]
    return {name: values[key] for name, values in self.columns.items()}


class _Unused:  # the types the trainer only tests instances against
  pass


# The names sentence-transformers imports from `datasets` besides Dataset.
_UNUSED_NAMES = ("DatasetDict", "IterableDataset", "IterableDatasetDict", "Sequence", "Value")


def standin_module() -> types.ModuleType:
  """A module `datasets` holding the stand-in Dataset (and the other names that
  sentence-transformers imports from it, as types nothing is an instance of)."""
  module = types.ModuleType("datasets")
  module.__spec__ = importlib.machinery.ModuleSpec("datasets", None)
  module.Dataset = Dataset
  for name in _UNUSED_NAMES:
    setattr(module, name, type(name, (_Unused,), {}))
  return module


def trainer_class():
  """SentenceTransformerTrainer as it runs with `datasets` installed, over the stand-in
  (sentence_transformers/base/trainer.py imports the names of `datasets` at import time
  only where the package is installed, so they are set on the module here)."""
  module = sys.modules.setdefault("datasets", standin_module())
  from sentence_transformers import SentenceTransformerTrainer  # pylint: disable=g-import-not-at-top
  from sentence_transformers.base import trainer as base_trainer  # pylint: disable=g-import-not-at-top
  for name in ("Dataset",) + _UNUSED_NAMES:
    setattr(base_trainer, name, getattr(module, name))
  base_trainer.is_training_available = lambda: True

  class Trainer(SentenceTransformerTrainer):
    def add_model_card_callback(self, default_args_dict) -> None:
      del default_args_dict  # the card reads Arrow metadata the stand-in has not
  return Trainer

"""sentence-transformers' mine_hard_negatives without the `datasets` package: the few
calls it makes of a `datasets.Dataset` (column_names, len, a column, to_pandas().groupby
(column).count().to_dict(), Dataset.from_dict), over plain lists. The mining itself is
sentence-transformers' own code, run unchanged."""
from __future__ import annotations

import collections
import sys
import types

from encoderx.tools.quality import st_trainer


class Dataset(st_trainer.Dataset):
  """A table of equal-length columns (the stand-in sentence-transformers' trainer runs
  on), with the grouping mining reads."""

  def to_pandas(self):
    return _Frame(self)


class _Frame:
  """`to_pandas().groupby(anchor).count().to_dict()[positive].values()`: rows per anchor,
  in the order pandas sorts the groups (their counts are all mining reads)."""

  def __init__(self, dataset: Dataset):
    self.dataset = dataset

  def groupby(self, column: str):
    counts = collections.Counter(self.dataset[column])
    others = [c for c in self.dataset.column_names if c != column]
    table = {c: dict(sorted(counts.items())) for c in others}
    return types.SimpleNamespace(count=lambda: types.SimpleNamespace(to_dict=lambda: table))


def mine_hard_negatives(monkeypatch, pairs, model, **options):
  """sentence_transformers.util.mine_hard_negatives on (anchor, positive) `pairs`, with
  this module standing in for `datasets`; the result's columns as a dict of lists."""
  from sentence_transformers.util import hard_negatives  # pylint: disable=g-import-not-at-top
  module = st_trainer.standin_module()
  module.Dataset = Dataset
  monkeypatch.setitem(sys.modules, "datasets", module)
  monkeypatch.setattr(hard_negatives, "is_datasets_available", lambda: True)
  dataset = Dataset({"anchor": [a for a, _ in pairs], "positive": [p for _, p in pairs]})
  return hard_negatives.mine_hard_negatives(dataset, model, verbose=False, **options).columns

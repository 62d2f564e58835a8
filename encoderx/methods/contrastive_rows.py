"""The contrastive method's training rows (methods/contrastive.py): read from one or
several labelled files (finetune.train_file, comma-separated as data.files), or made each
epoch from unlabelled text (contrastive.pairs_from, data/unlabelled_pairs.py), and each
epoch's order: no text twice in a batch (data/no_duplicates.py, sentence-transformers'
NoDuplicatesBatchSampler) and, with several files, batches of one file each
(unlabelled_pairs.source_batch_order: ProportionalBatchSampler, RoundRobinBatchSampler).
"""
from __future__ import annotations

import logging
import re

import numpy as np

from encoderx import errors
from encoderx import files as files_lib
from encoderx.data import labelled, no_duplicates, unlabelled_pairs
from encoderx.methods import base as method_lib

logger = logging.getLogger("encoderx")

# A file's negative columns when contrastive.negative_columns is (): 'negative', or
# 'negative_1', 'negative_2' ... in their order.
NEGATIVE_COLUMN = re.compile(r"negative(_(\d+))?")


class TrainingRows(method_lib.Method):  # pylint: disable=abstract-method
  """Mixed into Contrastive: its training rows, read or made, and their epoch order
  (reading the method's config, and its files through finetune.ReadsLabelledFiles)."""

  @classmethod
  def validate_train_files(cls, config) -> None:
    """Each of finetune.train_file's comma-separated files, or pairs_from alone."""
    settings, fail, files = config.contrastive, errors.fail, train_files(config)
    errors.check_choice("contrastive.pairs_from", settings.pairs_from,
                        unlabelled_pairs.PAIRS_FROM)
    errors.check_choice("contrastive.source_sampling", settings.source_sampling,
                        unlabelled_pairs.SOURCE_SAMPLINGS)
    if settings.pairs_from and files:
      fail("contrastive.pairs_from", f"is {settings.pairs_from!r}, which makes the rows "
           "from data.files, but finetune.train_file is also given; empty one of them.")
    if settings.pairs_from:
      from encoderx.data import tasks  # pylint: disable=g-import-not-at-top
      tasks.corpus_files(config.data)  # a ConfigError naming data.files
    elif not files:
      fail("finetune.train_file", "is empty; name a file of rows (several, "
           "comma-separated) or set contrastive.pairs_from to make them from data.files.")
    for path in files:
      if not files_lib.path(path).is_file():
        fail("finetune.train_file", f"'{path}' is not a file.")
      cls.check_file(config, "finetune.train_file", path)

  def negative_columns(self) -> list[str]:
    """contrastive.negative_columns, or the training file's own (NEGATIVE_COLUMN)."""
    if self.config.contrastive.pairs_from:
      return []
    if self.config.contrastive.negative_columns:
      return list(self.config.contrastive.negative_columns)
    found = [(int(m.group(2) or 0), name) for name in labelled.column_names(
        train_files(self.config)[0], self.config.finetune.format)
             if (m := NEGATIVE_COLUMN.fullmatch(name))]
    return [name for _, name in sorted(found)]

  def training_columns(self) -> dict:
    """The train files' rows, one file after another (source_sizes: how many each), or,
    with pairs_from, {'document': the texts pairs are made from} (epoch_pairs)."""
    pairs_from = self.config.contrastive.pairs_from
    if pairs_from:
      from encoderx.data import tasks  # pylint: disable=g-import-not-at-top
      texts = unlabelled_pairs.passages(tasks.train_documents(self.config.data), pairs_from,
                                        self.config.data.sentence_per_line)
      self.source_sizes = [len(texts)]
      return {"document": texts}
    read = [self.file_columns(path) for path in train_files(self.config)]
    self.source_sizes = [len(columns["text"]) for columns in read]
    return {name: [text for columns in read for text in columns[name]] for name in read[0]}

  def file_columns(self, path: str) -> dict:
    """{'text': anchors, 'text_pair': positives, 'negative_1' ...: negatives}, prompted;
    a row with an empty anchor, positive or negative is a LabelledDataError."""
    settings = self.config.contrastive
    names = {"text": settings.anchor_column, "text_pair": settings.positive_column}
    names.update({f"negative_{i}": column
                  for i, column in enumerate(self.negative_columns(), start=1)})
    rows = labelled.read_rows(path, list(names.values()), self.config.finetune.format)
    for column in names.values():
      empty = [number for number, row in rows if not row[column].strip()]
      if empty:
        raise labelled.LabelledDataError(
            f"'{path}' line {empty[0]}: column '{column}' is empty (in {len(empty)} of "
            f"{len(rows)} rows); every row needs its anchor, positive and each negative "
            "(drop the rows or the column).")
    prompts = settings.prompts
    return {field: [(prompts.query if field == "text" else prompts.document) + row[column]
                    for _, row in rows] for field, column in names.items()}

  def epoch_pairs(self, columns: dict, seed: int) -> dict:
    """An epoch's (anchor, positive) rows made from columns['document'], prompted."""
    made = unlabelled_pairs.make_pairs(self.config.contrastive.pairs_from,
                                       columns["document"], seed)
    prompts = self.config.contrastive.prompts
    return {"text": [prompts.query + text for text in made["text"]],
            "text_pair": [prompts.document + text for text in made["text_pair"]]}

  def train_order(self, columns: dict, seed: int) -> list[int]:
    """An epoch's rows: each source's in its order (no_duplicates_order, or shuffled),
    in batches of one source each when there are several (source_batch_order)."""
    sizes, batch_size = self.source_sizes, self.config.train.batch_size
    starts = np.cumsum([0] + list(sizes[:-1]))
    orders = []
    for source, (start, size) in enumerate(zip(starts, sizes)):
      rows = {name: column[start:start + size] for name, column in columns.items()}
      source_seed = seed_of_source(seed, source)
      order = (self.no_duplicates_order(rows, source_seed)
               if self.config.contrastive.no_duplicates
               else np.random.default_rng(source_seed).permutation(size).tolist())
      orders.append([start + row for row in order])
    if len(orders) == 1:
      return orders[0]
    return unlabelled_pairs.source_batch_order(orders, batch_size, seed,
                                               self.config.contrastive.source_sampling)

  def no_duplicates_order(self, columns: dict, seed: int) -> list[int]:
    """An epoch's row order without a text twice in a batch (data/no_duplicates.py),
    from the rows' texts without their prompts."""
    prompts = self.config.contrastive.prompts
    cut = {field: len(prompts.query if field == "text" else prompts.document)
           for field in columns}
    texts = [tuple(column[row][cut[field]:] for field, column in columns.items())
             for row in range(len(columns["text"]))]
    order = no_duplicates.batch_order(texts, self.config.train.batch_size, seed)
    duplicated = no_duplicates.duplicated_batches(texts, order, self.config.train.batch_size)
    if duplicated:
      logger.warning("%d batches of an epoch hold a text twice: too few distinct texts "
                     "are left at its end for a batch of %d", duplicated,
                     self.config.train.batch_size)
    return order

  @property
  def orders_rows(self) -> bool:
    """Whether train_order orders the epochs (else the Task shuffles the rows)."""
    return bool(self.config.contrastive.no_duplicates
                or len(train_files(self.config)) > 1)

  def check_pairs_from(self, count: int) -> None:
    """At least 2 documents (crops) or passages of 2 sentences or more (ict)."""
    pairs_from = self.config.contrastive.pairs_from
    if pairs_from and count < 2:
      errors.fail("contrastive.pairs_from", f"{pairs_from!r} found {count} "
                  + ("documents" if pairs_from == "crops" else
                     "passages of two sentences or more") + " in the train split of "
                  "data.files; it needs at least 2 (check data.document_marker, "
                  "data.document_per_line, data.sentence_per_line).")


def train_files(config) -> list[str]:
  """finetune.train_file's comma-separated files (as data.files lists its globs)."""
  return [path.strip() for path in config.finetune.train_file.split(",") if path.strip()]


def seed_of_source(seed: int, source: int) -> int:
  """Source `source`'s seed of an epoch's seed; source 0's is the epoch's (one file
  orders as before)."""
  return seed if source == 0 else int(
      np.random.SeedSequence([seed, source]).generate_state(1)[0])

"""What every fine-tuning method shares: the encoder and vocabulary a run starts from,
one head model, the checks of config.finetune's files, evaluation over padded batches of
a whole split, and what a checkpoint describes.

A fine-tuning method (classify, tag, qa, similarity, simcse) subclasses `FineTuning`,
builds its model in `build_model`, reads its data in `task` and scores it in `loss`,
`evaluate` and `summarize_evaluation`. Start from a pretrained encoder with
`--init_from` (another run, or hf:DIR): the run takes that source's encoder fields and
vocabulary (encoderx/initialize.py) before the method is built.
"""
from __future__ import annotations

import abc
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from encoderx import errors
from encoderx import files as files_lib
from encoderx.methods import base as method_lib
from encoderx.data import labelled
from encoderx.models import pretraining


# The run's splits and the config fields of their files.
SPLIT_FILES = {"train": "train_file", "validation": "dev_file"}


def _joined(arrays: list[np.ndarray]) -> np.ndarray:
  """Batches' outputs joined along the batch. Per-token outputs of batches cut to
  different length buckets (finetune.length_buckets) are padded back to the longest with a
  value nothing reads as a token's: -1 for integers (no word), -inf for scores (never an
  answer); the cut columns were padding."""
  if arrays[0].ndim < 2 or len({a.shape[1] for a in arrays}) == 1:
    return np.concatenate(arrays)
  length = max(a.shape[1] for a in arrays)
  fill = -np.inf if np.issubdtype(arrays[0].dtype, np.floating) else -1
  return np.concatenate([
      np.pad(a, [(0, 0), (0, length - a.shape[1])] + [(0, 0)] * (a.ndim - 2),
             constant_values=fill) for a in arrays])


def real_rows(outputs: list[dict]) -> dict[str, np.ndarray]:
  """The evaluated batches' outputs joined along the batch (see _joined), without the
  padding rows (`weights` 0) that complete the last batch of a whole split."""
  joined = {k: _joined([np.asarray(o[k]) for o in outputs]) for k in outputs[0]}
  real = joined.pop("weights") > 0
  return {k: v[real] for k, v in joined.items()}


def label_fields(labels) -> dict:
  """config.json's id2label / label2id of an exported classifier or tagger."""
  return {"id2label": dict(enumerate(labels)),
          "label2id": {label: i for i, label in enumerate(labels)}}


def config_section() -> ml_collections.ConfigDict:
  """config.finetune: the labelled examples every fine-tuning method reads, and its head."""
  return ml_collections.ConfigDict(dict(
      # classify / similarity / simcse: TSV, CSV or JSON-lines files (by extension, or
      # `format`), one example a row, with a header naming the columns (TSV/CSV) or keys
      # (JSONL). tag: CoNLL column files. qa: SQuAD JSON files. tag and qa read a TFDS
      # dataset instead when data.tfds_name is set (splits data.tfds_train_split and
      # data.tfds_eval_split).
      train_file="",
      dev_file="",
      format="",  # "", "tsv", "csv" or "jsonl"; "": from the file's extension.
      # The text column (tag on TFDS: the feature of a sentence's tokens).
      text_column="text",
      text_pair_column="",  # set for sentence-pair tasks: [CLS] text [SEP] pair [SEP].
      # The label column: a label (classify), a score (similarity, simcse's dev file);
      # tag on TFDS: the feature of the tags (a ClassLabel sequence, e.g. "ner").
      label_column="label",
      # Label names in order (ids 0, 1, ...); (): the training file's, sorted.
      labels=(),
      # The sentence representation: classify / similarity feed "pooler" (BERT's tanh
      # dense on the first token) or "first_token" (the encoder's output there) to the
      # head; simcse embeds by "first_token" or "mean" (of the tokens' outputs).
      pooling="pooler",
      classifier_dropout=0.1,
      # Each batch (training and evaluation) cut to the shortest of these lengths that
      # holds its longest example (data.seq_length if none does), one compilation each;
      # the loss is that of the uncut batch (encoderx/data/buckets.py). (): every batch
      # at data.seq_length.
      length_buckets=(),
      # With length_buckets: each training batch drawn from examples of one bucket
      # (encoderx/data/pipeline.py, BatchIterator), so that most padding is cut; the
      # batches then differ from those without it.
      group_by_length=False,
  ))


class ReadsLabelledFiles:
  """Mixed into the methods that read classification's labelled files (TSV, CSV, JSON
  lines): their names must give a format (or finetune.format must)."""

  @classmethod
  def check_file(cls, config, field: str, path: str) -> None:
    try:
      labelled.file_format(path, config.finetune.format)
    except labelled.LabelledDataError as error:
      errors.fail(field, str(error))


class FineTuning(method_lib.Method):
  """A task head over the encoder, trained from labelled files (or a TFDS dataset)."""
  # What summarize_evaluation reports; eval.best_metric must be one of them.
  METRICS: ClassVar[tuple[str, ...]] = ()
  # True when config.data.tfds_name may replace finetune.train_file / dev_file.
  READS_TFDS: ClassVar[bool] = False
  config_sections = ("data", "finetune")
  cuts_to_buckets = True

  @classmethod
  def config_fields(cls):
    return {"finetune": config_section()}

  def __init__(self, config):
    from encoderx.data import tasks  # pylint: disable=g-import-not-at-top
    super().__init__(config)
    self.vocabulary = tasks.build_vocabulary(config.data.vocab)
    self.model_config = method_lib.model_config(config, self.vocabulary)
    self.model = self.build_model()

  @abc.abstractmethod
  def build_model(self) -> nn.Module:
    """The model: an `encoder_model` (pretraining.EncoderModel) and the task's head."""

  # --- config ----------------------------------------------------------------------------
  @classmethod
  def check_file(cls, config, field: str, path: str) -> None:
    """Checks a data file's name (e.g. its format); raises config.ConfigError."""

  @classmethod
  def required_files(cls, config) -> tuple[str, ...]:
    """The finetune fields that must name a file (when not reading TFDS)."""
    del config
    return ("train_file", "dev_file")

  @classmethod
  def validate(cls, config) -> None:
    finetune, fail = config.finetune, errors.fail
    if cls.READS_TFDS and config.data.tfds_name:
      errors.check_tfds_name(config.data.tfds_name)
    else:
      for field in cls.required_files(config):
        path = finetune[field]
        if not path:
          fail(f"finetune.{field}", "is empty; name a file of examples"
               + (" (or set data.tfds_name)." if cls.READS_TFDS else "."))
        if not files_lib.path(path).is_file():
          fail(f"finetune.{field}", f"'{path}' is not a file.")
        cls.check_file(config, f"finetune.{field}", path)
    if not 0.0 <= finetune.classifier_dropout < 1.0:
      fail("finetune.classifier_dropout",
           f"must be in [0, 1), got {finetune.classifier_dropout}.")
    if config.train.long_fraction:
      fail("train.long_fraction", "fine-tuning runs at one length (data.seq_length); "
           "set it to 0.")
    for length in finetune.length_buckets:
      if not 8 <= length <= config.data.seq_length:
        fail("finetune.length_buckets", f"{length} is not in [8, data.seq_length="
             f"{config.data.seq_length}].")
    if finetune.group_by_length and not finetune.length_buckets:
      fail("finetune.group_by_length", "needs finetune.length_buckets (the buckets to "
           "group by).")
    if config.eval.best_metric:
      errors.check_choice("eval.best_metric", config.eval.best_metric, cls.METRICS)

  # --- data ------------------------------------------------------------------------------
  def tfds_split(self, split: str) -> str:
    """The TFDS split that `split` ('train' or 'validation') reads."""
    data = self.config.data
    return data.tfds_train_split if split == "train" else data.tfds_eval_split

  def source(self, split: str) -> str:
    """What `split` is read from: its file, or the TFDS dataset's split."""
    if self.READS_TFDS and self.config.data.tfds_name:
      return f"{self.config.data.tfds_name}[{self.tfds_split(split)}]"
    return self.config.finetune[SPLIT_FILES[split]]

  # --- parameters ------------------------------------------------------------------------
  def init(self, key):
    batch = pretraining.init_batch(1, 8)
    return {"params": self.model.init({"params": key, "dropout": key}, batch)["params"]}

  def apply(self, params, batch: dict, key: jax.Array | None = None):
    """The model's outputs, in float32; dropout on when a `key` is given (training)."""
    outputs = self.model.apply({"params": params}, batch, deterministic=key is None,
                               rngs=None if key is None else {"dropout": key})
    return jax.tree_util.tree_map(lambda x: x.astype(jnp.float32), outputs)

  # --- the train step --------------------------------------------------------------------
  def denominators(self, batch):
    return {"examples": jnp.asarray(batch["input_ids"].shape[0], jnp.float32)}

  # --- identity --------------------------------------------------------------------------
  def describe_head(self) -> dict:
    """What besides the encoder a checkpoint must agree on (labels, pooling...)."""
    return {}

  def describe(self) -> dict:
    return {"model": method_lib.describe_model(self.model_config), **self.describe_head()}

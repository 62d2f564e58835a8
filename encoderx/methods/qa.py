"""Extractive question answering: SQuAD v1.1 and v2.0.

Questions come from SQuAD JSON files (`finetune.train_file` / `dev_file`) or a TFDS
SQuAD dataset (`data.tfds_name`, e.g. "squad/v1.1:3.0.0"), and are read in windows of
their context (encoderx/data/squad.py: doc stride, exact character offsets for
WordPiece, byte-level BPE and SentencePiece). The model is BertForQuestionAnswering's:
the encoder and a linear layer giving each token a start and an end logit; the loss is
the mean of the start and end cross-entropies (BERT's run_squad.py). Evaluation decodes
the best answer of every dev question by n-best search, with the maximum answer length
and, for v2.0, the no-answer threshold, and scores it with SQuAD's official exact match
and F1 (encoderx/evaluation/squad.py). `--predict` writes SQuAD's predictions JSON
({question id: answer text}), which the official evaluation script reads.
"""
from __future__ import annotations

import json
import logging

import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from encoderx import errors
from encoderx import files as files_lib
from encoderx.methods import base as method_lib
from encoderx.evaluation import squad as squad_eval
from encoderx.methods import finetune
from encoderx.models import finetuning

logger = logging.getLogger("encoderx")

V2_METRICS = ("has_answer_exact_match", "has_answer_f1", "no_answer_exact_match",
              "no_answer_f1")


def config_section() -> ml_collections.ConfigDict:
  """config.qa: SQuAD's windows and answer decoding (BERT's run_squad.py)."""
  return ml_collections.ConfigDict(dict(
      # SQuAD v2.0 (questions may have no answer: "" is predicted when the no-answer score
      # exceeds the best span's score by more than null_score_threshold).
      version_2=False,
      null_score_threshold=0.0,
      doc_stride=128,  # tokens between the starts of a long context's windows
      max_query_length=64,  # question tokens kept
      max_answer_length=30,  # answer tokens at most
      n_best_size=20,  # start and end candidates considered per window
  ))


class QuestionAnswering(finetune.FineTuning):
  """Start and end logits over the context's tokens, n-best decoding, SQuAD EM / F1."""
  name = "qa"
  config_sections = ("data", "finetune", "qa")
  METRICS = ("exact_match", "f1") + V2_METRICS
  READS_TFDS = True
  prediction_file = "predictions.json"
  export_heads = ("question_answering",)

  def build_model(self):
    self._examples, self._windows = {}, {}
    return finetuning.SpanExtractor(self.model_config)

  @classmethod
  def config_fields(cls):
    return {**super().config_fields(), "qa": config_section()}

  @classmethod
  def validate(cls, config) -> None:
    super().validate(config)
    qa_config = config.qa
    errors.check_positive(config, "qa.doc_stride", "qa.max_query_length",
                          "qa.max_answer_length", "qa.n_best_size")
    # [CLS] question [SEP] ([SEP]) context [SEP], with room for some context.
    if config.data.seq_length < qa_config.max_query_length + 4 + 8:
      errors.fail("data.seq_length", f"{config.data.seq_length} leaves too little "
                      f"room for the context after qa.max_query_length="
                      f"{qa_config.max_query_length} question tokens.")

  # --- data ------------------------------------------------------------------------------
  def examples(self, split: str) -> list[squad.Example]:
    """The questions of 'train' or 'validation' (read once)."""
    from encoderx.data import squad  # pylint: disable=g-import-not-at-top
    if split not in self._examples:
      data = self.config.data
      if data.tfds_name:
        self._examples[split] = squad.read_tfds(
            data, self.tfds_split(split))
      else:
        self._examples[split] = squad.read_squad(self.source(split),
                                                 self.config.qa.version_2)
    return self._examples[split]

  def _windows_of(self, examples: list[squad.Example]) -> list[squad.Window]:
    from encoderx.data import squad  # pylint: disable=g-import-not-at-top
    qa_config = self.config.qa
    return squad.windows(examples, self.vocabulary, self.config.data.seq_length,
                         qa_config.doc_stride, qa_config.max_query_length,
                         token_types=self.model_config.embeddings.type_vocab_size > 1)

  def windows(self, split: str) -> list[squad.Window]:
    if split not in self._windows:
      self._windows[split] = self._windows_of(self.examples(split))
    return self._windows[split]

  def _task(self, windows_fn: dict, sources: dict):
    from encoderx.data import squad  # pylint: disable=g-import-not-at-top
    qa_config = self.config.qa
    description = [qa_config.doc_stride, qa_config.max_query_length,
                   qa_config.version_2, self.config.data.vocab.to_dict(),
                   self.model_config.embeddings.type_vocab_size]
    return squad.register_task(windows_fn, sources, self.config.data.seq_length,
                               self.vocabulary, description, self.config.data.shuffle_buffer)

  def task(self):
    splits = finetune.SPLIT_FILES
    return self._task({split: (lambda split=split: self.windows(split)) for split in splits},
                      {split: self.source(split) for split in splits})

  def check_data(self) -> None:
    for split in finetune.SPLIT_FILES:
      examples, windows = self.examples(split), self.windows(split)
      unanswerable = sum(not e.answers for e in examples)
      logger.info("%s: %d questions (%d without an answer), %d windows", split,
                  len(examples), unanswerable, len(windows))

  # --- the train step --------------------------------------------------------------------
  def _losses(self, start_logits, end_logits, batch):
    """Per window: (start cross-entropy + end cross-entropy) / 2."""
    return (optax.softmax_cross_entropy_with_integer_labels(start_logits,
                                                            batch["start_positions"])
            + optax.softmax_cross_entropy_with_integer_labels(end_logits,
                                                              batch["end_positions"])) / 2

  def _logits(self, params, batch, key=None):
    """Start and end logits [batch, length], padding at -inf (never chosen)."""
    start_logits, end_logits = self.apply(params, batch, key)
    real = batch["segment_ids"] > 0
    return jnp.where(real, start_logits, -1e9), jnp.where(real, end_logits, -1e9)

  def loss(self, params, state, batch, key, denominators, update, carry):
    del update, carry
    start_logits, end_logits = self._logits(params, batch, key)
    losses = self._losses(start_logits, end_logits, batch)
    correct = ((jnp.argmax(start_logits, -1) == batch["start_positions"])
               & (jnp.argmax(end_logits, -1) == batch["end_positions"]))
    sums = {"loss_sum": losses.sum(), "correct": correct.sum().astype(jnp.float32),
            "count": jnp.asarray(losses.shape[0], jnp.float32)}
    return losses.sum() / denominators["examples"], method_lib.LossOutput(sums, state)

  def summarize(self, sums):
    count = jnp.maximum(sums["count"], 1.0)
    return {"qa_loss": sums["loss_sum"] / count, "span_accuracy": sums["correct"] / count}

  # --- evaluation ------------------------------------------------------------------------
  def predict(self, params, state, batch):
    del state
    start_logits, end_logits = self._logits(params, batch)
    return {"start_logits": start_logits, "end_logits": end_logits,
            "window_index": batch["window_index"]}

  def evaluate(self, params, state, batch, key):
    del key
    return {**self.predict(params, state, batch), "weights": batch["example_weight"]}

  def answers(self, windows: list[squad.Window], outputs: dict) -> dict[str, str]:
    """{question id: answer} of the windows' logits (rows in `window_index` order)."""
    qa_config = self.config.qa
    return squad_eval.best_answers(
        [windows[int(i)] for i in outputs["window_index"]], outputs["start_logits"],
        outputs["end_logits"], qa_config.n_best_size,
        qa_config.max_answer_length, qa_config.version_2,
        qa_config.null_score_threshold)

  def summarize_evaluation(self, outputs: list) -> dict[str, float]:
    answers = self.answers(self.windows("validation"), finetune.real_rows(outputs))
    return squad_eval.scores(answers, self.examples("validation"),
                             self.config.qa.version_2)

  def describe_head(self) -> dict:
    return {"head": "span"}

  # --- predictions -----------------------------------------------------------------------
  def prediction_batches(self, path: str, batch_size: int):
    from encoderx.data import pipeline, squad  # pylint: disable=g-import-not-at-top
    examples = squad.read_squad(path, self.config.qa.version_2, with_answers=False)
    windows = self._windows_of(examples)
    task = self._task({"predict": lambda: windows}, {"predict": path})
    return windows, pipeline.whole_split(task, "predict", self.config.data.seq_length,
                                         batch_size)

  def write_predictions(self, rows, predictions, path: str) -> int:
    """SQuAD's predictions JSON: {question id: answer text} ("" for no answer)."""
    answers = self.answers(rows, {k: np.asarray(v) for k, v in predictions.items()})
    files_lib.write_atomically(path, json.dumps(answers, ensure_ascii=False, indent=1))
    return len(answers)

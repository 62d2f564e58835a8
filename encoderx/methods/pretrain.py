"""Pretraining: masked language modelling with optional NSP / SOP / SBO terms (BERT,
RoBERTa, ALBERT, SpanBERT and BERT-wwm are configs of this one method).

The objectives (`config.objective.names`, encoderx/objectives/) mask the batch on device
(`prepare`, keyed per step) and score the pretraining model's heads; the loss is
sum(weight x objective's loss sum / its denominator), the denominators counted on the
whole global batch. The data is the config's pretraining seqio Task
(encoderx/data/tasks.py).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from encoderx import errors
from encoderx import files as files_lib
from encoderx.methods import base as method_lib
from encoderx import objectives as objectives_lib
from encoderx.models import pretraining
from encoderx.objectives import mlm
from encoderx.objectives import sentence as sentence_lib
from encoderx.data import resources


def summarize_terms(terms: dict) -> dict:
  """{objective: {loss_sum, correct, count}} -> {objective_loss, objective_accuracy}."""
  metrics = {}
  for name, t in terms.items():
    count = jnp.maximum(t["count"], 1.0)
    metrics[f"{name}_loss"] = t["loss_sum"] / count
    metrics[f"{name}_accuracy"] = t["correct"] / count
  return metrics


def validate_corpus(config) -> None:
  """Checks the corpus fields of `config.data` (text files, TFDS or preprocessed
  examples); raises config.ConfigError."""
  data, fail = config.data, errors.fail
  errors.check_choice("data.invalid_utf8", data.invalid_utf8, ("error", "replace"))
  if data.document_per_line and (data.document_marker or data.sentence_per_line):
    fail("data.document_per_line", "makes each line a document; it cannot be combined "
         "with data.document_marker or data.sentence_per_line.",
         "Choose one way of separating documents.")
  if data.eval_every_nth_document < 2:
    fail("data.eval_every_nth_document", "must be >= 2 so that most documents train.")
  if data.tfds_name:
    errors.check_tfds_name(data.tfds_name)
  if data.preprocessed and not files_lib.path(data.preprocessed).is_dir():
    fail("data.preprocessed", f"'{data.preprocessed}' is not a directory.",
         "Write one with `python -m encoderx.preprocess --config=... --output=DIR`.")
  if (not data.preprocessed and not data.tfds_name
      and data.files != resources.BUNDLED_CORPUS):
    files_lib.resolve_patterns(data.files)


# encoderx.data.tasks, and with it the text stack (seqio, tensorflow), is imported where
# text is read or tokenized, not with this module: a model built from a vocabulary's facts
# trains on batches made elsewhere without it (encoderx/tools/speed/gpu_bench.py).
def build_vocabulary(vocab_config):
  """The vocabulary `config.data.vocab` describes (tasks.build_vocabulary)."""
  from encoderx.data import tasks  # pylint: disable=g-import-not-at-top
  return tasks.build_vocabulary(vocab_config)


def check_corpus(config, process_count: int = 1, examples: str = "") -> None:
  """What a pretraining run checks before its first batch: the manifest of
  data.preprocessed against the config (as `process_count` processes read it), or the
  text read whole (tasks.check_text_corpus; `examples` names what its documents
  become). Streams are never read whole."""
  from encoderx.data import tasks  # pylint: disable=g-import-not-at-top
  data = config.data
  if data.preprocessed:
    tasks.preprocessed_source(config, process_count)
  elif not data.tfds_name and not data.streaming:
    tasks.check_text_corpus(config, examples)


def validate_data(config) -> None:
  """Checks the pretraining data fields (config.data); raises config.ConfigError."""
  from encoderx.data import tasks  # pylint: disable=g-import-not-at-top
  data, fail = config.data, errors.fail
  errors.check_choice("data.builder", data.builder, tuple(tasks.BUILDERS))
  if not 0.0 <= data.short_seq_prob <= 1.0:
    fail("data.short_seq_prob", f"must be in [0, 1], got {data.short_seq_prob}.")
  validate_corpus(config)


def validate_mlm(config) -> None:
  """Checks the masking fields (config.objective.mlm); raises config.ConfigError."""
  mlm_fields, fail = config.objective.mlm, errors.fail
  errors.check_positive(config, "objective.mlm.max_predictions",
                            "objective.mlm.long_max_predictions",
                            "objective.mlm.max_ngram", "objective.mlm.max_span_words")
  errors.check_choice("objective.mlm.unit", mlm_fields.unit, mlm.UNITS)
  if not 0.0 < mlm_fields.span_geometric_p <= 1.0:
    fail("objective.mlm.span_geometric_p",
         f"must be in (0, 1], got {mlm_fields.span_geometric_p}.")
  if not 0.0 < mlm_fields.rate < 1.0:
    fail("objective.mlm.rate", f"must be in (0, 1), got {mlm_fields.rate}.")
  if mlm_fields.mask_token_prob < 0 or mlm_fields.random_token_prob < 0 or (
      mlm_fields.mask_token_prob + mlm_fields.random_token_prob > 1.0):
    fail("objective.mlm.mask_token_prob",
         "and random_token_prob must be >= 0 and sum to at most 1.")
  if mlm_fields.max_predictions > config.data.seq_length:
    fail("objective.mlm.max_predictions", f"{mlm_fields.max_predictions} exceeds "
         f"data.seq_length={config.data.seq_length}.")
  if mlm_fields.eval_rate and not 0.0 < mlm_fields.eval_rate < 1.0:
    fail("objective.mlm.eval_rate", f"must be in (0, 1) (or 0: objective.mlm.rate), got "
         f"{mlm_fields.eval_rate}.")
  validate_rate_schedule(config)


def validate_rate_schedule(config) -> None:
  """objective.mlm.rate_schedule: (until_step, rate) pieces with increasing ends, the
  last at train.steps, rates in (0, 1), the largest within max_predictions."""
  mlm_fields, fail = config.objective.mlm, errors.fail
  field = "objective.mlm.rate_schedule"
  schedule = mlm_fields.rate_schedule
  if not schedule:
    return
  try:
    pieces = [(int(end), float(rate)) for end, rate in schedule]
  except (TypeError, ValueError):
    fail(field, f"must be (until_step, rate) pairs, got {schedule!r}.")
  ends = [end for end, _ in pieces]
  if any(b <= a for a, b in zip([0] + ends, ends)):
    fail(field, f"the pieces' ends {ends} must increase from above 0.")
  if ends[-1] != config.train.steps:
    fail(field, f"its last piece ends at step {ends[-1]}, but train.steps is "
         f"{config.train.steps}: the pieces must add up to the run.")
  for _, rate in pieces:
    if not 0.0 < rate < 1.0:
      fail(field, f"rate {rate} is not in (0, 1).")
  largest = max(rate for _, rate in pieces)
  needed = int(round(largest * config.data.seq_length))
  if needed > mlm_fields.max_predictions:
    fail("objective.mlm.max_predictions", f"{mlm_fields.max_predictions} cannot hold the "
         f"schedule's largest rate {largest} x data.seq_length={config.data.seq_length} "
         f"= {needed} predictions.", f"Set it to {needed} or more.")


class Pretraining(method_lib.Method):
  """MLM (+ NSP / SOP / SBO) on a PretrainingModel."""
  name = "pretrain"
  config_sections = ("data", "objective")
  # SpanBERT (no sentence head) exports as the masked-LM class, without its SBO head.
  export_heads = ("pretraining", "mlm")

  def __init__(self, config, max_predictions: int | None = None):
    super().__init__(config)
    self.vocabulary = build_vocabulary(config.data.vocab)
    self.model_config = method_lib.model_config(config, self.vocabulary)
    self.objectives = objectives_lib.build(config.objective, self.vocabulary,
                                           max_predictions)
    self.weights = {o.name: float(config.objective.weights[o.name])
                    for o in self.objectives}
    self.model = pretraining.PretrainingModel(
        self.model_config, heads=objectives_lib.model_heads(self.objectives))

  @classmethod
  def config_fields(cls):
    return {"objective": objectives_lib.config_section()}

  @classmethod
  def validate(cls, config) -> None:
    data, model, fail = config.data, config.model, errors.fail
    validate_data(config)
    names = tuple(config.objective.names)
    if not names:
      fail("objective.names", "is empty; name at least one objective.")
    for name in names:
      errors.check_choice("objective.names", name, objectives_lib.NAMES)
      if config.objective.weights[name] < 0:
        fail(f"objective.weights.{name}", f"must be >= 0, got "
             f"{config.objective.weights[name]}.")
    sentence = [n for n in names if n in sentence_lib.NAMES]
    if len(sentence) > 1:
      fail("objective.names", f"has two sentence objectives {sentence}; choose one.")
    if sentence and data.builder != "sentence_pairs":
      fail("data.builder", f"{sentence[0]} needs 'sentence_pairs', got {data.builder!r}.")
    if not sentence and data.builder == "sentence_pairs":
      fail("data.builder", "'sentence_pairs' builds examples for nsp or sop; without "
           "them use 'full_sentences' or 'doc_sentences'.")
    if data.builder == "sentence_pairs" and model.embeddings.type_vocab_size == 1:
      fail("model.embeddings.type_vocab_size", "is 1, but sentence pairs give segment B "
           "token type 1.", "Use 2 (or 0: no token type embedding).")
    validate_mlm(config)
    mlm_fields = config.objective.mlm
    if "sbo" in names and "mlm" not in names:
      fail("objective.names", "sbo predicts the tokens MLM masks; it needs 'mlm' too "
           "(set objective.weights.mlm=0 to train SBO alone).")
    if "sbo" in names and mlm_fields.unit not in mlm.WHOLE_WORD_UNITS:
      fail("objective.mlm.unit", "sbo predicts masked units from their boundary tokens; "
           f"it needs one of {', '.join(map(repr, mlm.WHOLE_WORD_UNITS))}, got "
           f"{mlm_fields.unit!r}.", "SpanBERT sets 'span'.")

  # --- data ------------------------------------------------------------------------------
  def task(self):
    from encoderx.data import tasks  # pylint: disable=g-import-not-at-top
    return tasks.register_pretraining_task(self.config)

  def check_data(self) -> None:
    check_corpus(self.config)

  # --- parameters ------------------------------------------------------------------------
  def init(self, key: jax.Array) -> dict:
    batch = pretraining.init_batch(1, 8, max_predictions=2)
    return {"params": self.model.init({"params": key, "dropout": key}, batch)["params"]}

  # --- the train step --------------------------------------------------------------------
  def prepare(self, batch: dict, key: jax.Array, step: jax.Array | None = None) -> dict:
    """Applies every objective's `prepare` (masking) with its own key."""
    for index, objective in enumerate(self.objectives):
      batch = objective.prepare(batch, jax.random.fold_in(key, index), step)
    return batch

  def denominators(self, batch: dict) -> dict:
    return {o.name: o.denominator(batch) for o in self.objectives}

  def _terms(self, params, batch: dict, deterministic: bool, key=None) -> dict:
    outputs = self.model.apply({"params": params}, batch, deterministic=deterministic,
                               rngs=None if deterministic else {"dropout": key})
    return {o.name: o.terms(outputs, batch) for o in self.objectives}

  def loss(self, params, state, batch, key, denominators, update, carry):
    del update, carry
    terms = self._terms(params, batch, deterministic=False, key=key)
    loss = sum(self.weights[name] * terms[name]["loss_sum"] / denominators[name]
               for name in terms)
    return loss, method_lib.LossOutput(sums=terms, state=state)

  def summarize(self, sums) -> dict:
    return summarize_terms(sums)

  # --- evaluation ------------------------------------------------------------------------
  def evaluate(self, params, state, batch, key):
    """Loss and accuracy sums of each objective on a batch masked with `key` (the same
    held-out batches get the same masks at every evaluation of a run)."""
    del state
    return self._terms(params, self.prepare(batch, key), deterministic=True)

  def summarize_evaluation(self, outputs: list) -> dict[str, float]:
    totals = jax.tree_util.tree_map(lambda *xs: sum(xs), *outputs)
    metrics = {k: float(v) for k, v in summarize_terms(totals).items()}
    if "mlm_loss" in metrics:
      metrics["mlm_perplexity"] = math.exp(min(metrics["mlm_loss"], 50.0))
    return metrics

  # --- phases, identity ------------------------------------------------------------------
  def for_phase(self, phase) -> "Pretraining":
    if not phase.long:
      return self
    return Pretraining(self.config, self.config.objective.mlm.long_max_predictions)

  def describe(self) -> dict:
    return {"model": method_lib.describe_model(self.model_config),
            "heads": list(self.model.heads)}

"""Token classification (NER, POS tagging): a tag for every word.

Sentences come from CoNLL column files (`finetune.train_file` / `dev_file`) or a TFDS
dataset of token and tag sequences (`data.tfds_name`, e.g. conll2003); see
encoderx/data/tagging.py. The model is BertForTokenClassification's: the encoder, dropout
and a linear layer on every token; the loss is the mean cross-entropy over the first
piece of each word (the others carry no label). A word's predicted tag is its first
piece's. Training cuts sentences at the sequence length; evaluation and `--predict`
split longer ones into windows of whole words (encoderx/data/tagging.py `windows`), so
that every word is predicted (cut off, the last words would be predicted O and their
entities missed); only a word with no piece at all is predicted O. IOB tag sets are repaired to valid IOB2 on output
(encoderx/evaluation/tags.py) and scored by entities with seqeval (micro precision,
recall, F1, and F1 per type), as conlleval scores CoNLL-2003; every tag set is scored by
word accuracy. `--predict` writes CoNLL columns: token, [gold tag,] predicted tag.
"""
from __future__ import annotations

import collections
import logging

import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from encoderx import errors
from encoderx import files as files_lib
from encoderx.methods import base as method_lib
from encoderx.evaluation import tags as tags_lib
from encoderx.methods import finetune
from encoderx.models import finetuning

logger = logging.getLogger("encoderx")



def config_section() -> ml_collections.ConfigDict:
  """config.tag: how CoNLL files give the tags."""
  return ml_collections.ConfigDict(dict(
      # Which whitespace-separated column of a CoNLL line holds the tag (the token is the
      # first); -1: the last.
      column=-1,
  ))


class Tagging(finetune.FineTuning):
  """A tag for every word, from its first word piece."""
  name = "tag"
  config_sections = ("data", "finetune", "tag")
  METRICS = ("f1", "precision", "recall", "accuracy", "loss")
  READS_TFDS = True
  prediction_file = "predictions.conll"
  export_heads = ("token_classification",)

  def build_model(self):
    self._sentences, self._windows = {}, {}
    self.labels = self._labels()
    return finetuning.TokenClassifier(self.model_config, num_labels=len(self.labels),
                                      dropout=self.config.finetune.classifier_dropout)

  @classmethod
  def config_fields(cls):
    return {**super().config_fields(), "tag": config_section()}

  @classmethod
  def validate(cls, config) -> None:
    super().validate(config)
    if config.data.tfds_name and not (config.finetune.text_column
                                      and config.finetune.label_column):
      errors.fail("finetune.text_column", "and finetune.label_column name the TFDS "
                      "features of the tokens and the tags (conll2003: tokens, ner).")

  def export_fields(self) -> dict:
    return finetune.label_fields(self.labels)

  # --- data ------------------------------------------------------------------------------
  def sentences(self, split: str) -> list[tagging.Sentence]:
    """The sentences of 'train' or 'validation' (read once)."""
    from encoderx.data import tagging  # pylint: disable=g-import-not-at-top
    if split not in self._sentences:
      finetune_config = self.config.finetune
      if self.config.data.tfds_name:
        self._sentences[split], _ = tagging.read_tfds(
            self.config.data, self.tfds_split(split), finetune_config.text_column,
            finetune_config.label_column)
      else:
        self._sentences[split] = tagging.read_conll(self.source(split),
                                                     self.config.tag.column)
    return self._sentences[split]

  def _labels(self) -> tuple[str, ...]:
    """config.finetune.labels; the TFDS dataset's tag names; or the training file's tags,
    O first then sorted."""
    from encoderx.data import tagging  # pylint: disable=g-import-not-at-top
    finetune_config, data = self.config.finetune, self.config.data
    if finetune_config.labels:
      return tuple(str(label) for label in finetune_config.labels)
    if data.tfds_name:
      self._sentences["train"], names = tagging.read_tfds(
          data, data.tfds_train_split, finetune_config.text_column,
          finetune_config.label_column)
      return names
    tags = {tag for sentence in self.sentences("train") for tag in sentence.tags}
    return tuple(sorted(tags, key=lambda tag: (tag != "O", tag)))

  def windows(self, sentences: list[tagging.Sentence]
              ) -> tuple[list[tagging.Sentence], list[tagging.Window]]:
    """`sentences` split into windows that fit in data.seq_length (see tagging.windows)."""
    from encoderx.data import tagging  # pylint: disable=g-import-not-at-top
    counts = tagging.piece_counts(self.vocabulary, sentences)
    return tagging.windows(sentences, counts, self.config.data.seq_length - 2)

  def validation_windows(self) -> tuple[list[tagging.Sentence], list[tagging.Window]]:
    if "validation" not in self._windows:
      self._windows["validation"] = self.windows(self.sentences("validation"))
    return self._windows["validation"]

  def _task(self, sentences: dict, sources: dict):
    from encoderx.data import tagging  # pylint: disable=g-import-not-at-top
    return tagging.register_task(sentences, self.labels, sources, self.vocabulary,
                                 self.config.data.vocab.to_dict(),
                                 self.config.data.shuffle_buffer,
                                 window_pieces=self.config.data.seq_length - 2)

  def task(self):
    return self._task({"train": lambda: self.sentences("train"),
                       "validation": lambda: self.validation_windows()[0]},
                      {split: self.source(split) for split in finetune.SPLIT_FILES})

  def check_data(self) -> None:
    from encoderx.data import tagging  # pylint: disable=g-import-not-at-top
    for split in finetune.SPLIT_FILES:
      sentences = self.sentences(split)
      tagging.columns(sentences, self.labels, self.source(split))  # unknown tags fail
      counts = collections.Counter(tag[2:] for s in sentences for tag in s.tags
                                   if tag.startswith("B-"))
      logger.info("%s: %d sentences, %d words%s", split, len(sentences),
                  sum(len(s.words) for s in sentences),
                  "".join(f", {kind} {n}" for kind, n in sorted(counts.items())))

  # --- the train step --------------------------------------------------------------------
  def denominators(self, batch):
    return {"words": jnp.maximum((batch["tags"] >= 0).sum(), 1).astype(jnp.float32)}

  def _word_losses(self, logits, tags):
    """Cross-entropy at the labelled pieces (0 elsewhere) and their mask [batch, length]."""
    labelled = tags >= 0
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.maximum(tags, 0))
    return jnp.where(labelled, losses, 0.0), labelled

  def loss(self, params, state, batch, key, denominators, update, carry):
    del update, carry
    logits = self.apply(params, batch, key)
    losses, labelled = self._word_losses(logits, batch["tags"])
    correct = (jnp.argmax(logits, -1) == batch["tags"]) & labelled
    sums = {"loss_sum": losses.sum(), "correct": correct.sum().astype(jnp.float32),
            "count": labelled.sum().astype(jnp.float32)}
    return losses.sum() / denominators["words"], method_lib.LossOutput(sums, state)

  def summarize(self, sums):
    count = jnp.maximum(sums["count"], 1.0)
    return {"tagging_loss": sums["loss_sum"] / count, "accuracy": sums["correct"] / count}

  # --- evaluation ------------------------------------------------------------------------
  def evaluate(self, params, state, batch, key):
    del state, key
    logits = self.apply(params, batch)
    losses, labelled = self._word_losses(logits, batch["tags"])
    return {"predictions": jnp.argmax(logits, -1), "word_ids": batch["word_ids"],
            "example_index": batch["example_index"], "loss_sum": losses.sum(-1),
            "labelled": labelled.sum(-1), "weights": batch["example_weight"]}

  def sentence_tags(self, lengths: list[int], windows) -> list[list[str]]:
    """Sentences' tags (`lengths` words each) from their windows' predictions, `windows`
    of (Window, predictions, word_ids): each word's first piece's (O for words without
    one), repaired to IOB2 for IOB tag sets."""
    default = "O" if "O" in self.labels else self.labels[0]
    tags = [[default] * words for words in lengths]
    for window, predictions, word_ids in windows:
      for prediction, word in zip(predictions, word_ids):
        if word >= 0:
          tags[window.sentence][window.start + word] = self.labels[int(prediction)]
    return [tags_lib.repair_iob2(t) for t in tags] if tags_lib.is_iob(self.labels) else tags

  def word_tags(self, predictions: np.ndarray, word_ids: np.ndarray, words: int) -> list[str]:
    """One sentence's tags from the predictions of its pieces in one row."""
    from encoderx.data import tagging  # pylint: disable=g-import-not-at-top
    return self.sentence_tags([words], [(tagging.Window(0, 0), predictions, word_ids)])[0]

  def summarize_evaluation(self, outputs: list) -> dict[str, float]:
    from encoderx.data import tagging  # pylint: disable=g-import-not-at-top
    rows = finetune.real_rows(outputs)
    sentences, (_, places) = self.sentences("validation"), self.validation_windows()
    windows = [places[int(index)] for index in rows["example_index"]]
    scored = sorted({window.sentence for window in windows})  # all, unless eval.batches
    position = {sentence: i for i, sentence in enumerate(scored)}
    gold = [sentences[i].tags for i in scored]
    predicted = self.sentence_tags(
        [len(sentences[i].words) for i in scored],
        [(tagging.Window(position[w.sentence], w.start), predictions, word_ids)
         for w, predictions, word_ids in zip(windows, rows["predictions"],
                                              rows["word_ids"])])
    words = sum(len(tags) for tags in gold)
    metrics = {
        "accuracy": sum(g == p for gs, ps in zip(gold, predicted) for g, p in zip(gs, ps))
                    / max(words, 1),
        "loss": float(rows["loss_sum"].sum() / max(rows["labelled"].sum(), 1))}
    if tags_lib.is_iob(self.labels):
      metrics.update(tags_lib.entity_metrics(gold, predicted))
    return metrics

  def describe_head(self) -> dict:
    return {"labels": list(self.labels)}

  # --- predictions -----------------------------------------------------------------------
  def predict(self, params, state, batch):
    del state
    return {"tags": jnp.argmax(self.apply(params, batch), -1), "word_ids": batch["word_ids"]}

  def prediction_batches(self, path: str, batch_size: int):
    """(a (Window, its sentence) row per window, batches of the windows)."""
    from encoderx.data import pipeline, tagging  # pylint: disable=g-import-not-at-top
    sentences = tagging.read_conll(path, self.config.tag.column, with_tags=False)
    parts, places = self.windows(sentences)
    untagged = [tagging.Sentence(s.line, s.words, []) for s in parts]  # gold: echoed
    task = self._task({"predict": lambda: untagged}, {"predict": path})
    rows = [(place, sentences[place.sentence]) for place in places]
    return rows, pipeline.whole_split(task, "predict", self.config.data.seq_length,
                                      batch_size)

  def write_predictions(self, rows, predictions, path: str) -> int:
    """CoNLL columns, tab-separated: token, the file's own tag (when it has tags), the
    predicted tag; a blank line after each sentence (conlleval reads this)."""
    sentences = list({place.sentence: sentence for place, sentence in rows}.values())
    predicted = self.sentence_tags(
        [len(s.words) for s in sentences],
        [(place, tags, word_ids) for (place, _), tags, word_ids
         in zip(rows, predictions["tags"], predictions["word_ids"])])
    lines = []
    for sentence, tags in zip(sentences, predicted):
      for word, gold, tag in zip(sentence.words, sentence.tags or [None] * len(tags), tags):
        lines.append("\t".join([word] + ([gold] if gold is not None else []) + [tag]))
      lines.append("")
    files_lib.write_atomically(path, "\n".join(lines) + "\n")
    return len(sentences)

"""Equal-budget fine-tuning: encoderx's classify or tag recipe beside Hugging Face's
`Trainer` with its defaults, from the same pretrained encoder, the same steps and batch
size.

    python -m encoderx.tools.quality.finetune_compare --init_from=hf:MODEL_DIR \
        --data=../shared/corpora/rotten_tomatoes --seeds=0,1,2 [--steps=700] \
        [--output=compare.json] [--length_buckets=32,48] [--learning_rate=5e-5]
    python -m encoderx.tools.quality.finetune_compare --method=tag --init_from=hf:MODEL_DIR \
        --data=../shared/corpora/conll2003 --steps=300 --learning_rate=1e-4

For each seed: encoderx trains configs/finetune.py:classify,data=DIR (AdamW at 5e-5, 10%
warmup then linear decay, weight decay 0.01 but on biases and LayerNorms, Adam eps 1e-6,
clipping at 1.0, batch 32, length 64, the pooled [CLS] with dropout 0.1) with
train.seed = seed; Hugging Face trains AutoModelForSequenceClassification from the same
directory with `transformers.Trainer` and `TrainingArguments`' defaults (AdamW at 5e-5,
no warmup, linear decay, no weight decay, Adam eps 1e-8, clipping at 1.0, seed = seed)
but for the budget: the same steps and batch size, and texts cut at the same length
(BertTokenizer, dynamic padding). Both are scored once, at the end, on the whole dev
file: accuracy (scikit-learn). Printed and written: each seed's figures, the median and
the spread, and each side's time end to end (encoderx's includes compiling its steps).
The two see different batch orders and head initializations: the seeds say how far apart
runs of one side fall. --length_buckets sets encoderx's finetune.length_buckets (each batch
cut to the shortest bucket holding its longest text, as Hugging Face pads each batch to
its longest); --learning_rate both sides' peak.

--method=tag: configs/finetune.py:tag at length 64 (CoNLL files train.txt and dev.txt)
beside AutoModelForTokenClassification under the Trainer, with 10% warmup on both sides
(the first piece of each word labelled, as transformers' token-classification example).
Both sides' predictions are scored alike, by entities over every word of the dev file
(tag_scores: a word no piece of which fits predicted O); Hugging Face's also over the
words that fit only (what that example reports), encoderx's also with the words past
each sentence's first window predicted O (its evaluation before it split long sentences
into windows).
"""
from __future__ import annotations

import collections
import sys
import tempfile
import time

import numpy as np
from absl import app, flags

from encoderx import configs, initialize, train
from encoderx.data import tagging, tasks
from encoderx.evaluation import scores
from encoderx.evaluation import tags as tags_lib
from encoderx.tools.quality import over_seeds
from encoderx.tools.speed import finetune_steps

FLAGS = flags.FLAGS


METHODS = ("classify", "tag")


def encoderx_config(method: str, init_from: str, data: str, seed: int, steps: int,
                    length_buckets: tuple[int, ...] = (), learning_rate: float = 0.0):
  """configs/finetune.py:METHOD at length 64, its warmup kept at 10% of `steps`, its
  learning rate unless `learning_rate`, scored once at the end (the final model, as
  Hugging Face's)."""
  config = configs.get(f"finetune:{method},data={data}")
  config.init_from, config.finetune.length_buckets = init_from, length_buckets
  config.data.seq_length = finetune_steps.SEQ_LENGTH
  config.train.seed, config.train.steps = seed, steps
  config.optimizer.warmup_steps = steps // 10
  config.optimizer.learning_rate = learning_rate or config.optimizer.learning_rate
  config.eval.every_steps, config.eval.best_metric = 0, ""
  return config


def encoderx_accuracy(config) -> dict[str, float]:
  with tempfile.TemporaryDirectory() as workdir:
    return {"accuracy": train.run(config, workdir)["eval"]["accuracy"]}


def encoderx_tag_scores(config) -> dict[str, float]:
  """Dev entity F1 of the tag run, and of its predictions with the words past each
  sentence's first window predicted O: about what the evaluation gave before it split
  long sentences into windows (then, a word cut in its pieces kept its first one)."""
  with tempfile.TemporaryDirectory() as workdir:
    f1 = train.run(config, workdir)["eval"]["f1"]
    _, path = train.predict(config, workdir, config.finetune.dev_file)
    predicted = tagging.read_conll(path, tag_column=2)
  gold = tagging.read_conll(config.finetune.dev_file)
  vocabulary = tasks.build_vocabulary(initialize.resolve_config(config).data.vocab)
  _, places = tagging.windows(gold, tagging.piece_counts(vocabulary, gold),
                              config.data.seq_length - 2)
  first_window = {}
  for place in places:  # the end of each sentence's first window
    first_window.setdefault(place.sentence, len(gold[place.sentence].words))
    if place.start:
      first_window[place.sentence] = min(first_window[place.sentence], place.start)
  cut = [tags_lib.repair_iob2(s.tags[:first_window[i]]
                              + ["O"] * (len(s.tags) - first_window[i]))
         for i, s in enumerate(predicted)]
  return {"f1": f1, "f1_cut_at_length": tags_lib.entity_metrics(
      [s.tags for s in gold], cut)["f1"]}


def _trainer(model, tokenizer, train_set, seed: int, steps: int, batch_size: int,
             learning_rate: float, warmup_steps: int = 0, collator=None):
  """transformers.Trainer with TrainingArguments' defaults but for the budget."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  output = tempfile.mkdtemp()
  arguments = transformers.TrainingArguments(
      output_dir=output, max_steps=steps, per_device_train_batch_size=batch_size,
      per_device_eval_batch_size=64, seed=seed, report_to="none", save_strategy="no",
      learning_rate=learning_rate, warmup_steps=warmup_steps,
      logging_steps=max(steps // 10, 1), use_cpu=not torch.cuda.is_available())
  return transformers.Trainer(model=model, args=arguments, train_dataset=train_set,
                              processing_class=tokenizer, data_collator=collator)


def hugging_face_accuracy(init_from: str, data: str, seed: int, steps: int,
                          batch_size: int, max_length: int, learning_rate: float
                          ) -> dict[str, float]:
  """Dev accuracy of transformers.Trainer with its defaults (see the module doc)."""
  import transformers  # pylint: disable=g-import-not-at-top
  directory = init_from.removeprefix("hf:")  # a Hugging Face directory
  tokenizer = transformers.AutoTokenizer.from_pretrained(directory)

  def examples(name: str) -> list[dict]:
    return finetune_steps.classified_features(tokenizer, f"{data}/{name}", max_length)

  transformers.set_seed(seed)  # the new head's initialization
  model = transformers.AutoModelForSequenceClassification.from_pretrained(directory,
                                                                          num_labels=2)
  trainer = _trainer(model, tokenizer, examples("train.tsv"), seed, steps, batch_size,
                     learning_rate)
  trainer.train()
  prediction = trainer.predict(examples("dev.tsv"))
  return {"accuracy": scores.classification_metrics(
      prediction.label_ids, np.argmax(prediction.predictions, -1), 2)["accuracy"]}


def word_predictions(word_ids: list, predictions: np.ndarray, words: int,
                     labels: list[str]) -> list[str | None]:
  """A sentence's tag per word from its first piece's prediction; None for the words no
  piece of which fits in the length."""
  tags, previous = [None] * words, None
  for word, prediction in zip(word_ids, predictions):
    if word is not None and word != previous:
      tags[word] = labels[int(prediction)]
    previous = word
  return tags


def tag_scores(sentences: list, predicted: list[list[str | None]]) -> dict[str, float]:
  """Entity F1 over every word, those the model did not see predicted O (encoderx's
  scoring, conlleval's on the whole file), and over the seen words only (the gold tags
  of unseen words dropped, as transformers' token-classification example scores)."""
  every = [tags_lib.repair_iob2([tag or "O" for tag in tags]) for tags in predicted]
  seen_gold = [[g for g, p in zip(s.tags, tags) if p is not None]
               for s, tags in zip(sentences, predicted)]
  seen = [tags_lib.repair_iob2([p for p in tags if p is not None]) for tags in predicted]
  return {"f1": tags_lib.entity_metrics([s.tags for s in sentences], every)["f1"],
          "f1_seen_words": tags_lib.entity_metrics(seen_gold, seen)["f1"]}


def hugging_face_tag_scores(init_from: str, data: str, seed: int, steps: int,
                            batch_size: int, max_length: int, learning_rate: float
                            ) -> dict[str, float]:
  """Dev entity F1 (see tag_scores) of transformers.Trainer with its defaults but the
  budget and 10% warmup, AutoModelForTokenClassification, the first piece of each word
  labelled (finetune_steps.tagged_features)."""
  import transformers  # pylint: disable=g-import-not-at-top
  directory = init_from.removeprefix("hf:")
  tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
  train_sentences = tagging.read_conll(f"{data}/train.txt")
  dev_sentences = tagging.read_conll(f"{data}/dev.txt")
  labels = sorted({tag for s in train_sentences for tag in s.tags},
                  key=lambda tag: (tag != "O", tag))  # the tag method's order
  transformers.set_seed(seed)
  model = transformers.AutoModelForTokenClassification.from_pretrained(
      directory, num_labels=len(labels))
  trainer = _trainer(model, tokenizer, finetune_steps.tagged_features(
                         tokenizer, train_sentences, labels, max_length),
                     seed, steps, batch_size, learning_rate, steps // 10,
                     transformers.DataCollatorForTokenClassification(tokenizer))
  trainer.train()
  dev = finetune_steps.tagged_features(tokenizer, dev_sentences, labels, max_length)
  logits = trainer.predict(dev).predictions
  predicted = []
  for sentence, row in zip(dev_sentences, logits):
    word_ids = tokenizer(sentence.words, is_split_into_words=True, truncation=True,
                         max_length=max_length).word_ids()
    predicted.append(word_predictions(word_ids, np.argmax(row[:len(word_ids)], -1),
                                      len(sentence.words), labels))
  return tag_scores(dev_sentences, predicted)


def main(argv) -> None:
  del argv
  method, seeds = FLAGS.method, over_seeds.parse(FLAGS.seeds)
  recipe = configs.get(f"finetune:{method}")
  steps = FLAGS.steps or recipe.train.steps
  learning_rate = FLAGS.learning_rate or recipe.optimizer.learning_rate
  buckets = tuple(int(b) for b in FLAGS.length_buckets.split(",") if b)
  batch_size, max_length = recipe.train.batch_size, finetune_steps.SEQ_LENGTH
  results = collections.defaultdict(list)  # {side and scoring: a figure per seed}
  for seed in seeds:
    start = time.perf_counter()
    config = encoderx_config(method, FLAGS.init_from, FLAGS.data, seed, steps, buckets,
                             learning_rate)
    figures = {f"encoderx_{k}": v for k, v in (
        encoderx_tag_scores if method == "tag" else encoderx_accuracy)(config).items()}
    middle = time.perf_counter()
    hugging_face = (hugging_face_tag_scores if method == "tag" else hugging_face_accuracy)
    figures.update({f"hugging_face_{k}": v for k, v in hugging_face(
        FLAGS.init_from, FLAGS.data, seed, steps, batch_size, max_length,
        learning_rate).items()})
    for name, value in figures.items():
      results[name].append(value)
    print(f"seed {seed}: " + ", ".join(f"{k} {v:.4f}" for k, v in figures.items())
          + f" (encoderx {middle - start:.0f} s, Hugging Face Trainer "
          f"{time.perf_counter() - middle:.0f} s)", flush=True)
  over_seeds.report(results, {
      "method": method, "steps": steps, "batch_size": batch_size, "max_length": max_length,
      "learning_rate": learning_rate, "seeds": seeds, "length_buckets": buckets},
      FLAGS.output)


if __name__ == "__main__":
  flags.DEFINE_enum("method", "classify", list(METHODS), "The recipe compared.")
  flags.DEFINE_string("init_from", None, "hf:DIR, a Hugging Face model directory.")
  flags.DEFINE_string("data", None, "classify: a directory with train.tsv and dev.tsv "
                      "(label, text); tag: with train.txt and dev.txt (CoNLL columns).")
  flags.DEFINE_string("seeds", "0,1,2", "Comma-separated seeds.")
  flags.DEFINE_integer("steps", 0, "Steps of both (default: the recipe's).")
  flags.DEFINE_float("learning_rate", 0.0, "Both sides' peak (default: the recipe's).")
  flags.DEFINE_string("output", "", "Where to write the figures as JSON.")
  flags.DEFINE_string("length_buckets", "", "encoderx's finetune.length_buckets, e.g. 32,48.")
  flags.mark_flags_as_required(["init_from", "data"])
  app.run(main)
  sys.exit(0)

"""Equal-budget embedding training: encoderx's contrastive method beside
sentence-transformers' own trainer, from the same released model, on the same pairs,
both trained models scored by the same code.

    python -m encoderx.tools.quality.embedding_compare --init_from=hf:MODEL_DIR \
        --data=../shared/corpora/stsb --seeds=0,1,2 [--steps=0] [--batch_size=64] \
        [--max_length=128] [--learning_rate=2e-5] [--output=compare.json]

The data (--data: STS-B's train.tsv, dev.tsv and test.tsv, columns score, text_a,
text_b): the training rows are train.tsv's pairs scored 4 or more (1,406 of its 5,749
in ../shared/corpora/stsb) as (anchor, positive) = (text_a, text_b), written to a
temporary train.tsv in the columns the contrastive method reads. --steps=0 (the default)
trains one epoch's full batches: 1,406 // 64 = 21 steps of 64 pairs.

encoderx: configs/embedding.py:mnrl (sentence-transformers' MultipleNegativesRankingLoss
over the batch: cosine at scale 20, mean pooling; every other positive of the batch a
negative) through `train.run`, --init_from the model, train.seed = seed, at the budget
(steps, batch size, length, peak learning rate), its warmup kept at 10% of the steps
(the recipe's 100 of 1,000), scored once at the end (dev.tsv's Spearman: the method
requires a dev file; the final model is the one compared). Its sampler keeps a text from
appearing twice in a batch (contrastive.no_duplicates, on by default).

sentence-transformers 6.2.0: `SentenceTransformer(MODEL_DIR)` trained by
`SentenceTransformerTrainer` (st_trainer.py: the package `datasets` stood in for) with
`MultipleNegativesRankingLoss(model)` (its defaults: scale 20, cosine) and
`SentenceTransformerTrainingArguments` at their defaults but for the budget: max_steps,
per_device_train_batch_size, learning_rate, model.max_seq_length, seed = seed, and
batch_sampler=NO_DUPLICATES (NoDuplicatesBatchSampler, as encoderx's sampler). Saved with
`model.save` (its vocab.txt copied from MODEL_DIR: transformers 5 saves tokenizer.json
only; training does not change the vocabulary).

What still differs (encoderx's recipe | sentence-transformers' defaults): warmup 10% of
the steps (2 of 21) | none; weight decay 0.01 (not on biases and LayerNorms) | 0; Adam
eps 1e-6 | 1e-8. The same on both: linear decay to 0, AdamW betas (0.9, 0.999),
clipping at 1.0, scale 20, mean pooling over the real tokens, the model's dropout (0.1),
fp32. Each pads its own way (encoderx to --max_length, sentence-transformers to a
batch's longest text; the padding is masked). The two draw different batch orders from
their seeds: the seeds say how far apart runs of one side fall.

Scoring, the same code for both trained models and for the untrained start (scored
once): `embed.Embedder` (mean pooling, normalized, --max_length) of encoderx's run
directory and of the sentence-transformers model's saved directory (hf:DIR);
retrieval nDCG@10, MRR@10 and Recall@100 (`retrieval.evaluate`) on the set in BEIR's
layout that retrieval_compare.write_stsb_set builds from test.tsv (each distinct
text_b a document, each text_a of a pair scored >= 4 a query: a file not trained on),
and STS-B test Spearman of the pairs' cosines (sts_compare.correlations). Printed and
written: each seed's figures and each side's training time (encoderx's includes
compiling its step and its dev evaluation; sentence-transformers' its loading and
saving), the median and range over the seeds.
"""
from __future__ import annotations

import collections
import os
import shutil
import tempfile
import time

import numpy as np
from absl import app, flags

from encoderx import configs, embed, retrieval, train
from encoderx.data import beir
from encoderx.tools.parity import retrieval_compare, sts_compare
from encoderx.tools.quality import over_seeds, st_trainer

FLAGS = flags.FLAGS
RECIPE = "embedding:mnrl"
RETRIEVAL_METRICS = ("ndcg@10", "mrr@10", "recall@100")
SIDES = ("encoderx", "sentence_transformers")


def training_pairs(path: str, threshold: float = retrieval_compare.RELEVANT
                   ) -> list[tuple[str, str]]:
  """(text_a, text_b) of the STS TSV's pairs scored `threshold` or more."""
  first, second, gold = sts_compare.read_pairs(path)
  return [(a, b) for a, b, score in zip(first, second, gold) if score >= threshold]


def write_pairs(pairs: list[tuple[str, str]], directory: str) -> str:
  """The pairs as a TSV of (anchor, positive) in `directory`; its path."""
  path = os.path.join(directory, "train.tsv")
  with open(path, "w", encoding="utf-8") as f:
    f.write("anchor\tpositive\n")
    f.writelines(f"{anchor}\t{positive}\n" for anchor, positive in pairs)
  return path


def encoderx_config(init_from: str, train_file: str, dev_file: str, seed: int, steps: int,
                    batch_size: int, max_length: int, learning_rate: float):
  """configs/embedding.py:mnrl at the budget, 10% warmup, scored once at the end."""
  config = configs.get(RECIPE)
  config.init_from = init_from
  config.finetune.train_file, config.finetune.dev_file = train_file, dev_file
  config.data.seq_length = max_length
  config.train.seed, config.train.steps, config.train.batch_size = seed, steps, batch_size
  config.optimizer.learning_rate = learning_rate
  config.optimizer.warmup_steps = steps // 10
  config.eval.every_steps, config.eval.best_metric = 0, ""
  config.eval.batch_size = 64  # the recipe's 256 at length 128 holds ~7 GB on a CPU host
  config.checkpoint.every_steps = steps
  return config


def train_sentence_transformers(init_from: str, pairs: list[tuple[str, str]], seed: int,
                                steps: int, batch_size: int, max_length: int,
                                learning_rate: float, output: str) -> None:
  """SentenceTransformerTrainer with its defaults but the budget (the module docstring);
  the trained model saved to `output`."""
  import torch  # pylint: disable=g-import-not-at-top
  trainer_class = st_trainer.trainer_class()
  from sentence_transformers import SentenceTransformer, SentenceTransformerTrainingArguments  # pylint: disable=g-import-not-at-top
  from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss  # pylint: disable=g-import-not-at-top
  from sentence_transformers.base.sampler import BatchSamplers  # pylint: disable=g-import-not-at-top
  directory = init_from.removeprefix("hf:")
  model = SentenceTransformer(directory, device="cpu")
  model.max_seq_length = max_length
  data = st_trainer.Dataset.from_dict({"anchor": [a for a, _ in pairs],
                                       "positive": [p for _, p in pairs]})
  arguments = SentenceTransformerTrainingArguments(
      output_dir=tempfile.mkdtemp(), max_steps=steps, per_device_train_batch_size=batch_size,
      learning_rate=learning_rate, seed=seed, batch_sampler=BatchSamplers.NO_DUPLICATES,
      report_to="none", save_strategy="no", logging_steps=max(steps // 10, 1),
      use_cpu=not torch.cuda.is_available())
  trainer_class(model=model, args=arguments, train_dataset=data,
                loss=MultipleNegativesRankingLoss(model)).train()
  model.save(output, create_model_card=False)
  shutil.copy(os.path.join(directory, "vocab.txt"), output)


def model_scores(init_from: str, collection: beir.Collection,
                 sts_pairs: tuple[list[str], list[str], np.ndarray],
                 max_length: int) -> dict[str, float]:
  """Retrieval nDCG@10, MRR@10, Recall@100 on `collection` and the Spearman of STS pairs
  (sts_compare.read_pairs) of the model `init_from` (a run's directory or hf:DIR),
  embedded alike."""
  embedder = embed.Embedder(init_from, pooling="mean", normalize=True, max_length=max_length)
  found = retrieval.evaluate(embedder, collection)
  return {**{name: found[name] for name in RETRIEVAL_METRICS},
          "spearman": sts_compare.correlations(embedder, sts_pairs)["spearman"]}


def compare(init_from: str, data: str, seeds: list[int], steps: int, batch_size: int,
            max_length: int, learning_rate: float, keep: str = "", devices=None) -> dict:
  """{"start": the untrained model's scores, "steps": the steps trained, "seeds": {seed:
  {side: its scores and "seconds"}}}; each side's trained model is kept under `keep`
  (encoderx-SEED: a run's directory, sentence_transformers-SEED: a model's) if given;
  encoderx trains on `devices` (default: all)."""
  pairs = training_pairs(os.path.join(data, "train.tsv"))
  steps = steps or len(pairs) // batch_size
  work = tempfile.mkdtemp()
  models = keep or work
  try:
    train_file = write_pairs(pairs, work)
    collection = retrieval_compare.write_stsb_set(os.path.join(data, "test.tsv"),
                                                  os.path.join(work, "retrieval"))
    sts_pairs = sts_compare.read_pairs(os.path.join(data, "test.tsv"))
    score = lambda model: model_scores(model, collection, sts_pairs, max_length)
    result = {"start": score(init_from), "steps": steps, "pairs": len(pairs),
              "seeds": {}}
    print("untrained start: " + ", ".join(f"{k} {v:.4f}" for k, v in result["start"].items()),
          flush=True)
    for seed in seeds:
      encoderx_run = os.path.join(models, f"encoderx-{seed}")
      st_model = os.path.join(models, f"sentence_transformers-{seed}")
      start = time.perf_counter()
      train.run(encoderx_config(init_from, train_file, os.path.join(data, "dev.tsv"), seed,
                                steps, batch_size, max_length, learning_rate),
                encoderx_run, show_progress=False, devices=devices)
      middle = time.perf_counter()
      train_sentence_transformers(init_from, pairs, seed, steps, batch_size, max_length,
                                  learning_rate, st_model)
      end = time.perf_counter()
      result["seeds"][seed] = {
          "encoderx": {**score(encoderx_run), "seconds": middle - start},
          "sentence_transformers": {**score(f"hf:{st_model}"), "seconds": end - middle}}
      print(f"seed {seed}: " + "; ".join(
          f"{side} " + ", ".join(f"{k} {v:.4f}" if k != "seconds" else f"{v:.0f} s"
                                 for k, v in result["seeds"][seed][side].items())
          for side in SIDES), flush=True)
    return result
  finally:
    shutil.rmtree(work, ignore_errors=True)


def main(argv) -> None:
  del argv
  recipe = configs.get(RECIPE)
  learning_rate = FLAGS.learning_rate or recipe.optimizer.learning_rate
  seeds = over_seeds.parse(FLAGS.seeds)
  result = compare(FLAGS.init_from, FLAGS.data, seeds, FLAGS.steps, FLAGS.batch_size,
                   FLAGS.max_length, learning_rate, FLAGS.keep)
  figures = collections.defaultdict(list)  # {side_figure: a value per seed}
  for per_side in result["seeds"].values():
    for side, values in per_side.items():
      for name, value in values.items():
        figures[f"{side}_{name}"].append(value)
  over_seeds.report(figures, {
      "init_from": FLAGS.init_from, "data": FLAGS.data, "steps": result["steps"],
      "pairs": result["pairs"], "batch_size": FLAGS.batch_size,
      "max_length": FLAGS.max_length, "learning_rate": learning_rate, "seeds": seeds,
      "start": result["start"]}, FLAGS.output)


if __name__ == "__main__":
  flags.DEFINE_string("init_from", None, "hf:DIR, a sentence-transformers model directory.")
  flags.DEFINE_string("data", None, "A directory with STS-B's train.tsv, dev.tsv and "
                      "test.tsv (score, text_a, text_b).")
  flags.DEFINE_string("seeds", "0,1,2", "Comma-separated seeds.")
  flags.DEFINE_integer("steps", 0, "Steps of both (default: one epoch's full batches).")
  flags.DEFINE_integer("batch_size", 64, "Pairs a step, both sides.")
  flags.DEFINE_integer("max_length", 128, "Tokens per text at most, both sides.")
  flags.DEFINE_float("learning_rate", 0.0, "Both sides' peak (default: the recipe's).")
  flags.DEFINE_string("keep", "", "Keep each seed's trained models in this directory.")
  flags.DEFINE_string("output", "", "Where to write the figures as JSON.")
  flags.mark_flags_as_required(["init_from", "data"])
  app.run(main)

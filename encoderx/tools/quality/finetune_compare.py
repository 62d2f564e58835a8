"""Equal-budget fine-tuning: encoderx's classify recipe beside Hugging Face's `Trainer`
with its defaults, from the same pretrained encoder, the same steps and batch size.

    python -m encoderx.tools.quality.finetune_compare --init_from=hf:MODEL_DIR \
        --data=../shared/corpora/rotten_tomatoes --seeds=0,1,2 [--steps=700] \
        [--output=compare.json] [--length_buckets=32,48]

For each seed: encoderx trains configs/finetune.py:classify,data=DIR (AdamW at 5e-5, 10%
warmup then linear decay, weight decay 0.01 but on biases and LayerNorms, Adam eps 1e-6,
clipping at 1.0, batch 32, length 64, the pooled [CLS] with dropout 0.1) with
train.seed = seed; Hugging Face trains AutoModelForSequenceClassification from the same
directory with `transformers.Trainer` and `TrainingArguments`' defaults (AdamW at 5e-5,
no warmup, linear decay, no weight decay, Adam eps 1e-8, clipping at 1.0, seed = seed)
but for the budget: the same steps and batch size, and texts cut at the same length
(BertTokenizer, dynamic padding). Both are scored once, at the end, on the whole dev
file: accuracy (scikit-learn). Printed and written: each seed's accuracy, the median and
the spread, and each side's time end to end (encoderx's includes compiling its steps).
The two see different batch orders and head initializations: the seeds say how far apart
runs of one side fall. --length_buckets sets encoderx's finetune.length_buckets (each batch
cut to the shortest bucket holding its longest text, as Hugging Face pads each batch to
its longest).
"""
from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time

import numpy as np
from absl import app, flags

from encoderx import configs, train
from encoderx.evaluation import scores
from encoderx.tools.speed import finetune_steps

FLAGS = flags.FLAGS


def encoderx_accuracy(init_from: str, data: str, seed: int, steps: int,
                      length_buckets: tuple[int, ...] = ()) -> float:
  """Dev accuracy of configs/finetune.py:classify (its warmup kept at 10% of `steps`)."""
  config = configs.get(f"finetune:classify,data={data}")
  config.init_from, config.finetune.length_buckets = init_from, length_buckets
  config.train.seed, config.train.steps = seed, steps
  config.optimizer.warmup_steps = steps // 10
  config.eval.every_steps, config.eval.best_metric = 0, ""  # the final model, as HF's
  with tempfile.TemporaryDirectory() as workdir:
    return train.run(config, workdir)["eval"]["accuracy"]


def hugging_face_accuracy(init_from: str, data: str, seed: int, steps: int,
                          batch_size: int, max_length: int) -> float:
  """Dev accuracy of transformers.Trainer with its defaults (see the module doc)."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  directory = init_from.removeprefix("hf:")  # a Hugging Face directory
  tokenizer = transformers.AutoTokenizer.from_pretrained(directory)

  def examples(name: str) -> list[dict]:
    return finetune_steps.classified_features(tokenizer, f"{data}/{name}", max_length)

  transformers.set_seed(seed)  # the new head's initialization
  model = transformers.AutoModelForSequenceClassification.from_pretrained(directory,
                                                                          num_labels=2)
  with tempfile.TemporaryDirectory() as output:
    arguments = transformers.TrainingArguments(
        output_dir=output, max_steps=steps, per_device_train_batch_size=batch_size,
        per_device_eval_batch_size=64, seed=seed, report_to="none", save_strategy="no",
        logging_steps=max(steps // 10, 1), use_cpu=not torch.cuda.is_available())
    trainer = transformers.Trainer(model=model, args=arguments,
                                   train_dataset=examples("train.tsv"),
                                   processing_class=tokenizer)
    trainer.train()
    prediction = trainer.predict(examples("dev.tsv"))
  return scores.classification_metrics(prediction.label_ids,
                                       np.argmax(prediction.predictions, -1), 2)["accuracy"]


def describe(values: list[float]) -> dict:
  return {"accuracy": values, "median": statistics.median(values),
          "min": min(values), "max": max(values)}


def main(argv) -> None:
  del argv
  seeds = [int(s) for s in FLAGS.seeds.split(",")]
  recipe = configs.get("finetune:classify")
  steps = FLAGS.steps or recipe.train.steps
  buckets = tuple(int(b) for b in FLAGS.length_buckets.split(",") if b)
  results = {"encoderx": [], "hugging_face": []}
  for seed in seeds:
    start = time.perf_counter()
    results["encoderx"].append(encoderx_accuracy(FLAGS.init_from, FLAGS.data, seed, steps,
                                                 buckets))
    middle = time.perf_counter()
    results["hugging_face"].append(hugging_face_accuracy(
        FLAGS.init_from, FLAGS.data, seed, steps, recipe.train.batch_size,
        recipe.data.seq_length))
    print(f"seed {seed}: encoderx {results['encoderx'][-1]:.4f} ({middle - start:.0f} s), "
          f"Hugging Face Trainer {results['hugging_face'][-1]:.4f} "
          f"({time.perf_counter() - middle:.0f} s)", flush=True)
  summary = {"steps": steps, "batch_size": recipe.train.batch_size,
             "max_length": recipe.data.seq_length, "seeds": seeds,
             "length_buckets": buckets,
             **{side: describe(values) for side, values in results.items()}}
  for side in ("encoderx", "hugging_face"):
    print(f"{side}: median accuracy {summary[side]['median']:.4f} "
          f"({summary[side]['min']:.4f} .. {summary[side]['max']:.4f})")
  if FLAGS.output:
    with open(FLAGS.output, "w", encoding="utf-8") as f:
      json.dump(summary, f, indent=2)


if __name__ == "__main__":
  flags.DEFINE_string("init_from", None, "hf:DIR, a Hugging Face model directory.")
  flags.DEFINE_string("data", None, "A directory with train.tsv and dev.tsv (label, text).")
  flags.DEFINE_string("seeds", "0,1,2", "Comma-separated seeds.")
  flags.DEFINE_integer("steps", 0, "Steps of both (default: the classify recipe's).")
  flags.DEFINE_string("output", "", "Where to write the figures as JSON.")
  flags.DEFINE_string("length_buckets", "", "encoderx's finetune.length_buckets, e.g. 32,48.")
  flags.mark_flags_as_required(["init_from", "data"])
  app.run(main)
  sys.exit(0)

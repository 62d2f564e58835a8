"""Sentence-pair regression (STS-B), BERT's GLUE recipe: a linear score on the pooled
[CLS] of [CLS] A [SEP] B [SEP], mean squared error, AdamW at 2e-5 with 10% warmup,
batch 32, 3 epochs, best dev Spearman kept.

    python -m encoderx.train --config=configs/finetune_similarity.py:DATA_DIR \
        --workdir=runs/sts --init_from=hf:MODEL_DIR   # or a pretraining work dir

DATA_DIR holds train.tsv and dev.tsv with columns score, text_a, text_b (e.g.
../shared/corpora/stsb).
"""
import os

from encoderx import config as base


def get_config(data_dir: str = ""):
  config = base.default_config()
  config.method = "similarity"
  if data_dir:
    config.finetune.train_file = os.path.join(data_dir, "train.tsv")
    config.finetune.dev_file = os.path.join(data_dir, "dev.tsv")
  config.finetune.text_column = "text_a"
  config.finetune.text_pair_column = "text_b"
  config.finetune.label_column = "score"
  config.data.seq_length = 128
  config.data.shuffle_buffer = 10_000
  config.optimizer.learning_rate = 2e-5
  config.optimizer.warmup_steps = 54
  config.optimizer.weight_decay = 0.01
  config.train.steps = 540  # 3 epochs of 5,749 pairs at batch 32
  config.train.batch_size = 32
  config.train.log_every = 20
  config.eval.every_steps = 90
  config.eval.batches = 0
  config.eval.batch_size = 64
  config.eval.best_metric = "spearman"
  config.checkpoint.every_steps = 90
  config.checkpoint.keep = 2
  return config

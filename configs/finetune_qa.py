"""Extractive question answering (SQuAD v1.1; v2.0 with finetune.version_2=True),
BERT's run_squad.py recipe: 384-token windows with a 128-token document stride,
questions cut at 64 tokens, answers at most 30 tokens from the 20 best starts and ends,
AdamW at 3e-5 with 10% warmup, batch 32, 2 epochs (SQuAD v1.1's 88k questions).

    python -m encoderx.train --config=configs/finetune_qa.py:DATA_DIR \
        --workdir=runs/qa --init_from=hf:MODEL_DIR   # or a pretraining work dir

DATA_DIR holds train.json and dev.json in SQuAD's format (train-v1.1.json and
dev-v1.1.json renamed). For TFDS instead: --config.data.tfds_name=squad/v1.1:3.0.0.
Predictions: --predict=dev.json writes predictions.json, the official script's input.
"""
import os

from encoderx import config as base


def get_config(data_dir: str = ""):
  config = base.default_config()
  config.method = "qa"
  if data_dir:
    config.finetune.train_file = os.path.join(data_dir, "train.json")
    config.finetune.dev_file = os.path.join(data_dir, "dev.json")
  config.data.tfds_train_split = "train"
  config.data.tfds_eval_split = "validation"
  config.data.seq_length = 384
  config.data.shuffle_buffer = 20_000
  config.optimizer.learning_rate = 3e-5
  config.optimizer.warmup_steps = 550
  config.optimizer.weight_decay = 0.01
  config.train.steps = 5_500  # about 2 epochs of 88k windows at batch 32
  config.train.batch_size = 32
  config.train.log_every = 50
  config.eval.every_steps = 0  # at the end: the whole dev set takes a while
  config.eval.batches = 0
  config.eval.batch_size = 64
  config.eval.best_metric = "f1"
  config.checkpoint.every_steps = 500
  config.checkpoint.keep = 2
  return config

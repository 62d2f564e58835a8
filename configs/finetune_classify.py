"""Sequence classification fine-tuning (single sentences, or pairs with
finetune.text_pair_column), BERT's fine-tuning recipe: AdamW at 5e-5, 10% warmup then
linear decay, batch 32, dropout 0.1 on the pooled [CLS], best dev accuracy kept.

Start from a pretrained encoder, whose sizes and vocabulary the run takes:

    python -m encoderx.train --config=configs/finetune_classify.py:DATA_DIR \
        --workdir=runs/classify --init_from=hf:MODEL_DIR   # or a pretraining work dir

DATA_DIR holds train.tsv and dev.tsv with columns `label` and `text` (e.g.
../shared/corpora/rotten_tomatoes); or set finetune.train_file / dev_file and the
column fields.
"""
import os

from encoderx import config as base


def get_config(data_dir: str = ""):
  config = base.default_config()
  config.method = "classify"
  if data_dir:
    config.finetune.train_file = os.path.join(data_dir, "train.tsv")
    config.finetune.dev_file = os.path.join(data_dir, "dev.tsv")
  config.finetune.text_column = "text"
  config.finetune.label_column = "label"
  config.data.seq_length = 64
  config.data.shuffle_buffer = 20_000
  config.optimizer.learning_rate = 5e-5
  config.optimizer.warmup_steps = 70
  config.optimizer.weight_decay = 0.01
  config.train.steps = 700  # about 2 epochs of 10,808 examples at batch 32
  config.train.batch_size = 32
  config.train.log_every = 20
  config.eval.every_steps = 100
  config.eval.batches = 0  # the whole dev file
  config.eval.batch_size = 64
  config.eval.best_metric = "accuracy"
  config.checkpoint.every_steps = 100
  config.checkpoint.keep = 2
  return config

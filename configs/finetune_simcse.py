"""SimCSE sentence embeddings (Gao et al. 2021), unsupervised by default: each training
sentence twice through dropout, in-batch negatives, temperature 0.05, AdamW at 3e-5,
batch 64, sequences of 32 tokens, mean pooling; best dev Spearman (cosine similarity of
the two embeddings against the STS score) kept. --config.finetune.simcse=supervised
trains on the rows' (text_a, text_b) pairs as positives instead.

    python -m encoderx.train --config=configs/finetune_simcse.py:DATA_DIR \
        --workdir=runs/simcse --init_from=hf:MODEL_DIR   # or a pretraining work dir
    python -m encoderx.embed --init_from=runs/simcse --input=FILE --output=FILE.npy

DATA_DIR holds train.tsv (sentences in text_a and text_b) and dev.tsv (STS pairs with a
score), e.g. ../shared/corpora/stsb.
"""
import os

from encoderx import config as base


def get_config(data_dir: str = ""):
  config = base.default_config()
  config.method = "simcse"
  if data_dir:
    config.finetune.train_file = os.path.join(data_dir, "train.tsv")
    config.finetune.dev_file = os.path.join(data_dir, "dev.tsv")
  config.finetune.text_column = "text_a"
  config.finetune.text_pair_column = "text_b"
  config.finetune.label_column = "score"
  config.finetune.pooling = "mean"
  config.finetune.simcse = "unsupervised"
  config.finetune.temperature = 0.05
  config.data.seq_length = 32
  config.data.shuffle_buffer = 20_000
  config.optimizer.learning_rate = 3e-5
  config.optimizer.warmup_steps = 0
  config.optimizer.weight_decay = 0.0
  config.train.steps = 170  # an epoch of the 10.9k distinct STS-B train sentences
  config.train.batch_size = 64
  config.train.log_every = 10
  config.eval.every_steps = 50
  config.eval.batches = 0
  config.eval.batch_size = 128
  config.eval.best_metric = "spearman"
  config.checkpoint.every_steps = 50
  config.checkpoint.keep = 2
  return config

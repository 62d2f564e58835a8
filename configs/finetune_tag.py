"""Token classification (NER) fine-tuning, BERT's CoNLL-2003 recipe at a shorter length:
AdamW at 5e-5, 10% warmup then linear decay, batch 32, dropout 0.1 before the tagger,
the first word piece of each word labelled, best dev entity F1 kept.

    python -m encoderx.train --config=configs/finetune_tag.py:DATA_DIR \
        --workdir=runs/tag --init_from=hf:MODEL_DIR   # or a pretraining work dir

DATA_DIR holds train.txt and dev.txt in CoNLL columns (token ... tag; a blank line
between sentences), e.g. ../shared/corpora/conll2003. For the TFDS dataset instead:
--config.data.tfds_name=conll2003:1.0.0 (features tokens and ner).
"""
import os

from encoderx import config as base


def get_config(data_dir: str = ""):
  config = base.default_config()
  config.method = "tag"
  if data_dir:
    config.finetune.train_file = os.path.join(data_dir, "train.txt")
    config.finetune.dev_file = os.path.join(data_dir, "dev.txt")
  config.finetune.text_column = "tokens"  # the TFDS features, when data.tfds_name is set
  config.finetune.label_column = "ner"
  config.data.seq_length = 128
  config.data.shuffle_buffer = 20_000
  config.optimizer.learning_rate = 5e-5
  config.optimizer.warmup_steps = 130
  config.optimizer.weight_decay = 0.01
  config.train.steps = 1_300  # about 3 epochs of 14,041 sentences at batch 32
  config.train.batch_size = 32
  config.train.log_every = 20
  config.eval.every_steps = 200
  config.eval.batches = 0  # the whole dev file
  config.eval.batch_size = 64
  config.eval.best_metric = "f1"
  config.checkpoint.every_steps = 200
  config.checkpoint.keep = 2
  return config

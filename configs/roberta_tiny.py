"""A tiny RoBERTa (2 layers, 128 hidden) pretrained with MLM on the bundled Austen text.

roberta_base's family choices (byte-level BPE, positions from 2, one token type, MLM
only on packed FULL-SENTENCES, Adam beta2 0.98) at bert_tiny's size, with the bundled
8,000-token byte-level BPE vocabulary: a few minutes on two CPU cores.
"""
from encoderx import config as base
from encoderx.data import resources
from encoderx.configs import roberta_base


def get_config():
  config = roberta_base.get_config()
  config.model.vocab_size = 0  # the vocabulary's: 8,000
  config.model.vocab_multiple = 1  # unpadded, as the recorded reference runs
  config.model.hidden_size = 128
  config.model.num_layers = 2
  config.model.num_heads = 2
  config.model.intermediate_size = 512
  config.model.max_position_embeddings = 130  # 128 + position_offset 2
  config.model.dtype = "float32"
  config.data.files = resources.BUNDLED_CORPUS
  config.data.document_marker = r"^\s*(CHAPTER|Chapter)\s+[0-9IVXLC]+"
  config.data.vocab.path = resources.BUNDLED_BPE_VOCAB
  config.data.seq_length = 128
  config.data.shuffle_buffer = 2000
  config.objective.mlm.max_predictions = 20
  config.optimizer.learning_rate = 2e-3
  config.optimizer.warmup_steps = 100
  config.optimizer.clip_norm = 1.0
  config.train.steps = 1000
  config.train.batch_size = 32
  config.train.grad_accum_steps = 1
  config.train.log_every = 20
  config.eval.batches = 10
  config.eval.batch_size = 32
  config.checkpoint.every_steps = 250
  return config

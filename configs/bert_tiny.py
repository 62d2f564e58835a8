"""A tiny BERT (2 layers, 128 hidden) pretrained with MLM + NSP on the bundled Austen text.

The default demo: a few minutes on two CPU cores, enough to watch MLM accuracy climb.
"""
from encoderx import config as base
from encoderx.data import resources


def get_config():
  config = base.default_config()
  config.model.hidden_size = 128
  config.model.num_layers = 2
  config.model.num_heads = 2
  config.model.intermediate_size = 512
  config.model.max_position_embeddings = 128
  config.data.files = resources.BUNDLED_CORPUS
  config.data.document_marker = r"^\s*(CHAPTER|Chapter)\s+[0-9IVXLC]+"
  config.data.seq_length = 128
  config.data.shuffle_buffer = 2000
  config.objective.mlm.max_predictions = 20
  config.optimizer.learning_rate = 2e-3
  config.optimizer.warmup_steps = 100
  config.optimizer.b2 = 0.98
  config.train.steps = 1000
  config.train.batch_size = 32
  config.train.log_every = 20
  config.eval.batches = 10
  config.eval.batch_size = 32
  config.checkpoint.every_steps = 250
  return config

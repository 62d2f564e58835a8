"""BERT-base (Devlin et al., 2019): 12 layers, 768 hidden, 12 heads, 110M parameters.

The paper's recipe: AdamW (lr 1e-4, beta2 0.999, weight decay 0.01 off LayerNorm and
biases), 10k warmup steps then linear decay, batch 256 for 1M steps, 90% of them at
length 128 and the last 10% at 512. Point data.files (or data.tfds_name) at your corpus
and data.vocab.path at a 30,522-entry vocab.txt.
"""
from encoderx import config as base


def get_config():
  config = base.default_config()
  config.model.vocab_size = 30522
  config.model.vocab_multiple = 128  # 30,592 rows: splits over a tensor axis
  config.model.hidden_size = 768
  config.model.num_layers = 12
  config.model.num_heads = 12
  config.model.intermediate_size = 3072
  config.model.max_position_embeddings = 512
  config.model.dtype = "bfloat16"
  config.train.steps = 1_000_000
  config.train.batch_size = 256
  config.train.long_fraction = 0.1
  config.train.long_seq_length = 512
  config.objective.mlm.long_max_predictions = 80
  config.optimizer.learning_rate = 1e-4
  config.optimizer.warmup_steps = 10_000
  config.optimizer.weight_decay = 0.01
  config.data.seq_length = 128
  config.objective.mlm.max_predictions = 20
  return config

"""ALBERT-base (Lan et al., 2020): 12 layers sharing one set of weights, 768 hidden, 12
heads, 128-wide factorized embeddings; about 12M parameters.

The paper's recipe: a 30,000-piece SentencePiece vocabulary, MLM + sentence-order
prediction, sequences of 512 (shorter with probability 0.1), batch 4096 for 125k steps,
LAMB with learning rate 0.00176 (3,125 warmup steps, then linear decay; weight decay
0.01 off LayerNorm and biases), gelu_new, and no dropout (albert-base-v2). Point
data.files (or data.tfds_name) at your corpus and data.vocab.path at a 30,000-piece
model from `python -m encoderx.data.sentencepiece_vocabulary --size 30000`.
"""
from encoderx import config as base
from encoderx.data import resources


def get_config():
  config = base.default_config()
  config.model.family = "albert"
  config.model.vocab_size = 30000
  config.model.vocab_multiple = 128  # 30,080 rows: splits over a tensor axis
  config.model.embedding_size = 128
  config.model.hidden_size = 768
  config.model.num_layers = 12
  config.model.num_heads = 12
  config.model.intermediate_size = 3072
  config.model.layer_sharing = "all"
  config.model.hidden_act = "gelu_new"
  config.model.max_position_embeddings = 512
  config.model.hidden_dropout = 0.0
  config.model.attention_dropout = 0.0
  config.model.dtype = "bfloat16"
  config.data.vocab.kind = "sentencepiece"
  config.data.vocab.path = resources.BUNDLED_SENTENCEPIECE_VOCAB  # replace with a 30k model
  config.data.seq_length = 512
  config.data.short_seq_prob = 0.1
  config.objective.names = ("mlm", "sop")
  # ALBERT masks n-grams of up to 3 whole words, p(n) proportional to 1/n.
  config.objective.mlm.unit = "ngram"
  config.objective.mlm.max_ngram = 3
  config.objective.mlm.max_predictions = 20  # google-research/albert's pretraining flag
  config.optimizer.name = "lamb"
  config.optimizer.learning_rate = 0.00176
  config.optimizer.warmup_steps = 3125
  config.optimizer.weight_decay = 0.01
  config.train.steps = 125_000
  config.train.batch_size = 4096
  return config

"""A tiny ALBERT (4 shared layers, 128 hidden, 64-wide embeddings) pretrained with
MLM + SOP on the bundled Austen text, with the bundled SentencePiece vocabulary.

Minutes on two CPU cores, like configs/bert_tiny.py, whose data and schedule it keeps.
"""
from encoderx import config as base
from encoderx.data import resources
from encoderx.configs import bert_tiny


def get_config():
  config = bert_tiny.get_config()
  config.model.family = "albert"
  config.model.embedding_size = 64
  config.model.num_layers = 4
  config.model.layer_sharing = "all"
  config.model.hidden_act = "gelu_new"
  config.data.vocab.kind = "sentencepiece"
  config.data.vocab.path = resources.BUNDLED_SENTENCEPIECE_VOCAB
  config.objective.names = ("mlm", "sop")
  config.objective.mlm.unit = "ngram"  # ALBERT's n-grams of up to 3 words
  config.objective.mlm.max_predictions = 24  # 15% of 128 plus room for the last n-gram
  config.optimizer.name = "lamb"
  config.optimizer.learning_rate = 2e-2  # LAMB: each step moves a layer by 2% of its norm
  return config

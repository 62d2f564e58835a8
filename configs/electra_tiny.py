"""A tiny ELECTRA on the bundled Austen text: configs/bert_tiny.py's discriminator (2
layers, 128 hidden) and a generator a quarter as wide (32 hidden, 1 head) sharing its
embeddings, trained by MLM + 50 x replaced-token detection on single-document rows.

ELECTRA-Small's recipe (configs/electra_small.py) at bert_tiny's sizes, data and schedule:
minutes on two CPU cores.
"""
from encoderx.configs import bert_tiny, electra_small


def get_config():
  config = electra_small.use_electra(bert_tiny.get_config(), generator_width=0.25)
  config.model.family = "electra"
  config.model.pooler_act = "gelu"  # a classifier's head, as ELECTRA fine-tunes
  return config

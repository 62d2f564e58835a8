"""BERT-large (Devlin et al., 2019): 24 layers, 1024 hidden, 16 heads, 340M parameters.

Same recipe as bert_base; layers are scanned and rematerialized to fit long sequences.
"""
from encoderx.configs import bert_base


def get_config():
  config = bert_base.get_config()
  config.model.hidden_size = 1024
  config.model.num_layers = 24
  config.model.num_heads = 16
  config.model.intermediate_size = 4096
  config.model.scan_layers = True
  config.model.remat = True
  return config

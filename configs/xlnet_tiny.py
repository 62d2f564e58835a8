"""A tiny XLNet (2 layers, 128 hidden, 2 heads) pretrained by permutation language
modelling on the bundled Austen text with the bundled SentencePiece vocabulary.

configs/xlnet_base.py's recipe at bert_tiny's sizes and length 128: rows whose first
64 tokens continue the previous step's, a memory of 96 tokens, orders permuting blocks
of 64, 22 prediction slots (1/6 of 128), bidirectional data; bert_tiny's optimizer and
schedule. Minutes on two CPU cores.
"""
from encoderx.configs import bert_tiny, xlnet_base


def get_config():
  config = xlnet_base.use_xlnet(bert_tiny.get_config())
  plm = config.objective.plm
  plm.num_predict = 22
  plm.reuse_len, plm.mem_len, plm.perm_size = 64, 96, 64
  plm.bi_data = True
  return config

"""A tiny DeBERTa (v2 architecture: disentangled attention, enhanced mask decoder)
pretrained with MLM on the bundled Austen text.

bert_tiny's sizes and schedule (2 layers, 128 hidden, 2 heads; 1,000 steps of 32 x 128
tokens) with DeBERTa's model and data choices (configs/deberta_base.py): relative
positions only, in log buckets (64 rows each side, distances beyond 32 shrunk up to 128:
the base model's 256 / 512 at this length's scale), absolute positions only in the
enhanced mask decoder, no token types, LayerNorm eps 1e-7, whole-word n-gram masking
(n <= 3) on packed rows of whole sentences, and the bundled SentencePiece vocabulary with
DeBERTa's special pieces (cased).
"""
from encoderx import config as base
from encoderx.data import resources
from encoderx.configs import bert_tiny


def get_config():
  config = bert_tiny.get_config()
  config.model.family = "deberta-v2"
  config.model.attention = "disentangled"
  config.model.position_embedding = "none"
  config.model.enhanced_mask_decoder = True
  config.model.position_buckets = 64
  config.model.max_relative_positions = 128
  config.model.type_vocab_size = 0
  config.model.layer_norm_eps = 1e-7
  config.data.vocab.kind = "sentencepiece"
  config.data.vocab.layout = "deberta"
  config.data.vocab.path = resources.BUNDLED_DEBERTA_SENTENCEPIECE_VOCAB
  config.data.vocab.lower_case = False
  config.data.vocab.strip_accents = False
  config.data.builder = "full_sentences"
  config.objective.names = ("mlm",)
  config.objective.mlm.unit = "ngram"  # DeBERTa's mlm.sh: --max_ngram 3
  config.objective.mlm.max_predictions = 24  # 15% of 128 plus room for the last n-gram
  return config

"""DeBERTa-base (He et al., 2021), the v2 architecture, pretrained with MLM.

The model of microsoft/DeBERTa's experiments/language_model/deberta_base.json (as
released for DeBERTa-v3-base, whose discriminator is this encoder): 12 layers, 768
hidden, 12 heads, 3072 FFN; disentangled attention with c2p and p2c terms, relative
distances in 256 log buckets up to 512, the position terms projected by the content
key/query projections (share_att_key), relative embeddings with their own LayerNorm,
LayerNorm eps 1e-7; no absolute positions in the encoder (position_biased_input=false),
which only the enhanced mask decoder adds before the MLM head; no token types; a
128,100-row SentencePiece vocabulary (deberta-v3's spm.model: 128,000 pieces, [MASK]
after them, padded to 128,100).

The recipe of that repository's mlm.sh deberta-base: MLM with whole-word n-gram masking
(n <= 3, p(n) ~ 1/n), 80 predictions per 512-token row (its max_preds_per_seq), rows of
512 tokens cut from running text (here: packed whole sentences, `full_sentences`),
Adam (lr 1e-4, beta2 0.999, eps 1e-6, weight decay 0.01, clipping at 1.0; its
optims/args.py defaults), 10k warmup steps then linear decay, batch 256 for 1M steps.

Point data.files (or data.tfds_name) at your corpus and data.vocab.path at deberta-v3's
spm.model (or one trained with `python -m encoderx.data.sentencepiece_vocabulary
--layout deberta --cased`).
"""
from encoderx import config as base
from encoderx.data import resources


def get_config():
  config = base.default_config()
  config.model.vocab_size = 128100
  config.model.vocab_multiple = 128  # 128,128 rows: splits over a tensor axis
  config.model.hidden_size = 768
  config.model.num_layers = 12
  config.model.num_heads = 12
  config.model.intermediate_size = 3072
  config.model.max_position_embeddings = 512
  config.model.family = "deberta-v2"
  config.model.attention = "disentangled"
  config.model.relative_attention_terms = ("c2p", "p2c")
  config.model.position_buckets = 256
  config.model.max_relative_positions = 512
  config.model.share_att_key = True
  config.model.position_embedding = "none"
  config.model.enhanced_mask_decoder = True
  config.model.type_vocab_size = 0
  config.model.layer_norm_eps = 1e-7
  config.model.dtype = "bfloat16"
  config.data.vocab.kind = "sentencepiece"
  config.data.vocab.layout = "deberta"
  config.data.vocab.path = resources.BUNDLED_DEBERTA_SENTENCEPIECE_VOCAB  # deberta-v3's spm.model
  config.data.vocab.lower_case = False
  config.data.vocab.strip_accents = False
  config.data.builder = "full_sentences"
  config.data.seq_length = 512
  config.objective.names = ("mlm",)
  config.objective.mlm.unit = "ngram"
  config.objective.mlm.max_predictions = 80
  config.train.steps = 1_000_000
  config.train.batch_size = 256
  config.optimizer.learning_rate = 1e-4
  config.optimizer.warmup_steps = 10_000
  config.optimizer.b2 = 0.999
  config.optimizer.eps = 1e-6
  config.optimizer.weight_decay = 0.01
  config.optimizer.clip_norm = 1.0
  return config

"""EuroBERT (Boizard et al., 2025, "EuroBERT: Scaling Multilingual Encoders for European
Languages"): a Llama-style encoder, pre-norm RMSNorm (eps 1e-5) without an embedding
norm, grouped-query attention (model.attention.num_kv_heads), a SwiGLU feed-forward, rotary
positions with theta 250,000, no biases, an MLM head scoring with a table of its own
(untied, no transform); byte-level BPE with Llama 3's special tokens
(<|begin_of_text|> A <|end_of_text|>, <|mask|>); MLM only on rows packed with whole
documents (attention kept inside each), every masked token replaced by <|mask|>.

    --config=configs/eurobert.py:VARIANT

tiny  2 layers, 128 hidden, 2 query heads sharing 1 key-value head, SwiGLU of 512, on
      the bundled Austen text and its 8,000-token byte-level BPE vocabulary with
      EuroBERT's special tokens: 1,000 steps of 32 x 128 tokens, a few minutes on two CPU
      cores.
210m  EuroBERT-210m (EuroBERT/EuroBERT-210m's config.json: 12 layers, 768 hidden, 12
      heads and 12 key-value heads, SwiGLU of 3,072, 128,256 tokens, untied lm_head). The
      pretraining phase: rows of 2,048 tokens, 50% masked (the paper; its annealing
      phase masks 10%), all of them replaced by <|mask|> (mask_probability 1.0 in
      EuroBERT's training framework, optimus/trainer/configuration/train.py, which also
      gives AdamW betas (0.9, 0.95), eps 1e-5, weight decay 0.1, clipping at 1.0 and a
      warmup-stable-decay schedule warming up over 1% of the steps), no dropout, peak lr
      3.6e-4, batch 4,608 rows (9.4M tokens). For now AdamW with warmup then linear
      decay: the warmup-stable-decay schedule and the annealing phase (10% masking,
      8,192-token rows) are another issue's. Point data.files at your corpus and
      data.vocab.path at EuroBERT's tokenizer (a directory with its tokenizer.json).
"""
from encoderx.configs import common
from encoderx.data import resources
from encoderx.hf import eurobert as hf_eurobert
from encoderx.models import model_config

VARIANTS = ("tiny", "210m")


def eurobert_choices(config):
  """What makes a config EuroBERT: its model fields, vocabulary and MLM."""
  model = config.model
  model.family = "eurobert"
  # Rotary, pre-norm RMSNorm, SwiGLU, no token types.
  model.update(model_config.nested(hf_eurobert.MODEL))
  model.hidden_act = "silu"
  model.attention.bias = model.feed_forward.bias = model.heads.decoder_bias = False
  model.heads.tie_word_embeddings = False
  model.norm.eps = 1e-5
  model.embeddings.rope_theta = 250_000.0
  model.heads.pooling = "late"  # EuroBertConfig's default
  model.init.scheme = "bert"
  model.init.cutoff = 0.0  # EuroBertPreTrainedModel: normal(0, 0.02), untruncated
  model.hidden_dropout = model.attention.dropout = 0.0
  config.data.vocab.kind = "byte_bpe"
  config.data.vocab.layout = "eurobert"
  config.data.vocab.path = resources.BUNDLED_EUROBERT_BPE_VOCAB
  config.data.builder = "full_sentences"
  config.data.packing = "best_fit"  # unpadded rows: documents cut to fill them
  config.objective.names = ("mlm",)
  config.objective.mlm.rate = 0.5
  config.objective.mlm.mask_token_prob = 1.0
  config.objective.mlm.random_token_prob = 0.0
  config.optimizer.b1, config.optimizer.b2, config.optimizer.eps = 0.9, 0.95, 1e-5
  config.optimizer.weight_decay = 0.1
  config.optimizer.clip_norm = 1.0
  return config


def get_config(arg: str = "tiny"):
  variant, _ = common.parse_arg(arg, VARIANTS)
  config = eurobert_choices(common.default_config())
  model = config.model
  if variant == "tiny":
    common.bundled_demo(common.tiny_sizes(config))
    model.attention.num_kv_heads = 1  # grouped-query attention: 2 query heads per key-value head
    model.embeddings.max_positions = 128
    config.objective.mlm.max_predictions = 68  # 50% of 128 is 64
    config.optimizer.b2 = 0.95
    return config
  model.num_layers, model.hidden_size, model.num_heads, model.intermediate_size = (
      12, 768, 12, 3072)
  model.attention.num_kv_heads = 12
  model.vocab_size = 128256
  model.embeddings.max_positions = 8192
  model.dtype = "bfloat16"
  model.layout.scan = True
  config.data.seq_length = 2048
  config.objective.mlm.max_predictions = 1040  # 50% of 2,048 is 1,024
  config.train.batch_size = 4608
  config.train.grad_accum_steps = 8
  config.train.steps = 500_000
  config.optimizer.learning_rate = 3.6e-4
  config.optimizer.warmup_steps = 5_000  # 1% of the steps
  return config

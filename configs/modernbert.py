"""ModernBERT (Warner et al., 2024, "Smarter, Better, Faster, Longer"): a pre-norm encoder
with rotary positions (theta per layer kind), a GeGLU feed-forward, local attention (a
window of 128 tokens) in every layer but each third, no biases but the MLM decoder's, an
embedding norm and a final norm, LayerNorm eps 1e-5, Megatron's init; byte-level BPE with
BERT's special tokens ([CLS] A [SEP] B [SEP], [MASK], [PAD], [UNK]); MLM only, 30% of
the tokens, on rows packed with whole sentences of documents (attention kept inside each
document: packing removes padding only), no dropout.

    --config=configs/modernbert.py:VARIANT

tiny      2 layers, 128 hidden, 2 heads, GeGLU of 512 (the other tiny configs' sizes), a
          local window of 64 in layer 1, on the bundled Austen text and its 8,000-token
          byte-level BPE vocabulary with ModernBERT's special tokens: 1,000 steps of
          32 x 128 tokens, a few minutes on two CPU cores.
base      ModernBERT-base: 22 layers, 768 hidden, 12 heads, GeGLU of 1,152, a 50,368-row
          vocabulary. The pretraining phase of AnswerDotAI/ModernBERT's
          yamls/modernbert/modernbert-base-pretrain.yaml: rows of 1,024 tokens packed,
          30% masked (80% [MASK], 10% random, 10% kept), rotary theta 10,000 in every
          layer, batch 4,608 rows, 1.719T tokens (364k steps), warmup over 3B tokens (636
          steps), peak lr 8e-4, betas (0.9, 0.98), eps 1e-6, decoupled weight decay 1e-5
          (optax's AdamW multiplies its decay by the learning rate: 1e-5 / 8e-4 = 0.0125
          here), off norms and biases, dropout 0 (the yaml's 0.1 after the attention
          output has no field here, nor in Hugging Face's ModernBertConfig). For now
          AdamW with warmup then linear decay: StableAdamW, the warmup-stable-decay
          schedule, the batch-size warmup and the later phases (context extension to
          8,192 with global theta 160,000 as released, the decay) are another issue's.
          Point data.files at your corpus and data.vocab.path at ModernBERT's tokenizer
          (a directory with its tokenizer.json).
large     ModernBERT-large: 28 layers, 1,024 hidden, 16 heads, GeGLU of 2,624; base's
          recipe (the paper's large peak lr, 5e-4).
rtd_tiny  tiny's encoder trained as ELECTRA with DeBERTa-v3's settings (method 'electra',
          configs/deberta.py use_deberta_v3): a generator half as deep at the same width,
          trained by MLM; gradient-disentangled embedding sharing (the discriminator's
          word embedding is stop_gradient(the generator's) + its own delta); decoupled
          updates; 15% masked; loss MLM + 10 x replaced-token BCE. The discriminator
          exports as a ModernBertModel.
rtd_base  base's encoder as that discriminator (a generator of 11 layers), on base's data
          and schedule.
"""
from encoderx.configs import common, deberta
from encoderx.data import resources
from encoderx.hf import modernbert as hf_modernbert

VARIANTS = ("tiny", "base", "large", "rtd_tiny", "rtd_base")
# Layers, hidden size, heads, GeGLU width of the released sizes (ModernBertConfig's
# defaults are base's; large from answerdotai/ModernBERT-large's config.json).
SIZES = {"base": (22, 768, 12, 1152), "large": (28, 1024, 16, 2624)}


def modernbert_choices(config):
  """What makes a config ModernBERT: its model fields, vocabulary and MLM."""
  model = config.model
  model.family = "modernbert"
  model.update(hf_modernbert.MODEL)  # rotary, pre-norm LayerNorm, GeGLU, no token types
  model.hidden_act = model.pooler_act = "gelu"
  model.attention_bias = model.mlp_bias = model.norm_bias = False
  model.classifier_bias = False
  model.decoder_bias = True
  model.tie_word_embeddings = True
  model.layer_norm_eps = 1e-5
  model.rope_theta = model.local_rope_theta = 10_000.0
  model.local_attention = 128
  model.global_attention_every = 3
  model.initializer = "megatron"
  model.initializer_cutoff = 2.0
  model.hidden_dropout = model.attention_dropout = 0.0
  config.data.vocab.kind = "byte_bpe"
  config.data.vocab.layout = "bert"
  config.data.vocab.path = resources.BUNDLED_MODERNBERT_BPE_VOCAB
  config.data.builder = "full_sentences"
  config.objective.names = ("mlm",)
  config.objective.mlm.rate = 0.3
  return config


def paper_recipe(config, size: str):
  """The released size and the pretraining phase's recipe (module docstring)."""
  model = config.model
  model.num_layers, model.hidden_size, model.num_heads, model.intermediate_size = SIZES[size]
  model.vocab_size = 50368
  model.max_position_embeddings = 8192
  model.dtype = "bfloat16"
  model.scan_layers = True
  config.data.seq_length = 1024
  config.objective.mlm.max_predictions = 320  # 30% of 1,024 is 307
  config.train.batch_size = 4608
  config.train.grad_accum_steps = 4
  config.train.steps = 364_000
  config.optimizer.learning_rate = 8e-4 if size == "base" else 5e-4
  config.optimizer.warmup_steps = 636
  config.optimizer.b1, config.optimizer.b2, config.optimizer.eps = 0.9, 0.98, 1e-6
  config.optimizer.weight_decay = 1e-5 / config.optimizer.learning_rate
  config.optimizer.clip_norm = 0.0  # the yaml clips nothing
  return config


def get_config(arg: str = "tiny"):
  variant, _ = common.parse_arg(arg, VARIANTS)
  size = variant.removeprefix("rtd_")
  config = modernbert_choices(common.default_config())
  if size == "tiny":
    common.bundled_demo(common.tiny_sizes(config))
    config.model.local_attention = 64  # the window of 128 would see all of 128 tokens
    config.model.max_position_embeddings = 128
    config.objective.mlm.max_predictions = 40  # 30% of 128 is 38
  else:
    paper_recipe(config, size)
  if variant.startswith("rtd_"):
    deberta.use_deberta_v3(config)
    config.objective.mlm.rate = 0.15  # DeBERTa-v3's RTD masks 15% (rtd.sh), as ELECTRA
  return config

"""ModernBERT (Warner et al., 2024, "Smarter, Better, Faster, Longer"): a pre-norm encoder
with rotary positions (theta per layer kind), a GeGLU feed-forward, local attention (a
window of 128 tokens) in every layer but each third, no biases but the MLM decoder's, an
embedding norm and a final norm, LayerNorm eps 1e-5, Megatron's init; byte-level BPE with
BERT's special tokens ([CLS] A [SEP] B [SEP], [MASK], [PAD], [UNK]); MLM only, 30% of
the tokens, on rows filled by best-fit packing of documents cut to the row's length
(attention and rotary positions kept inside each piece: little of a row is padding,
as ModernBERT's unpadded rows; data.packing), no dropout.

    --config=configs/modernbert.py:VARIANT

Sizes: tiny (2 layers, 128 hidden, 2 heads, GeGLU of 512, a local window of 64, on the
bundled Austen text and its 8,000-token byte-level BPE vocabulary with ModernBERT's
special tokens; minutes on two CPU cores), base (22 layers, 768 hidden, 12 heads, GeGLU
of 1,152, 50,368 tokens) and large (28 layers, 1,024 hidden, 16 heads, GeGLU of 2,624).
For base and large, point data.files at your corpus and data.vocab.path at ModernBERT's
tokenizer (a directory with its tokenizer.json).

The recipe (AnswerDotAI/ModernBERT yamls/modernbert/modernbert-base-pretrain.yaml,
-context-extension.yaml, -learning-rate-decay.yaml), as three runs, each from the last's
checkpoint (docs/guides/recipes.md):

  base, large               pretraining at 1,024 tokens: 1.719T tokens of batch 4,608
                            (~364k steps) after a batch-size warmup, StableAdamW (lr 8e-4,
                            large 5e-4, betas 0.9 / 0.98, eps 1e-6, weight decay 1e-5
                            fully decoupled, no gradient clipping), warmup 3B tokens then
                            stable (WSD with no decay), 30% masking, evaluated at 15%,
                            rotary theta 10,000
  base_context_extension    --init_from=RUN/checkpoints/STEP: 8,192 tokens, global theta
                            160,000 (local 10,000), constant lr 3e-4, batch 576, 250B
                            tokens; the optimizer state carried over
  base_decay                --init_from=RUN/checkpoints/STEP: 1-sqrt decay of lr 3e-4 to
                            0.001x over 50B tokens at 8,192; the optimizer state carried
  tiny, tiny_context_extension, tiny_decay   the same three at tiny size: 128 tokens
                            (600 steps), then 512 tokens (200 steps), then the decay
                            (200 steps)

Token budgets are turned into steps at the phase's batch and length; ModernBERT's
batch-size warmup (50B tokens from its micro-batch size) becomes sizes 768 ... 3,840 over
the first 18,000 steps (configs/common.py: batch_size_warmup).

ELECTRA over ModernBERT:

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
from encoderx.models import model_config

PHASES = ("", "context_extension", "decay")
VARIANTS = (tuple(size + (f"_{phase}" if phase else "") for size in ("tiny", "base")
                  for phase in PHASES) + ("large", "rtd_tiny", "rtd_base"))
# Layers, hidden size, heads, GeGLU width of the released sizes (ModernBertConfig's
# defaults are base's; large from answerdotai/ModernBERT-large's config.json).
SIZES = {"base": (22, 768, 12, 1152), "large": (28, 1024, 16, 2624)}


def modernbert_choices(config):
  """What makes a config ModernBERT: its model fields, vocabulary and MLM."""
  model = config.model
  model.family = "modernbert"
  # Rotary, pre-norm LayerNorm, GeGLU, no token types.
  model.update(model_config.nested(hf_modernbert.MODEL))
  model.hidden_act = model.heads.pooler_act = "gelu"
  model.attention.bias = model.feed_forward.bias = model.norm.bias = False
  model.heads.classifier_bias = False
  model.heads.decoder_bias = True
  model.heads.tie_word_embeddings = True
  model.norm.eps = 1e-5
  model.embeddings.rope_theta = 10_000.0
  model.embeddings.local_rope_theta = 0.0  # 0: the global theta
  model.attention.window = 128
  model.attention.global_every = 3
  model.init.scheme = "megatron"
  model.init.cutoff = 2.0
  model.hidden_dropout = model.attention.dropout = 0.0
  config.data.vocab.kind = "byte_bpe"
  config.data.vocab.layout = "bert"
  config.data.vocab.path = resources.BUNDLED_MODERNBERT_BPE_VOCAB
  config.data.builder = "full_sentences"
  config.data.packing = "best_fit"  # unpadded rows: documents cut to fill them
  config.objective.names = ("mlm",)
  config.objective.mlm.rate = 0.3
  return config


def model_size(config, size: str):
  """The released sizes (bfloat16, scanned layers) or tiny's (float32)."""
  model = config.model
  if size == "tiny":
    common.tiny_sizes(config)
    model.attention.window = 64  # the window of 128 would see all of 128 tokens
    model.embeddings.max_positions = 128
    return config
  model.num_layers, model.hidden_size, model.num_heads, model.intermediate_size = SIZES[size]
  model.vocab_size = 50368
  model.embeddings.max_positions = 8192
  model.dtype = "bfloat16"
  model.layout.scan = True
  return config


# --- ModernBERT's recipe: three phases -----------------------------------------------------
def pretrain(config, size: str):
  """Phase 1 (modernbert-base-pretrain.yaml)."""
  config.data.seq_length = 1024
  mlm = config.objective.mlm
  mlm.rate, mlm.eval_rate = 0.3, 0.15
  mlm.max_predictions = 320  # 30% of 1,024 is 307
  optimizer = config.optimizer
  optimizer.name, optimizer.decouple_lr, optimizer.clip_norm = "stable_adamw", True, 0.0
  optimizer.learning_rate, optimizer.b1, optimizer.b2 = 8e-4, 0.9, 0.98
  optimizer.eps, optimizer.weight_decay = 1e-6, 1e-5
  optimizer.schedule, optimizer.decay_fraction = "wsd", 0.0  # decayed in phase 3
  optimizer.warmup_steps = 640  # 3B tokens at 4,608 x 1,024
  config.train.steps = 364_000  # 1.719T tokens
  config.train.batch_size = 4608
  config.train.batch_size_schedule = common.batch_size_warmup(768, 4608, 18_000, 768)
  config.train.seed = 17
  if size == "large":
    optimizer.learning_rate = 5e-4  # the paper's large peak
  config.eval.batch_size = 1024
  config.eval.every_steps = 4000
  config.checkpoint.every_steps = 4000
  if size == "tiny":
    common.bundled_demo(config)  # 1,000 steps of 32 x 128
    mlm.max_predictions = 40  # 30% of 128 is 38
    optimizer.learning_rate, optimizer.b2 = 2e-3, 0.98
    optimizer.warmup_steps = 60
    config.train.steps = 600
    config.train.batch_size_schedule = common.batch_size_warmup(8, 32, 60, 8)
    config.eval.every_steps = 100
    config.checkpoint.every_steps = 100
  return config


def context_extension(config, size: str):
  """Phase 2 (modernbert-base-context-extension.yaml): from phase 1's checkpoint
  (--init_from), longer rows and a larger global theta, a constant learning rate, the
  optimizer state carried over (load_path + reset_time + restart_override)."""
  pretrain(config, size)
  config.init_from_optimizer = True  # and a one-line error without --init_from
  config.data.seq_length = 8192
  config.model.embeddings.rope_theta, config.model.embeddings.local_rope_theta = 160_000.0, 10_000.0
  config.objective.mlm.max_predictions = 2464  # 30% of 8,192 is 2,458
  config.optimizer.learning_rate = 3e-4
  config.optimizer.warmup_steps = 0  # constant: wsd without warmup or decay
  config.train.steps = 53_000  # 250B tokens at 576 x 8,192
  config.train.batch_size = 576
  config.train.batch_size_schedule = ()
  config.train.seed = 2998  # ModernBERT's shuffle seed of the later phases
  config.eval.batch_size = 0  # 576 rows of 8,192 (phase 1's 1,024 rows would not fit)
  if size == "tiny":
    config.data.seq_length = 512
    config.model.embeddings.max_positions = 512
    config.objective.mlm.max_predictions = 160  # 30% of 512 is 154
    config.optimizer.learning_rate = 1e-3
    config.train.steps = 200
    config.train.batch_size = 8
    config.eval.every_steps = 50
    config.checkpoint.every_steps = 50
  return config


def decay(config, size: str):
  """Phase 3 (modernbert-base-learning-rate-decay.yaml): from phase 2's checkpoint, the
  learning rate from 3e-4 to 0.001x along 1 - sqrt over the whole run
  (OneMinusSqrtScheduler), the optimizer state carried over."""
  context_extension(config, size)
  config.optimizer.schedule, config.optimizer.decay_shape = "wsd", "1-sqrt"
  config.optimizer.decay_fraction, config.optimizer.decay_to = 1.0, 0.001
  config.train.steps = 10_600  # 50B tokens at 576 x 8,192
  config.eval.every_steps = config.checkpoint.every_steps = 1000
  if size == "tiny":
    config.train.steps = 200
    config.eval.every_steps = config.checkpoint.every_steps = 50
  return config


RECIPE = {"": pretrain, "context_extension": context_extension, "decay": decay}


def get_config(arg: str = "tiny"):
  variant, _ = common.parse_arg(arg, VARIANTS)
  rtd = variant.startswith("rtd_")
  size, _, phase = variant.removeprefix("rtd_").partition("_")
  config = model_size(modernbert_choices(common.default_config()), size)
  RECIPE[phase](config, size)
  if rtd:
    deberta.use_deberta_v3(config)
    config.objective.mlm.rate = 0.15  # DeBERTa-v3's RTD masks 15% (rtd.sh), as ELECTRA
    config.objective.mlm.eval_rate = 0.0  # evaluated at its training rate
  return config

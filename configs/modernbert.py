"""ModernBERT (Warner et al., 2024): one encoder with rotary positions (theta per layer
kind), pre-norm LayerNorms without biases, a GeGLU feed-forward, local attention
(128-token windows) in two layers of three, no token types, on packed rows; trained with
30% masking, StableAdamW and a warmup-stable-decay schedule in three phases.

    --config=configs/modernbert.py:VARIANT

Sizes: tiny (the recipe at bert tiny's size, 2 x 128, on the bundled text and 8,000-token
byte-level BPE vocabulary; minutes on two CPU cores) and base (22 layers, 768 hidden,
1,152 FFN, 12 heads, 50,368 tokens).

The recipe (AnswerDotAI/ModernBERT yamls/modernbert/modernbert-base-pretrain.yaml,
-context-extension.yaml, -learning-rate-decay.yaml), as three runs, each from the last's
checkpoint (docs/guides/recipes.md):

  base                      pretraining at 1,024 tokens: 1.719T tokens of batch 4,608
                            (~364k steps) after a batch-size warmup, StableAdamW (lr 8e-4,
                            betas 0.9 / 0.98, eps 1e-6, weight decay 1e-5 fully decoupled,
                            no gradient clipping), warmup 3B tokens then stable (WSD with
                            no decay), 30% masking, evaluated at 15%, rotary theta 10,000
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
"""
from encoderx.configs import common
from encoderx.data import resources
from encoderx.hf import modernbert as hf_modernbert

SIZES = ("tiny", "base")
PHASES = ("", "context_extension", "decay")
VARIANTS = tuple(size + (f"_{phase}" if phase else "") for size in SIZES for phase in PHASES)


# --- the family's model at each size -----------------------------------------------------
# (configs/modernbert.py's sizes are being written on another branch: on merging, keep
# that block's sizes and this file's recipe block below.)
def model(config, size: str):
  """ModernBERT-base's fields (transformers ModernBertConfig for answerdotai/
  ModernBERT-base); tiny: bert tiny's sizes with a 64-token window."""
  for field, value in hf_modernbert.MODEL.items():
    config.model[field] = value
  config.model.family = "modernbert"
  config.model.vocab_size = 50368
  config.model.hidden_size = 768
  config.model.num_layers = 22
  config.model.num_heads = 12
  config.model.intermediate_size = 1152
  config.model.hidden_act = config.model.pooler_act = "gelu"
  config.model.local_attention = 128
  config.model.global_attention_every = 3
  config.model.rope_theta = 10_000.0
  config.model.local_rope_theta = 0.0  # the global theta
  config.model.max_position_embeddings = 8192
  config.model.layer_norm_eps = 1e-5
  config.model.attention_bias = config.model.mlp_bias = config.model.norm_bias = False
  config.model.decoder_bias = True
  config.model.classifier_bias = False
  config.model.initializer = "megatron"
  config.model.hidden_dropout = 0.0
  config.model.attention_dropout = 0.0
  config.model.dtype = "bfloat16"
  config.data.vocab.kind = "byte_bpe"
  config.data.vocab.path = resources.BUNDLED_BPE_VOCAB  # replace with ModernBERT's
  config.data.builder = "full_sentences"
  config.objective.names = ("mlm",)
  if size == "tiny":
    common.tiny_sizes(config)
    config.model.vocab_size = 0  # the bundled vocabulary's 8,000
    config.model.local_attention = 64
    config.model.dtype = "float32"
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
  config.model.rope_theta, config.model.local_rope_theta = 160_000.0, 10_000.0
  config.objective.mlm.max_predictions = 2464  # 30% of 8,192 is 2,458
  config.optimizer.learning_rate = 3e-4
  config.optimizer.warmup_steps = 0  # constant: wsd without warmup or decay
  config.train.steps = 53_000  # 250B tokens at 576 x 8,192
  config.train.batch_size = 576
  config.train.batch_size_schedule = ()
  config.train.seed = 2998  # ModernBERT's shuffle seed of the later phases
  if size == "tiny":
    config.data.seq_length = 512
    config.model.max_position_embeddings = 512
    config.objective.mlm.max_predictions = 160  # 30% of 512 is 154
    config.optimizer.learning_rate = 1e-3
    config.train.steps = 200
    config.train.batch_size = 8
    config.eval.batch_size = 8
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
  size, _, phase = variant.partition("_")
  config = model(common.default_config(), size)
  return RECIPE[phase](config, size)

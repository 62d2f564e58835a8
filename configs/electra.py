"""ELECTRA (Clark et al., 2020): a small generator, trained by MLM, fills the masked
positions with samples; the discriminator (the model kept) learns which tokens were
replaced (replaced-token detection, method 'electra'). Generator and discriminator share
the token, position and type embeddings and their LayerNorm; rows are contiguous text of
one document (data.builder 'doc_sentences'; ELECTRA's own builder also splits some rows
into two segments); masking 15% of the tokens (85% [MASK], 15% kept, none random); loss
MLM + 50 x discriminator BCE.

    --config=configs/electra.py:VARIANT

tiny   bert tiny's discriminator (2 x 128) and a generator a quarter as wide (32 hidden, 1
       head), on the bundled text with bert tiny's data and schedule.
small  ELECTRA-Small, the defaults of google-research/electra (configure_pretraining.py,
       util/training_utils.py get_bert_config, run_pretraining.py get_generator_config;
       the paper's Table 6): discriminator 12 layers / 256 hidden / 4 heads / FFN 1024,
       embeddings 128 wide (each model projects them to its width); generator of the same
       depth at 1/4 the width (64 hidden, 1 head, FFN 256); at most int((0.15 + 0.005) x
       128) = 19 masked per row; AdamW at lr 5e-4 (beta2 0.999, eps 1e-6, weight decay 0.01
       off LayerNorm and biases), 10k warmup steps then linear decay, global-norm clipping
       at 1.0; batch 128 of 128 tokens for 1M steps; dropout 0.1; a 30,522-entry uncased
       WordPiece vocabulary. (The released electra-small-discriminator, "ELECTRA-Small++",
       was trained with a generator as wide as the discriminator, generator_width 1.0, on
       more data for 4M steps.)
base   ELECTRA-Base (Table 6; the commented-out "base" settings of configure_pretraining.py):
       BERT-base's encoder (12 / 768 / 12 / FFN 3072, 768-wide embeddings) as the
       discriminator, a generator a third its width (256 hidden, 4 heads, FFN 1024: HF's
       electra-base-generator), sequences of 512 tokens throughout, at most 79 masked, AdamW
       at lr 2e-4, batch 256 for 766k steps (the released "Base++" ran 4M), bf16 compute.
Point data.files (or data.tfds_name) at your corpus and data.vocab.path at a vocab.txt.
"""
from encoderx.configs import common

VARIANTS = ("tiny", "small", "base")


def use_electra(config, generator_width: float):
  """ELECTRA's objective on any config: replaced-token detection with a generator
  `generator_width` as wide, ELECTRA's masking, single-document rows."""
  config.method = "electra"
  config.data.builder = "doc_sentences"
  config.objective.names = ("mlm",)
  config.objective.mlm.mask_token_prob = 0.85  # pretrain_helpers.mask: 85% [MASK]
  config.objective.mlm.random_token_prob = 0.0  # and 15% kept, none random
  config.rtd.generator_depth = 1.0
  config.rtd.generator_width = generator_width
  config.rtd.rtd_lambda = 50.0
  config.rtd.embedding_sharing = "shared"
  config.rtd.training = "joint"
  return config


def get_config(arg: str = "tiny"):
  variant, _ = common.parse_arg(arg, VARIANTS)
  config = use_electra(common.default_config(), generator_width=0.25)
  config.model.family = "electra"
  config.model.heads.pooler_act = "gelu"  # a classifier's head, as ELECTRA fine-tunes
  if variant == "tiny":
    return common.bundled_demo(common.tiny_sizes(config))
  config.model.vocab_size = 30522
  config.model.vocab_multiple = 128  # 30,592 rows: splits over a tensor axis
  config.model.embeddings.size = 128
  config.model.hidden_size = 256
  config.model.num_layers = 12
  config.model.num_heads = 4
  config.model.intermediate_size = 1024
  config.model.embeddings.max_positions = 512
  config.data.seq_length = 128
  config.objective.mlm.max_predictions = 19
  config.optimizer.learning_rate = 5e-4
  config.optimizer.warmup_steps = 10_000
  config.optimizer.weight_decay = 0.01
  config.optimizer.clip_norm = 1.0
  config.train.steps = 1_000_000
  config.train.batch_size = 128
  if variant == "base":
    config.rtd.generator_width = 1 / 3
    config.model.embeddings.size = 768
    config.model.hidden_size = 768
    config.model.num_heads = 12
    config.model.intermediate_size = 3072
    config.model.dtype = "bfloat16"
    config.data.seq_length = 512
    config.objective.mlm.max_predictions = 79
    config.optimizer.learning_rate = 2e-4
    config.train.steps = 766_000
    config.train.batch_size = 256
  return config

"""BERT (Devlin et al., 2019): WordPiece, MLM by token + next-sentence prediction on
sentence pairs, post-LayerNorm encoder with learned absolute positions.

    --config=configs/bert.py:VARIANT

tiny   2 layers, 128 hidden, 2 heads, FFN 512 on the bundled Austen text and its 8,000-token
       WordPiece vocabulary: 1,000 steps of 32 x 128 tokens, a few minutes on two CPU cores
       (the README's main job).
mini   4 x 256 (4 heads, FFN 1,024), small 4 x 512 (8 heads, FFN 2,048): the tiny run's
       data and schedule at BERT-Mini's and BERT-Small's sizes (Turc et al., 2019).
base   12 layers, 768 hidden, 12 heads, 110M parameters, the paper's recipe: AdamW (lr
       1e-4, beta2 0.999, weight decay 0.01 off LayerNorm and biases), 10k warmup steps then
       linear decay, batch 256 for 1M steps, 90% of them at length 128 and the last 10% at
       512. Point data.files (or data.tfds_name) at your corpus and data.vocab.path at a
       30,522-entry vocab.txt.
large  24 layers, 1024 hidden, 16 heads, 340M parameters: base's recipe, layers scanned and
       rematerialized to fit long sequences.
"""
from encoderx.configs import common

VARIANTS = ("tiny", "mini", "small", "base", "large")
# Hidden size, layers, heads, FFN of the sizes trained on the bundled text.
BUNDLED_SIZES = {"tiny": (128, 2, 2, 512), "mini": (256, 4, 4, 1024),
                 "small": (512, 4, 8, 2048)}


def get_config(arg: str = "tiny"):
  variant, _ = common.parse_arg(arg, VARIANTS)
  config = common.default_config()
  if variant in BUNDLED_SIZES:
    model = config.model
    model.hidden_size, model.num_layers, model.num_heads, model.intermediate_size = (
        BUNDLED_SIZES[variant])
    return common.bundled_demo(config)
  return paper_recipe(config, large=variant == "large")


def paper_recipe(config, large: bool = False):
  """BERT-base's (or -large's) sizes and the paper's pretraining recipe."""
  config.model.vocab_size = 30522
  config.model.vocab_multiple = 128  # 30,592 rows: splits over a tensor axis
  config.model.hidden_size = 768
  config.model.num_layers = 12
  config.model.num_heads = 12
  config.model.intermediate_size = 3072
  config.model.embeddings.max_positions = 512
  config.model.dtype = "bfloat16"
  config.train.steps = 1_000_000
  config.train.batch_size = 256
  config.train.long_fraction = 0.1
  config.train.long_seq_length = 512
  config.objective.mlm.long_max_predictions = 80
  config.optimizer.learning_rate = 1e-4
  config.optimizer.warmup_steps = 10_000
  config.optimizer.weight_decay = 0.01
  config.data.seq_length = 128
  config.objective.mlm.max_predictions = 20
  if large:
    common.large_sizes(config)
  return config

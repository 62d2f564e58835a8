"""ALBERT (Lan et al., 2020): SentencePiece, factorized embeddings (V x E + E x H), one set
of layer weights shared by every layer, MLM over whole-word n-grams (n <= 3, p(n) ~ 1/n)
+ sentence-order prediction, LAMB.

    --config=configs/albert.py:VARIANT

tiny  4 shared layers, 128 hidden, 64-wide embeddings, on the bundled text with the bundled
      SentencePiece vocabulary: bert tiny's data and schedule, LAMB at 2e-2 (each step
      moves a layer by 2% of its norm).
base  12 layers sharing one set of weights, 768 hidden, 12 heads, 128-wide embeddings;
      about 12M parameters. The paper's recipe: a 30,000-piece SentencePiece vocabulary,
      sequences of 512 (shorter with probability 0.1), batch 4096 for 125k steps, LAMB with
      learning rate 0.00176 (3,125 warmup steps, then linear decay; weight decay 0.01 off
      LayerNorm and biases), gelu_new, and no dropout (albert-base-v2). Point data.files
      (or data.tfds_name) at your corpus and data.vocab.path at a 30,000-piece model from
      `python -m encoderx.data.sentencepiece_vocabulary --size 30000`.
"""
from encoderx.configs import common
from encoderx.data import resources

VARIANTS = ("tiny", "base")


def albert_choices(config):
  """What makes a config ALBERT: shared layers, gelu_new, SentencePiece, n-gram MLM +
  SOP, LAMB."""
  config.model.family = "albert"
  config.model.layout.sharing = "all"
  config.model.hidden_act = "gelu_new"
  config.data.vocab.kind = "sentencepiece"
  config.data.vocab.path = resources.BUNDLED_SENTENCEPIECE_VOCAB
  config.objective.names = ("mlm", "sop")
  config.objective.mlm.unit = "ngram"
  config.objective.mlm.max_ngram = 3
  config.optimizer.name = "lamb"
  return config


def get_config(arg: str = "tiny"):
  variant, _ = common.parse_arg(arg, VARIANTS)
  config = albert_choices(common.default_config())
  if variant == "tiny":
    common.bundled_demo(common.tiny_sizes(config))
    config.model.embeddings.size = 64
    config.model.num_layers = 4
    config.objective.mlm.max_predictions = 24  # 15% of 128 plus room for the last n-gram
    config.optimizer.learning_rate = 2e-2
    return config
  config.model.vocab_size = 30000
  config.model.vocab_multiple = 128  # 30,080 rows: splits over a tensor axis
  config.model.embeddings.size = 128
  config.model.hidden_size = 768
  config.model.num_layers = 12
  config.model.num_heads = 12
  config.model.intermediate_size = 3072
  config.model.embeddings.max_positions = 512
  config.model.hidden_dropout = 0.0
  config.model.attention.dropout = 0.0
  config.model.dtype = "bfloat16"
  config.data.seq_length = 512
  config.data.short_seq_prob = 0.1
  config.objective.mlm.max_predictions = 20  # google-research/albert's pretraining flag
  config.optimizer.learning_rate = 0.00176
  config.optimizer.warmup_steps = 3125
  config.optimizer.weight_decay = 0.01
  config.train.steps = 125_000
  config.train.batch_size = 4096
  return config

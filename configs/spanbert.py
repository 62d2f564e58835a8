"""SpanBERT (Joshi et al., 2020): BERT's encoder pretrained with span masking and the span
boundary objective (SBO) on single contiguous segments of one document (no NSP;
data.builder 'doc_sentences'): spans of whole words, their length in words drawn from
Geometric(0.2) restricted to 1..10 (mean 3.8), until 15% of the tokens are masked, each
span all [MASK] / all random / kept (80/10/10); loss MLM + SBO.

    --config=configs/spanbert.py:VARIANT

tiny  the recipe at bert tiny's sizes, data and schedule: a few minutes on two CPU cores.
base  BERT-base's encoder (12 layers, 768 hidden, 12 heads) and a cased 28,996-entry
      WordPiece vocabulary; segments of up to 512 tokens, AdamW at lr 1e-4 with 10k warmup
      steps then linear decay, batch 256 for 2.4M steps. Point data.files (or
      data.tfds_name) at your corpus and data.vocab.path at a cased vocab.txt.
"""
from encoderx.configs import bert, common

VARIANTS = ("tiny", "base")


def use_span_objectives(config):
  """SpanBERT's data and objectives on any config: single segments, span masking, SBO."""
  config.data.builder = "doc_sentences"
  config.objective.names = ("mlm", "sbo")
  config.objective.mlm.unit = "span"
  config.objective.mlm.span_geometric_p = 0.2
  config.objective.mlm.max_span_words = 10
  return config


def get_config(arg: str = "tiny"):
  variant, _ = common.parse_arg(arg, VARIANTS)
  config = use_span_objectives(bert.get_config(variant))
  if variant == "tiny":
    # 15% of 126 is 19; the span that crosses the budget can pass it by up to a span
    # (measured on the bundled text: 99.9% of rows mask at most 27).
    config.objective.mlm.max_predictions = 32
    return config
  config.model.vocab_size = 28996
  config.data.vocab.lower_case = False
  config.data.vocab.strip_accents = False
  config.data.seq_length = 512
  config.train.long_fraction = 0.0  # every step at 512
  config.train.steps = 2_400_000
  config.train.batch_size = 256
  config.optimizer.learning_rate = 1e-4
  config.optimizer.warmup_steps = 10_000
  # 15% of 510 is 77; the span that crosses the budget can pass it by up to a span.
  config.objective.mlm.max_predictions = 96
  return config

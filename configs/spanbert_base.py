"""SpanBERT-base (Joshi et al., 2020): BERT-base's encoder (12 layers, 768 hidden, 12
heads) and a cased 28,996-entry WordPiece vocabulary, pretrained with span masking and
the span boundary objective.

The paper's recipe: single contiguous segments of up to 512 tokens from one document
(no NSP; data.builder 'doc_sentences'); spans of whole words, their length in words
drawn from Geometric(0.2) restricted to 1..10 (mean 3.8), until 15% of the tokens are
masked, each span all [MASK] / all random / kept (80/10/10); loss MLM + SBO; AdamW at
lr 1e-4 with 10k warmup steps then linear decay, batch 256 for 2.4M steps. Point
data.files (or data.tfds_name) at your corpus and data.vocab.path at a cased vocab.txt.
"""
from encoderx.configs import bert_base


def use_span_objectives(config):
  """SpanBERT's data and objectives on any config: single segments, span masking, SBO."""
  config.data.builder = "doc_sentences"
  config.objective.names = ("mlm", "sbo")
  config.objective.mlm.unit = "span"
  config.objective.mlm.span_geometric_p = 0.2
  config.objective.mlm.max_span_words = 10
  return config


def get_config():
  config = use_span_objectives(bert_base.get_config())
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

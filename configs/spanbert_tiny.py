"""A tiny SpanBERT (2 layers, 128 hidden) on the bundled Austen text: span masking
(Geometric(0.2) whole-word spans of up to 10 words) with loss MLM + SBO, on single
contiguous segments (data.builder 'doc_sentences', no NSP). configs/spanbert_base.py's
recipe at bert_tiny's sizes: a few minutes on two CPU cores.
"""
from encoderx.configs import bert_tiny, spanbert_base


def get_config():
  config = spanbert_base.use_span_objectives(bert_tiny.get_config())
  # 15% of 126 is 19; the span that crosses the budget can pass it by up to a span
  # (measured on the bundled text: 99.9% of rows mask at most 27).
  config.objective.mlm.max_predictions = 32
  return config

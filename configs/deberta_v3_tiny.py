"""A tiny DeBERTa-v3 on the bundled Austen text: configs/deberta_tiny.py's encoder as the
discriminator, trained by replaced-token detection (method 'electra') with DeBERTa-v3's
settings (configs/deberta_v3_base.py: use_deberta_v3): a generator half as deep, at the
same width, gradient-disentangled embedding sharing, decoupled generator and discriminator
updates, rtd_lambda 10.
"""
from encoderx.configs import deberta_tiny, deberta_v3_base


def get_config():
  return deberta_v3_base.use_deberta_v3(deberta_tiny.get_config())

"""DeBERTa-v3-base (He et al., 2021, "DeBERTaV3: Improving DeBERTa using ELECTRA-Style
Pre-Training with Gradient-Disentangled Embedding Sharing").

The discriminator is configs/deberta_base.py's encoder (12 x 768, disentangled attention,
256 log buckets up to 512, a 128,100-row SentencePiece vocabulary); the training method is
replaced-token detection ('electra', encoderx/methods/electra.py) with the settings of
microsoft/DeBERTa's RTD task (apps/tasks/rtd_task.py, experiments/language_model/rtd.sh):
a generator of half the discriminator's depth at the same width, loss MLM (generator) +
rtd_lambda 10 x binary cross-entropy (discriminator), gradient-disentangled embedding
sharing (the discriminator's word embedding is stop_gradient(the generator's) + its own
delta, initialized at zero; the generator learns by MLM alone), and decoupled training
(the generator's update, then the discriminator's on the batch the generator corrupted,
each with its own optimizer state). Data, masking, optimizer and schedule are
deberta_base's (n-gram MLM, n <= 3; Adam lr 1e-4, 10k warmup; batch 256 x 512 tokens).

The generator keeps the enhanced mask decoder (its MLM head is DeBERTa's); the
discriminator's replaced-token head reads every token's output and does not use it.
"""
from encoderx.configs import deberta_base


def use_deberta_v3(config):
  """DeBERTa-v3's replaced-token detection on a DeBERTa config."""
  config.method = "electra"
  config.objective.names = ("mlm",)
  config.rtd.generator_depth = 0.5
  config.rtd.generator_width = 1.0
  config.rtd.rtd_lambda = 10.0
  config.rtd.embedding_sharing = "gdes"
  config.rtd.training = "decoupled"
  return config


def get_config():
  return use_deberta_v3(deberta_base.get_config())

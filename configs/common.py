"""What the config files share: their argument, and the bundled demo's data and schedule.

A config file is `get_config(arg)` over the one schema (encoderx/config.py), its variants
(sizes, recipes) named by `arg` as big_vision's configs are:

    --config=configs/bert.py:tiny       --config=configs/finetune.py:classify,data=DIR
"""
import math

from encoderx import config as config_lib
from encoderx import errors
from encoderx.data import resources

# Chapter headings start documents in the bundled Austen novels.
AUSTEN_CHAPTERS = r"^\s*(CHAPTER|Chapter)\s+[0-9IVXLC]+"


def parse_arg(arg: str, variants: tuple[str, ...], **options: str) -> tuple[str, dict]:
  """'VARIANT[,key=value,...]' -> (variant, {key: value}) for the keys of `options` (their
  defaults); a one-line ConfigError for an unknown variant or key."""
  variant, *pairs = [part.strip() for part in (arg or variants[0]).split(",")]
  if variant not in variants:
    raise errors.ConfigError(f"config variant {variant!r} is not one of "
                             f"{', '.join(variants)}.")
  values = dict(options)
  for pair in pairs:
    key, equals, value = pair.partition("=")
    if not equals or key not in options:
      raise errors.ConfigError(
          f"config argument {pair!r}: expected key=value with a key of "
          f"{', '.join(options) or '(none)'}.")
    values[key] = value
  return variant, values


def default_config():
  return config_lib.default_config()


def tiny_sizes(config):
  """2 layers, 128 wide, 2 heads, FFN 512: minutes on two CPU cores."""
  config.model.hidden_size = 128
  config.model.num_layers = 2
  config.model.num_heads = 2
  config.model.intermediate_size = 512
  return config


def large_sizes(config):
  """BERT-large's encoder (24 layers, 1024 hidden, 16 heads, FFN 4096), its layers
  scanned and rematerialized to fit long sequences."""
  config.model.hidden_size = 1024
  config.model.num_layers = 24
  config.model.num_heads = 16
  config.model.intermediate_size = 4096
  config.model.layout.scan = True
  config.model.layout.remat = True
  return config


def bundled_demo(config):
  """The bundled Austen text at length 128 and the demo's schedule: 1,000 steps of
  32 x 128 tokens (AdamW at 2e-3 after 100 warmup steps, beta2 0.98), held-out chapters
  evaluated at the end in batches of as many tokens (eval.batch_size=0)."""
  config.model.embeddings.max_positions = 128
  config.data.files = resources.BUNDLED_CORPUS
  config.data.document_marker = AUSTEN_CHAPTERS
  config.data.seq_length = 128
  config.data.shuffle_buffer = 2000
  config.objective.mlm.max_predictions = 20
  config.optimizer.learning_rate = 2e-3
  config.optimizer.warmup_steps = 100
  config.optimizer.b2 = 0.98
  config.train.steps = 1000
  config.train.batch_size = 32
  config.train.log_every = 20
  config.eval.batches = 10
  config.eval.batch_size = 0  # a training micro-batch's tokens: 32 rows here
  config.checkpoint.every_steps = 250
  return config


def batch_size_warmup(first: int, last: int, warmup_steps: int, multiple: int) -> tuple:
  """ModernBERT's batch-size warmup as train.batch_size_schedule pieces: sizes `first`,
  first + multiple, ... below `last` (train.batch_size, which follows), each held for
  steps in proportion to its size, over `warmup_steps` (AnswerDotAI/ModernBERT
  src/sequence_packer.py `BatchSizeWarmupScheduler`, in steps instead of tokens).
  `multiple`: the device count (or a multiple of it), which every size must divide."""
  sizes = list(range(first, last, multiple))
  total, done, pieces = sum(sizes), 0, []
  for size in sizes:
    done += size
    end = math.ceil(warmup_steps * done / total)
    if not pieces or end > pieces[-1][0]:
      pieces.append((end, size))
  return tuple(pieces)

"""`python -m encoderx.train --compile_only` (train/sizing.py): each phase's train step
compiled ahead of time and measured by XLA, nothing trained or written."""
from encoderx.train import sizing
from test_contrastive import ONE_DEVICE, method_config


def test_each_phase_is_compiled_once(tiny_config):
  """BERT's two lengths (the last steps at train.long_seq_length): a step each, the
  longer one costing more."""
  config = tiny_config("bert:tiny")
  config.train.long_fraction, config.train.long_seq_length = 0.5, 128
  sizes = sizing.compile_train_steps(config, devices=ONE_DEVICE)
  assert [(size.seq_length, size.batch_size) for size in sizes] == [(64, 8), (128, 8)]
  assert sizes[1].cost.flops > sizes[0].cost.flops > 0
  assert all(size.device_limit is None for size in sizes)  # CPU: no device limit
  assert "train step at length 128, batch 8 compiled in" in sizes[1].describe()


def test_gradient_caching_bounds_the_temporaries(tmp_path):
  """What the gradient-cached contrastive step is for: the activations of one chunk,
  not of the whole batch (XLA's temporaries, never allocated here)."""
  config = method_config(tmp_path, batch=32)
  plain = sizing.compile_train_steps(config, devices=ONE_DEVICE)[0].cost
  config.contrastive.cache_chunk_size = 4
  cached = sizing.compile_train_steps(config, devices=ONE_DEVICE)[0].cost
  assert cached.temp_bytes < plain.temp_bytes / 2, (cached, plain)

"""ml_collections configs: one file per family, its variants (sizes, recipes) as the
argument, and the fine-tuning tasks' recipes (finetune.py). Installed as `encoderx.configs`.

    --config=configs/bert.py:tiny              (the command line: a file and its argument)
    encoderx.configs.get("bert:tiny")          (Python: a file by name and its argument)
"""
import importlib


def get(spec: str):
  """'family[:argument]' -> the ConfigDict of configs/<family>.py's get_config(argument)
  (its default variant without one)."""
  name, _, argument = spec.partition(":")
  module = importlib.import_module(f"encoderx.configs.{name}")
  return module.get_config(argument) if argument else module.get_config()

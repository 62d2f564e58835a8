"""The Hugging Face families by name (`model.family`, config.json's `model_type`).

Each name maps to the module that defines the family as `FAMILY = Family(...)`
(encoderx/hf/base.py); a module is imported the first time its family is asked for, so
that naming the families (config validation) loads no rule table. A family from outside
the package adds itself with `register(name, "package.module")`.
"""
from __future__ import annotations

import importlib

from encoderx.hf import base

FAMILIES: dict[str, str] = {
    "bert": "encoderx.hf.bert",  # and SpanBERT, whose released models are BERTs
    "roberta": "encoderx.hf.roberta",
    "albert": "encoderx.hf.albert",
    "deberta-v2": "encoderx.hf.deberta",  # DeBERTa v2 and v3
    "electra": "encoderx.hf.electra",
    "xlnet": "encoderx.hf.xlnet",
    "modernbert": "encoderx.hf.modernbert",
    "eurobert": "encoderx.hf.eurobert",
}


def register(name: str, module_path: str) -> None:
  """Makes family `name` the `FAMILY` of module `module_path` ('package.module')."""
  FAMILIES[name] = module_path


def names() -> tuple[str, ...]:
  """The known families, in registration order."""
  return tuple(FAMILIES)


def family_named(name: str) -> base.Family:
  """The family `name` (its module imported); ConversionError for an unknown name."""
  if name not in FAMILIES:
    raise base.ConversionError(f"no Hugging Face conversion rules for family '{name}'; "
                               f"known: {', '.join(FAMILIES)}")
  family = importlib.import_module(FAMILIES[name]).FAMILY
  if family.name != name:
    raise base.ConversionError(f"{FAMILIES[name]} defines family {family.name!r}, "
                               f"registered as {name!r}.")
  return family

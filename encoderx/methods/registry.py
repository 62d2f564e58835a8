"""The training methods by name (`config.method`), and the config sections they declare.

The registry holds import paths: a method's module is imported when a config names it
(or when the schema gathers every method's config sections). `register` adds a method
from outside the package.
"""
from __future__ import annotations

import importlib

import ml_collections

REGISTRY: dict[str, str] = {
    "pretrain": "encoderx.methods.pretrain:Pretraining",
    "electra": "encoderx.methods.electra:ReplacedTokenDetection",
    "classify": "encoderx.methods.classify:Classification",
    "xlnet": "encoderx.methods.xlnet:PermutationLanguageModelling",
    "tag": "encoderx.methods.tag:Tagging",
    "qa": "encoderx.methods.qa:QuestionAnswering",
    "similarity": "encoderx.methods.similarity:Similarity",
    "simcse": "encoderx.methods.simcse:SimCSE",
    "contrastive": "encoderx.methods.contrastive:Contrastive",
    "rerank": "encoderx.methods.rerank:Reranking",
}


def register(name: str, target: str) -> None:
  """Makes `config.method=name` load `target` ('package.module:ClassName')."""
  REGISTRY[name] = target


def method_class(name: str):
  """The Method subclass (methods/base.py) registered as `name`."""
  module, _, attribute = REGISTRY[name].partition(":")
  return getattr(importlib.import_module(module), attribute)


def build(config: ml_collections.ConfigDict):
  """The method `config.method` names, built from the (validated) config."""
  return method_class(config.method)(config)


def _merged(a: ml_collections.ConfigDict, b: ml_collections.ConfigDict, path: str):
  """The union of two declarations of one section; a field both declare must agree."""
  merged = ml_collections.ConfigDict(a.to_dict())
  for key in b.keys():
    if key not in merged:
      merged[key] = b[key]
    elif isinstance(b[key], ml_collections.ConfigDict):
      merged[key] = _merged(merged[key], b[key], f"{path}.{key}")
    elif merged[key] != b[key]:
      raise ValueError(f"methods declare config field '{path}.{key}' with different "
                       f"defaults: {merged[key]!r} and {b[key]!r}.")
  return merged


def config_fields() -> dict[str, ml_collections.ConfigDict]:
  """Every registered method's config sections, merged by name."""
  sections: dict[str, ml_collections.ConfigDict] = {}
  for name in REGISTRY:
    for section, fields in method_class(name).config_fields().items():
      sections[section] = (_merged(sections[section], fields, section)
                           if section in sections else fields)
  return sections

"""The building blocks of the families' rule tables: array transforms, the rules of a
dense layer, a LayerNorm, an encoder layer, BERT's embeddings and encoder, the MLM head,
classifiers, and the refusal every BERT-like class shares.

A rule is (Hugging Face name, encoderx path, transform) (`Rule` of encoderx/hf/base.py):
the transform converts the array both ways (PyTorch Linear stores [out, in]; Flax Dense
[in, out]; attention kernels here are [hidden, heads, head_dim]).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from encoderx.hf import base
from encoderx.models import model_config

COPY = base.Transform(lambda x, c: x, lambda x, c: x)
LINEAR = base.Transform(lambda x, c: x.T, lambda x, c: x.T)
HEADS_IN = base.Transform(  # [heads*dim, hidden] -> [hidden, heads, dim]
    lambda x, c: x.T.reshape(x.shape[1], c.num_heads, c.head_dim),
    lambda x, c: x.reshape(x.shape[0], -1).T)
HEADS_BIAS = base.Transform(lambda x, c: x.reshape(c.num_heads, c.head_dim),
                            lambda x, c: x.reshape(-1))
HEADS_OUT = base.Transform(  # [hidden, heads*dim] -> [heads, dim, hidden]
    lambda x, c: x.T.reshape(c.num_heads, c.head_dim, x.shape[0]),
    lambda x, c: x.reshape(-1, x.shape[-1]).T)


def rows(transform: base.Transform, index: int, count: int) -> base.Transform:
  """`transform` of block `index` of `count` equal blocks of rows (axis 0) of a fused
  Hugging Face weight; export concatenates the blocks of one weight in rule order."""
  return base.Transform(lambda x, c: transform.to_flax(np.split(x, count)[index], c),
                        transform.to_hf)


def dense(hf: str, flax_path: str, kernel: base.Transform = LINEAR,
          bias: base.Transform = COPY, use_bias: bool = True) -> list[base.Rule]:
  return [(f"{hf}.weight", f"{flax_path}/kernel", kernel)] + (
      [(f"{hf}.bias", f"{flax_path}/bias", bias)] if use_bias else [])


def layer_norm(hf: str, flax_path: str, use_bias: bool = True) -> list[base.Rule]:
  return [(f"{hf}.weight", f"{flax_path}/scale", COPY)] + (
      [(f"{hf}.bias", f"{flax_path}/bias", COPY)] if use_bias else [])


# Where each part of an encoder layer lives in a family's HF layer module.
BERT_LAYER = dict(
    query="attention.self.query", key="attention.self.key", value="attention.self.value",
    out="attention.output.dense", attention_norm="attention.output.LayerNorm",
    intermediate="intermediate.dense", output="output.dense", ffn_norm="output.LayerNorm")
ALBERT_LAYER = dict(
    query="attention.query", key="attention.key", value="attention.value",
    out="attention.dense", attention_norm="attention.LayerNorm",
    intermediate="ffn", output="ffn_output", ffn_norm="full_layer_layer_norm")


def layer_rules(hf: str, flax_path: str, names: dict[str, str]) -> list[base.Rule]:
  """Rules of one encoder layer: HF module `hf` (parts named by `names`) <-> `flax_path`."""
  attention = f"{flax_path}/attention/self_attention"
  return (dense(f"{hf}.{names['query']}", f"{attention}/query", HEADS_IN, HEADS_BIAS)
          + dense(f"{hf}.{names['key']}", f"{attention}/key", HEADS_IN, HEADS_BIAS)
          + dense(f"{hf}.{names['value']}", f"{attention}/value", HEADS_IN, HEADS_BIAS)
          + dense(f"{hf}.{names['out']}", f"{attention}/out", HEADS_OUT)
          + layer_norm(f"{hf}.{names['attention_norm']}", f"{flax_path}/attention/layer_norm")
          + dense(f"{hf}.{names['intermediate']}", f"{flax_path}/ffn/intermediate")
          + dense(f"{hf}.{names['output']}", f"{flax_path}/ffn/output")
          + layer_norm(f"{hf}.{names['ffn_norm']}", f"{flax_path}/ffn/layer_norm"))


def embedding_rules(hf: str) -> list[base.Rule]:
  """Token, position and token-type tables and their LayerNorm (BERT and ALBERT)."""
  flax_path = "encoder_model/embeddings"
  return [(f"{hf}embeddings.{table}.weight", f"{flax_path}/{table}/embedding", COPY)
          for table in ("word_embeddings", "position_embeddings", "token_type_embeddings")
          ] + layer_norm(f"{hf}embeddings.LayerNorm", f"{flax_path}/layer_norm")


def bert_encoder(config: model_config.ModelConfig, hf: str) -> list[base.Rule]:
  """Embeddings and layers of BERT and RoBERTa (`hf`: 'bert.', 'roberta.', '')."""
  rules = embedding_rules(hf)
  for i in range(config.num_layers):
    rules += layer_rules(f"{hf}encoder.layer.{i}", f"encoder_model/encoder/layer_{i}",
                         BERT_LAYER)
  return rules


def mlm_head(dense_name: str, layer_norm_name: str, bias: str) -> list[base.Rule]:
  """The MLM head's transform, LayerNorm and output bias (its decoder is the tied word
  embedding), named as the family names them."""
  return (dense(dense_name, "mlm_head/transform")
          + layer_norm(layer_norm_name, "mlm_head/layer_norm")
          + [(bias, "mlm_head/output_bias", COPY)])


def classifier(hf: str = "classifier"
               ) -> Callable[[model_config.ModelConfig], list[base.Rule]]:
  """The classify method's linear classifier (encoderx/models/finetuning.py)."""
  return lambda config: dense(hf, "classifier")


def token_heads(class_prefix: str) -> dict[str, base.Head]:
  """The family's token classification and extractive QA classes: a linear layer on the
  encoder's last hidden states, no pooler (the tag method's `classifier`, the qa
  method's `qa_outputs`; encoderx/models/finetuning.py)."""
  return {"token_classification": base.Head(f"{class_prefix}ForTokenClassification",
                                            classifier(), pooler=False, labels=True),
          "question_answering": base.Head(f"{class_prefix}ForQuestionAnswering",
                                          lambda config: dense("qa_outputs", "qa_outputs"),
                                          pooler=False)}


def refuse_unless_plain(config: model_config.ModelConfig, family: str, offset: int = 0) -> None:
  """What every BERT-like class needs: distinct layers, no embedding factorization,
  standard attention, absolute positions from `offset`."""
  if config.layout.sharing != "none":
    raise base.ConversionError(
        f"model.layout.sharing={config.layout.sharing!r} has no Hugging Face {family} "
        "equivalent (its layers are distinct); export it as family 'albert' "
        "(layout.sharing 'all') or train with layout.sharing='none'.")
  if config.embeddings.size != config.hidden_size:
    raise base.ConversionError(
        f"model.embeddings.size={config.embeddings.size} != hidden_size: Hugging Face "
        f"{family} has no embedding projection (ALBERT has).")
  if config.attention.variant != "standard" or config.embeddings.position != "absolute":
    raise base.ConversionError(
        f"model.attention.variant={config.attention.variant!r} / position_embedding="
        f"{config.embeddings.position!r}: Hugging Face {family} has standard attention "
        "with absolute positions.")
  if config.embeddings.position_offset != offset:
    raise base.ConversionError(
        f"model.embeddings.position_offset={config.embeddings.position_offset}: Hugging Face "
        f"{family} numbers positions from {offset}.")

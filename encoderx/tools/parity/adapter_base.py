"""What every PyTorch counterpart of a training method shares (torch_adapters.py names
them): the HF forward's inputs from an encoderx batch, the batch an adapter's loss reads,
and the Adapter class.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np
import torch

from encoderx import errors
from encoderx.hf import engine


class NoAdapterError(errors.UserError, ValueError):
  """A method (or family, or objective) that has no PyTorch counterpart here."""


def hf_inputs(batch: dict, strict: bool = True, token_types: bool = True) -> dict:
  """A prepared (masked) encoderx batch -> the PyTorch model's keyword arguments
  (input_ids, attention_mask, and token_type_ids where the model has `token_types`:
  ModernBERT's and EuroBERT's have none).

  With `strict`, rows must hold one sequence each (segment_ids 0 or 1): Hugging Face's
  attention mask cannot keep packed sequences apart; and HF derives positions itself
  (from 0, or RoBERTa's from input_ids), which must be encoderx's `positions`. Without,
  every real token is attended to (the same work)."""
  segments = np.asarray(batch["segment_ids"])
  if strict:
    if segments.max() > 1:
      raise ValueError("rows pack several sequences; Hugging Face cannot keep them apart.")
    positions = np.asarray(batch["positions"])
    if np.any((positions != np.arange(positions.shape[1])) & (segments > 0)):
      raise ValueError("positions do not count from 0 in every row.")
  as_long = lambda x: torch.from_numpy(np.asarray(x, np.int64))
  inputs = {"input_ids": as_long(batch["input_ids"]),
            "attention_mask": as_long(segments > 0)}
  if token_types:
    inputs["token_type_ids"] = as_long(batch["token_type_ids"])
  return inputs


def hf_model(method, model_config, family: str, head: str | None = None, **fields):
  """engine.hf_model of `model_config` with the method's vocabulary's mask id where the
  family's config has one: EuroBertConfig defaults to the released model's 128,002,
  outside a run's own vocabulary (transformers warns on every config built with it)."""
  if "mask_token_id" in engine.special_token_fields(family):
    fields = {"mask_token_id": method.vocabulary.mask_id, **fields}
  return engine.hf_model(model_config, family, head, **fields)


@dataclasses.dataclass
class TorchBatch:
  """What an adapter's loss reads: the HF forward's keyword arguments (labels included)
  and the prepared encoderx batch (numpy) they were made from."""
  kwargs: dict[str, torch.Tensor]
  prepared: dict

  def to(self, device) -> "TorchBatch":
    return TorchBatch({k: v.to(device) for k, v in self.kwargs.items()}, self.prepared)


class Adapter:
  """The PyTorch side of one method: `model` (a torch.nn.Module, freshly initialized at
  the method's sizes from torch's current random state), `inputs`, `loss`, and the
  weights both ways (`converted_params`, `state_dicts`)."""
  description: ClassVar[str]

  def __init__(self, method, head: str | None = None, strict: bool = True):
    self.method, self.strict = method, strict
    self.model = self.build(head)

  @classmethod
  def refusal(cls, method) -> str | None:
    """Why this adapter cannot stand for `method`'s config (None: it can)."""
    del method
    return None

  @classmethod
  def scores_every_position(cls, method) -> bool:
    """Whether the HF class's MLM head scores every position against the vocabulary
    (Hugging Face's MLM heads), or only the masked ones (sparse prediction), as
    encoderx's head: what the bench counts as PyTorch's FLOPs."""
    del method
    return True

  def build(self, head: str | None) -> torch.nn.Module:
    raise NotImplementedError

  @property
  def num_params(self) -> int:
    return sum(p.numel() for p in self.model.parameters())  # tied ones once

  def inputs(self, prepared: dict) -> TorchBatch:
    raise NotImplementedError

  def model_inputs(self, prepared: dict) -> dict:
    """hf_inputs of `prepared` for this method's model (token types where it has them)."""
    return hf_inputs(prepared, self.strict, self.method.model_config.embeddings.type_vocab_size > 0)

  def loss(self, batch: TorchBatch, key=None) -> torch.Tensor:
    """The loss of `batch`; `key` is the train step's loss key (the key encoderx's loss
    draws from), which only ELECTRA's strict loss reads."""
    raise NotImplementedError

  def converted_params(self, trainer) -> dict:
    """The HF model's weights as the trainer's parameters (the conversion's rules)."""
    config = self.method.model_config
    params, _, _ = engine.import_state_dict(self.model.state_dict(), config, config.family,
                                        self.head)
    engine.check_tree(params, trainer.abstract_state.params)
    return params

  def state_dicts(self, trainer, params) -> tuple[dict, dict]:
    """(encoderx's `params` as the HF class's state dict, the HF model's), numpy."""
    del trainer
    config = self.method.model_config
    return (engine.to_hf(params, config, config.family, self.head),
            {k: v.detach().numpy() for k, v in self.model.state_dict().items()})


def task_class_refusal(method, head: str) -> str | None:
  """Why the family's HF task class `head` (encoderx/hf/<family>.py) cannot stand for
  `method`'s model (None: it can)."""
  from encoderx.hf import families  # pylint: disable=g-import-not-at-top
  family = method.model_config.family
  if head not in families.family_named(family).heads:
    return f"family {family!r} has no {head} class"
  if head == "sequence_classification" and method.config.finetune.pooling != "pooler":
    return ("Hugging Face's sequence classification classes pool the first token through "
            "the pooler (finetune.pooling='pooler')")
  return None

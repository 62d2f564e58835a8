"""Hugging Face (PyTorch) reference models and inputs for the parity tests."""
import dataclasses

import jax
import numpy as np
import torch

from encoderx.hf import engine
from encoderx.models import common, pretraining

# Small enough to run in a second. initializer_range is larger than BERT's 0.02 so that
# logits are O(1-10) and a 1e-4 bound means something.
SMALL = common.ModelConfig(
    vocab_size=99, hidden_size=48, num_layers=3, num_heads=4, intermediate_size=80,
    embedding_size=48, hidden_act="gelu", max_position_embeddings=40, type_vocab_size=2,
    hidden_dropout=0.1, attention_dropout=0.1, layer_norm_eps=1e-12,
    initializer_range=0.2, layer_sharing="none", scan_layers=False, remat=False,
    dtype="float32", param_dtype="float32")


def small_model(**changes) -> common.ModelConfig:
  return dataclasses.replace(SMALL, **changes)


def torch_reference(config: common.ModelConfig, family: str = "bert"):
  """The family's PyTorch pretraining model, seeded, in eval mode, with biases and
  LayerNorms perturbed: Hugging Face initializes them to 0 and 1, which would hide
  a mix-up between them."""
  torch.manual_seed(0)
  model = engine.hf_pretraining_model(config, family).eval()
  with torch.no_grad():
    for name, parameter in model.named_parameters():
      if name.endswith("bias") or "LayerNorm" in name or "layer_norm" in name:
        parameter.add_(0.1 * torch.randn_like(parameter))
  return model


def padded_batch(vocab_size: int, seed: int = 0, lengths=(40, 31, 17, 6), pad_id: int = 0,
                 two_segments: bool = True):
  """(real [batch, length] bool, numpy batch): random rows padded with `pad_id`; the
  second half of each row is segment B when `two_segments`."""
  rng = np.random.default_rng(seed)
  length = max(lengths)
  real = np.arange(length)[None, :] < np.asarray(lengths)[:, None]
  input_ids = np.where(real, rng.integers(pad_id + 2, vocab_size, real.shape), pad_id)
  token_types = (np.arange(length)[None, :] >= np.asarray(lengths)[:, None] // 2) * real
  return real, {
      "input_ids": input_ids.astype(np.int32),
      "token_type_ids": (token_types if two_segments else 0 * token_types).astype(np.int32),
      "segment_ids": real.astype(np.int32),
      "positions": np.broadcast_to(np.arange(length, dtype=np.int32), real.shape).copy(),
  }


def torch_outputs(model, batch):
  """The PyTorch model's outputs; RoBERTa derives its positions from input_ids."""
  with torch.no_grad():
    return model(input_ids=torch.tensor(batch["input_ids"], dtype=torch.long),
                 attention_mask=torch.tensor(batch["segment_ids"], dtype=torch.long),
                 token_type_ids=torch.tensor(batch["token_type_ids"], dtype=torch.long))


def mlm_logits(outputs) -> np.ndarray:
  """[batch, length, vocab] of any of the pretraining models' outputs."""
  logits = getattr(outputs, "prediction_logits", None)
  return (outputs.logits if logits is None else logits).numpy()


def flax_from_torch(config: common.ModelConfig, torch_model, family: str = "bert",
                    heads=("mlm", "sentence")):
  """(Flax model, params converted from `torch_model`); every weight must fit."""
  model = pretraining.PretrainingModel(config, heads=heads)
  expected = jax.eval_shape(lambda: model.init(jax.random.key(0),
                                               pretraining.init_batch(1, 8)))["params"]
  return model, engine.from_hf(torch_model.state_dict(), config, family=family,
                               expected=expected)


def check_round_trip(state_dict, torch_model, config: common.ModelConfig, family: str,
                     tied: set[str], pad_id: int = 0) -> None:
  """`state_dict` (from to_hf) equals `torch_model`'s bit for bit but for the `tied`
  weights, and loaded into a fresh model it computes what `torch_model` does."""
  reference = torch_model.state_dict()
  assert set(state_dict) == set(reference) - tied
  for name, value in state_dict.items():
    np.testing.assert_array_equal(value, reference[name].numpy(), err_msg=name)
  fresh = engine.hf_pretraining_model(config, family).eval()
  missing, unexpected = fresh.load_state_dict(
      {k: torch.from_numpy(v) for k, v in state_dict.items()}, strict=False)
  assert set(missing) <= tied and not unexpected
  _, batch = padded_batch(config.vocab_size, seed=2, pad_id=pad_id,
                         two_segments=config.type_vocab_size > 1)
  np.testing.assert_allclose(mlm_logits(torch_outputs(fresh, batch)),
                             mlm_logits(torch_outputs(torch_model, batch)), atol=1e-6)

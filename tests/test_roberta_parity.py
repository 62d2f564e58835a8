"""The Flax RoBERTa equals Hugging Face's RobertaForMaskedLM (PyTorch) on the same
weights, with positions offset by 2 and the MLM head only."""
import dataclasses

import jax
import numpy as np
import pytest

from encoderx.configs import roberta_tiny
from encoderx.export import hf
from encoderx.models import common, pretraining

import torch
import transformers

PAD = 1  # <pad> of RoBERTa vocabularies; Hugging Face numbers positions from PAD + 1

# roberta_tiny's model fields (offset 2, one token type, LayerNorm eps 1e-5), smaller.
MODEL = common.ModelConfig.from_config(dict(
    roberta_tiny.get_config().model, vocab_size=99, hidden_size=48, num_layers=3,
    num_heads=4, intermediate_size=80, max_position_embeddings=42))


def hf_roberta_config(model: common.ModelConfig) -> "transformers.RobertaConfig":
  return transformers.RobertaConfig(
      vocab_size=model.vocab_size, hidden_size=model.hidden_size,
      num_hidden_layers=model.num_layers, num_attention_heads=model.num_heads,
      intermediate_size=model.intermediate_size, hidden_act=model.hidden_act,
      max_position_embeddings=model.max_position_embeddings,
      type_vocab_size=model.type_vocab_size, layer_norm_eps=model.layer_norm_eps,
      pad_token_id=PAD, bos_token_id=0, eos_token_id=2,
      # Larger than 0.02 so that logits are O(1-10) and the bound means something.
      initializer_range=0.2)


@pytest.fixture(scope="module")
def torch_roberta():
  torch.manual_seed(0)
  model = transformers.RobertaForMaskedLM(hf_roberta_config(MODEL)).eval()
  with torch.no_grad():  # HF initializes biases and LayerNorm trivially; make them count
    for name, parameter in model.named_parameters():
      if name.endswith("bias") or "LayerNorm" in name or "layer_norm" in name:
        parameter.add_(0.1 * torch.randn_like(parameter))
  return model


def _padded_batch(seed=0, lengths=(40, 31, 17, 6)):
  """Rows padded with <pad>; positions count from 0 in each row (the model adds the
  offset), as Hugging Face derives them from input_ids: 2, 3, ... on real tokens."""
  rng = np.random.default_rng(seed)
  real = np.arange(max(lengths))[None, :] < np.asarray(lengths)[:, None]
  input_ids = np.where(real, rng.integers(PAD + 2, MODEL.vocab_size, real.shape), PAD)
  return real, {
      "input_ids": input_ids.astype(np.int32),
      "token_type_ids": np.zeros(real.shape, np.int32),
      "segment_ids": real.astype(np.int32),
      "positions": np.broadcast_to(np.arange(real.shape[1], dtype=np.int32),
                                   real.shape).copy(),
  }


def _torch_logits(model, batch) -> np.ndarray:
  with torch.no_grad():
    return model(input_ids=torch.tensor(batch["input_ids"], dtype=torch.long),
                 attention_mask=torch.tensor(batch["segment_ids"], dtype=torch.long)
                 ).logits.numpy()


def _flax(model_config, torch_model):
  model = pretraining.PretrainingModel(model_config, heads=("mlm",))
  expected = jax.eval_shape(lambda: model.init(jax.random.key(0),
                                               pretraining.init_batch(1, 8)))["params"]
  params = hf.from_hf(torch_model.state_dict(), model_config, family="roberta",
                      expected=expected)  # every weight of the MLM-only model, no other
  return model, params


def test_mlm_logits_match_pytorch_on_padded_batches(torch_roberta):
  model, params = _flax(MODEL, torch_roberta)
  assert "pooler" not in params["encoder_model"] and "sentence_head" not in params
  real, batch = _padded_batch()
  theirs = _torch_logits(torch_roberta, batch)
  ours = np.asarray(model.apply({"params": params}, batch)["mlm_logits"])
  diff = np.abs(ours[real] - theirs[real]).max()
  assert diff <= 1e-4, diff
  assert np.abs(theirs).max() > 1.0  # not trivially small
  print(f"RobertaForMaskedLM parity: max abs diff {diff:.2e}")
  # Without the offset the positions are RoBERTa's rows 0, 1, ...: far off.
  unshifted = dataclasses.replace(MODEL, position_offset=0)
  wrong = np.asarray(model.clone(config=unshifted).apply({"params": params}, batch)[
      "mlm_logits"])
  assert np.abs(wrong[real] - theirs[real]).max() > 0.1


def test_conversion_round_trips_exactly(torch_roberta):
  scanned = dataclasses.replace(MODEL, scan_layers=True)
  _, params = _flax(scanned, torch_roberta)
  state_dict = hf.to_hf(params, scanned, family="roberta")
  reference = torch_roberta.state_dict()
  tied = {"lm_head.decoder.weight", "lm_head.decoder.bias"}
  assert set(state_dict) == set(reference) - tied
  for name, value in state_dict.items():
    np.testing.assert_array_equal(value, reference[name].numpy(), err_msg=name)
  reloaded = transformers.RobertaForMaskedLM(hf_roberta_config(MODEL)).eval()
  missing, unexpected = reloaded.load_state_dict(
      {k: torch.from_numpy(v) for k, v in state_dict.items()}, strict=False)
  assert set(missing) <= tied and not unexpected
  _, batch = _padded_batch(seed=2)
  np.testing.assert_allclose(_torch_logits(reloaded, batch),
                             _torch_logits(torch_roberta, batch), atol=1e-6)


def test_unknown_family_is_refused(torch_roberta):
  with pytest.raises(ValueError, match="family 'robreta'.*bert, roberta"):
    hf.from_hf(torch_roberta.state_dict(), MODEL, family="robreta")

"""The Flax RoBERTa equals Hugging Face's RobertaForMaskedLM (PyTorch) on the same
weights, with positions offset by 2 and the MLM head only."""
import dataclasses

import numpy as np
import pytest

from encoderx import configs
from encoderx.hf import engine
from encoderx.models import model_config as model_config_lib

from reference_models import (  # pylint: disable=g-bad-import-order  (tests/ is on sys.path)
    check_round_trip, flax_from_torch, mlm_logits, padded_batch, torch_outputs,
    torch_reference)

PAD = 1  # <pad> of RoBERTa vocabularies; Hugging Face numbers positions from PAD + 1

# roberta_tiny's model fields (offset 2, one token type, LayerNorm eps 1e-5), smaller, and
# a larger initializer_range so that logits are O(1-10).
_FIELDS = configs.get("roberta:tiny").model
_FIELDS.update(dict(vocab_size=99, hidden_size=48, num_layers=3, num_heads=4,
                    intermediate_size=80, embeddings=dict(max_positions=42),
                    init=dict(range=0.2)))
MODEL = model_config_lib.ModelConfig.from_config(_FIELDS)


@pytest.fixture(scope="module")
def torch_roberta():
  return torch_reference(MODEL, "roberta")


def _padded_batch(seed=0):
  """Rows padded with <pad>; positions count from 0 in each row (the model adds the
  offset), as Hugging Face derives them from input_ids: 2, 3, ... on real tokens."""
  return padded_batch(MODEL.vocab_size, seed=seed, pad_id=PAD, two_segments=False)


def _flax(model_config, torch_model):
  # Every weight of the MLM-only model, and no other.
  return flax_from_torch(model_config, torch_model, family="roberta", heads=("mlm",))


def test_mlm_logits_match_pytorch_on_padded_batches(torch_roberta):
  model, params = _flax(MODEL, torch_roberta)
  assert "pooler" not in params["encoder_model"] and "sentence_head" not in params
  real, batch = _padded_batch()
  theirs = mlm_logits(torch_outputs(torch_roberta, batch))
  ours = np.asarray(model.apply({"params": params}, batch)["mlm_logits"])
  diff = np.abs(ours[real] - theirs[real]).max()
  assert diff <= 1e-4, diff
  assert np.abs(theirs).max() > 1.0  # not trivially small
  print(f"RobertaForMaskedLM parity: max abs diff {diff:.2e}")
  # Without the offset the positions are RoBERTa's rows 0, 1, ...: far off.
  unshifted = MODEL.replace(embeddings=dict(position_offset=0))
  wrong = np.asarray(model.clone(config=unshifted).apply({"params": params}, batch)[
      "mlm_logits"])
  assert np.abs(wrong[real] - theirs[real]).max() > 0.1


def test_conversion_round_trips_exactly(torch_roberta):
  scanned = MODEL.replace(layout=dict(scan=True))
  _, params = _flax(scanned, torch_roberta)
  check_round_trip(engine.to_hf(params, scanned, family="roberta"), torch_roberta, MODEL,
                   "roberta", tied={"lm_head.decoder.weight", "lm_head.decoder.bias"},
                   pad_id=PAD)


def test_unknown_family_is_refused(torch_roberta):
  with pytest.raises(ValueError, match="family 'robreta'.*bert, roberta"):
    engine.from_hf(torch_roberta.state_dict(), MODEL, family="robreta")

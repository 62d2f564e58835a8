"""The Flax BERT equals Hugging Face's PyTorch BERT on the same weights."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from encoderx.hf import engine
from encoderx.models import pretraining

from reference_models import (  # pylint: disable=g-bad-import-order  (tests/ is on sys.path)
    check_round_trip, flax_from_torch, mlm_logits, padded_batch, small_model,
    torch_outputs, torch_reference)

MODEL = small_model()


@pytest.fixture(scope="module")
def torch_bert():
  return torch_reference(MODEL, "bert")


@pytest.mark.parametrize("scan_layers", [False, True])
def test_mlm_and_nsp_logits_match_pytorch_on_padded_batches(torch_bert, scan_layers):
  model, params = flax_from_torch(MODEL.replace(layout=dict(scan=scan_layers)),
                                  torch_bert)
  real, batch = padded_batch(MODEL.vocab_size)
  theirs = torch_outputs(torch_bert, batch)
  ours = model.apply({"params": params}, {k: jnp.asarray(v) for k, v in batch.items()})
  mlm_diff = np.abs(np.asarray(ours["mlm_logits"])[real] - mlm_logits(theirs)[real]).max()
  nsp_diff = np.abs(np.asarray(ours["sentence_logits"])
                    - theirs.seq_relationship_logits.numpy()).max()
  print(f"BertForPreTraining parity (scan={scan_layers}): MLM max abs {mlm_diff:.2e}, "
        f"NSP max abs {nsp_diff:.2e}")
  assert mlm_diff <= 1e-4 and nsp_diff <= 1e-4, (mlm_diff, nsp_diff)
  assert np.abs(mlm_logits(theirs)).max() > 1.0  # not trivially small


def test_masked_positions_gather_the_same_logits(torch_bert):
  model, params = flax_from_torch(MODEL, torch_bert)
  _, batch = padded_batch(MODEL.vocab_size, seed=1)
  positions = np.array([[1, 5, 39], [0, 2, 30], [3, 4, 16], [1, 2, 5]], np.int32)
  gathered = model.apply({"params": params}, {**batch, "masked_positions": positions})
  every = model.apply({"params": params}, batch)
  np.testing.assert_allclose(
      np.asarray(gathered["mlm_logits"]),
      np.take_along_axis(np.asarray(every["mlm_logits"]), positions[..., None], axis=1),
      atol=1e-5)


def test_conversion_round_trips_exactly(torch_bert):
  scanned = MODEL.replace(layout=dict(scan=True))
  _, params = flax_from_torch(scanned, torch_bert)
  check_round_trip(engine.to_hf(params, scanned), torch_bert, MODEL, "bert",
                   tied={"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"})


def test_bfloat16_compute_stays_close(torch_bert):
  model, params = flax_from_torch(dataclasses.replace(MODEL, dtype="bfloat16"), torch_bert)
  real, batch = padded_batch(MODEL.vocab_size, seed=3)
  ours = jax.jit(model.apply)({"params": params}, batch)  # jitted: eagerly is slow
  assert ours["mlm_logits"].dtype == jnp.bfloat16
  theirs = mlm_logits(torch_outputs(torch_bert, batch))[real]
  diff = np.abs(np.asarray(ours["mlm_logits"], np.float32)[real] - theirs)
  assert diff.mean() < 0.05 * np.abs(theirs).mean()


def test_weights_of_another_shape_are_refused_with_names(torch_bert):
  model = pretraining.PretrainingModel(MODEL.replace(hidden_size=64, embeddings=dict(size=64)))
  expected = jax.eval_shape(lambda: model.init(jax.random.key(0),
                                               pretraining.init_batch(1, 8)))["params"]
  with pytest.raises(ValueError, match=r"word_embeddings/embedding: shape \(99, 48\)"):
    engine.from_hf(torch_bert.state_dict(), MODEL, expected=expected)

"""The Flax BERT equals Hugging Face's PyTorch BERT on the same weights."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from encoderx.export import hf
from encoderx.models import common, pretraining

import torch
import transformers

MODEL = common.ModelConfig(
    vocab_size=99, hidden_size=48, num_layers=3, num_heads=4, intermediate_size=80,
    embedding_size=48, hidden_act="gelu", max_position_embeddings=40, type_vocab_size=2,
    hidden_dropout=0.1, attention_dropout=0.1, layer_norm_eps=1e-12,
    initializer_range=0.02, layer_sharing="none", scan_layers=False, remat=False,
    dtype="float32", param_dtype="float32")


def hf_bert_config(model: common.ModelConfig) -> "transformers.BertConfig":
  return transformers.BertConfig(
      vocab_size=model.vocab_size, hidden_size=model.hidden_size,
      num_hidden_layers=model.num_layers, num_attention_heads=model.num_heads,
      intermediate_size=model.intermediate_size, hidden_act=model.hidden_act,
      max_position_embeddings=model.max_position_embeddings,
      type_vocab_size=model.type_vocab_size, layer_norm_eps=model.layer_norm_eps,
      # Larger than BERT's 0.02 so that logits are O(1-10) and the bound means something.
      initializer_range=0.2)


@pytest.fixture(scope="module")
def torch_bert():
  torch.manual_seed(0)
  model = transformers.BertForPreTraining(hf_bert_config(MODEL)).eval()
  with torch.no_grad():  # HF initializes biases and LayerNorm trivially; make them count
    for name, parameter in model.named_parameters():
      if name.endswith("bias") or "LayerNorm" in name:
        parameter.add_(0.1 * torch.randn_like(parameter))
  return model


def _padded_batch(seed=0, lengths=(40, 31, 17, 6)):
  rng = np.random.default_rng(seed)
  batch_size, length = len(lengths), max(lengths)
  real = np.arange(length)[None, :] < np.asarray(lengths)[:, None]
  input_ids = rng.integers(5, MODEL.vocab_size, (batch_size, length)) * real
  token_types = (np.arange(length)[None, :] >= np.asarray(lengths)[:, None] // 2) * real
  return real, {
      "input_ids": input_ids.astype(np.int32),
      "token_type_ids": token_types.astype(np.int32),
      "segment_ids": real.astype(np.int32),
      "positions": np.broadcast_to(np.arange(length, dtype=np.int32), real.shape).copy(),
  }


def _torch_outputs(model, batch):
  with torch.no_grad():
    return model(input_ids=torch.tensor(batch["input_ids"], dtype=torch.long),
                 attention_mask=torch.tensor(batch["segment_ids"], dtype=torch.long),
                 token_type_ids=torch.tensor(batch["token_type_ids"], dtype=torch.long))


def _flax(model_config, torch_model):
  model = pretraining.PretrainingModel(model_config)
  expected = jax.eval_shape(lambda: model.init(jax.random.key(0),
                                               pretraining.init_batch(1, 8)))["params"]
  return model, hf.from_hf(torch_model.state_dict(), model_config, expected=expected)


@pytest.mark.parametrize("scan_layers", [False, True])
def test_mlm_and_nsp_logits_match_pytorch_on_padded_batches(torch_bert, scan_layers):
  model_config = dataclasses.replace(MODEL, scan_layers=scan_layers)
  model, params = _flax(model_config, torch_bert)
  real, batch = _padded_batch()
  theirs = _torch_outputs(torch_bert, batch)
  ours = model.apply({"params": params}, {k: jnp.asarray(v) for k, v in batch.items()})
  mlm_diff = np.abs(np.asarray(ours["mlm_logits"])[real]
                    - theirs.prediction_logits.numpy()[real]).max()
  nsp_diff = np.abs(np.asarray(ours["sentence_logits"])
                    - theirs.seq_relationship_logits.numpy()).max()
  assert mlm_diff <= 1e-4 and nsp_diff <= 1e-4, (mlm_diff, nsp_diff)
  assert np.abs(theirs.prediction_logits.numpy()).max() > 1.0  # not trivially small


def test_masked_positions_gather_the_same_logits(torch_bert):
  model, params = _flax(MODEL, torch_bert)
  real, batch = _padded_batch(seed=1)
  positions = np.array([[1, 5, 39], [0, 2, 30], [3, 4, 16], [1, 2, 5]], np.int32)
  gathered = model.apply({"params": params}, {**batch, "masked_positions": positions})
  every = model.apply({"params": params}, batch)
  np.testing.assert_allclose(
      np.asarray(gathered["mlm_logits"]),
      np.take_along_axis(np.asarray(every["mlm_logits"]), positions[..., None], axis=1),
      atol=1e-5)


def check_round_trip(state_dict, torch_model, fresh_model, tied: set[str]) -> None:
  """`state_dict` (from to_hf) equals `torch_model`'s bit for bit but for the `tied`
  weights, and loaded into `fresh_model` it computes what `torch_model` does."""
  reference = torch_model.state_dict()
  assert set(state_dict) == set(reference) - tied
  for name, value in state_dict.items():
    np.testing.assert_array_equal(value, reference[name].numpy(), err_msg=name)
  missing, unexpected = fresh_model.load_state_dict(
      {k: torch.from_numpy(v) for k, v in state_dict.items()}, strict=False)
  assert set(missing) <= tied and not unexpected
  _, batch = _padded_batch(seed=2)
  np.testing.assert_allclose(_torch_outputs(fresh_model, batch).prediction_logits.numpy(),
                             _torch_outputs(torch_model, batch).prediction_logits.numpy(),
                             atol=1e-6)


def test_conversion_round_trips_exactly(torch_bert):
  _, params = _flax(dataclasses.replace(MODEL, scan_layers=True), torch_bert)
  state_dict = hf.to_hf(params, dataclasses.replace(MODEL, scan_layers=True))
  check_round_trip(state_dict, torch_bert,
                   transformers.BertForPreTraining(hf_bert_config(MODEL)).eval(),
                   tied={"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"})


def test_bfloat16_compute_stays_close(torch_bert):
  model, params = _flax(dataclasses.replace(MODEL, dtype="bfloat16"), torch_bert)
  real, batch = _padded_batch(seed=3)
  ours = model.apply({"params": params}, batch)
  assert ours["mlm_logits"].dtype == jnp.bfloat16
  theirs = _torch_outputs(torch_bert, batch).prediction_logits.numpy()[real]
  diff = np.abs(np.asarray(ours["mlm_logits"], np.float32)[real] - theirs)
  assert diff.mean() < 0.05 * np.abs(theirs).mean()


def test_weights_of_another_shape_are_refused_with_names(torch_bert):
  model = pretraining.PretrainingModel(dataclasses.replace(MODEL, hidden_size=64,
                                                           embedding_size=64))
  expected = jax.eval_shape(lambda: model.init(jax.random.key(0),
                                               pretraining.init_batch(1, 8)))["params"]
  with pytest.raises(ValueError, match=r"word_embeddings/embedding: shape \(99, 48\)"):
    hf.from_hf(torch_bert.state_dict(), MODEL, expected=expected)

"""ELECTRA (method 'electra'): parity of the generator and discriminator with Hugging Face
(ElectraForMaskedLM, ElectraForPreTraining), ELECTRA's masking and sampling, the
embedding sharing (shared, GDES) and its gradients, joint and decoupled training, sharded
runs, resume, learning, --init_from and validation."""
import dataclasses

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
import transformers
from scipy import stats

from encoderx import config as config_lib
from encoderx import initialize, method as method_lib, train, trainer as trainer_lib
from encoderx.data import pipeline, resources
from encoderx.export import hf
from encoderx.methods import electra
from encoderx.objectives import rtd

from reference_models import padded_batch  # pylint: disable=g-bad-import-order

ONE_DEVICE = jax.devices()[:1]


def _config(tiny_config, sharing="shared", training="joint", **rtd_fields):
  config = tiny_config("electra_tiny")
  config.rtd.embedding_sharing, config.rtd.training = sharing, training
  for field, value in rtd_fields.items():
    config.rtd[field] = value
  return config


def _deterministic(config):
  config.model.hidden_dropout = config.model.attention_dropout = 0.0
  return config


def _flat(tree) -> dict[str, np.ndarray]:
  return {"/".join(path): np.asarray(leaf)
          for path, leaf in flax.traverse_util.flatten_dict(jax.device_get(tree)).items()}


def _max_difference(a, b) -> float:
  a, b = _flat(a), _flat(b)
  assert a.keys() == b.keys()
  return max(float(np.abs(a[k] - b[k]).max()) for k in a)


# --- parity with Hugging Face ---------------------------------------------------------------
def _parity_method(tiny_config):
  """ELECTRA with a projection on both sides: embeddings 32 wide, discriminator 48
  (4 heads), generator 24 (2 heads); a larger initializer_range so logits are O(1-10)."""
  config = _config(tiny_config, generator_width=0.5)
  config.model.update(hidden_size=48, num_heads=4, intermediate_size=80, embedding_size=32,
                      max_position_embeddings=64, initializer_range=0.2)
  return electra.ReplacedTokenDetection(config_lib.validate(config))


def _torch_model(model_class, model_config):
  """A seeded PyTorch ELECTRA in eval mode, biases and LayerNorms perturbed (Hugging Face
  initializes them to 0 and 1, which would hide a mix-up)."""
  torch.manual_seed(0)
  model = model_class(hf.hf_config(model_config, "electra")).eval()
  with torch.no_grad():
    for name, parameter in model.named_parameters():
      if name.endswith("bias") or "LayerNorm" in name:
        parameter.add_(0.1 * torch.randn_like(parameter))
  return model


@pytest.fixture(scope="module")
def electra_pair(tmp_path_factory):
  """(method, ElectraForMaskedLM generator, ElectraForPreTraining discriminator sharing the
  generator's embeddings, as the released pairs do)."""
  from conftest import _tiny_config  # pylint: disable=g-import-not-at-top
  method = _parity_method(_tiny_config)
  discriminator = _torch_model(transformers.ElectraForPreTraining, method.model_config)
  generator = _torch_model(transformers.ElectraForMaskedLM, method.generator_config)
  generator.electra.embeddings.load_state_dict(
      discriminator.electra.embeddings.state_dict())
  return method, generator, discriminator


def _method_params(method, generator, discriminator):
  """The method's parameters converted from the two PyTorch models; every weight fits."""
  generator_params = hf.from_hf(generator.state_dict(), method.generator_config,
                                family="electra")
  discriminator_params = hf.from_hf(discriminator.state_dict(), method.model_config,
                                    family="electra")
  params = method.with_transferable_params({electra.GENERATOR: generator_params},
                                           discriminator_params)
  hf.check_tree(params, jax.eval_shape(method.init, jax.random.key(0))["params"])
  return params


def _torch_logits(model, batch) -> np.ndarray:
  with torch.no_grad():
    return model(input_ids=torch.tensor(batch["input_ids"], dtype=torch.long),
                 attention_mask=torch.tensor(batch["segment_ids"], dtype=torch.long),
                 token_type_ids=torch.tensor(batch["token_type_ids"], dtype=torch.long)
                 ).logits.numpy()


def test_generator_and_discriminator_match_pytorch_on_padded_batches(electra_pair):
  method, generator, discriminator = electra_pair
  params = _method_params(method, generator, discriminator)
  real, batch = padded_batch(method.model_config.vocab_size)
  ours_mlm = np.asarray(method.generator.apply({"params": params["generator"]}, batch)[
      "mlm_logits"])
  ours_rtd = np.asarray(method.discriminator.apply(
      {"params": method.discriminator_params(params)}, batch)["rtd_logits"])
  theirs_mlm, theirs_rtd = _torch_logits(generator, batch), _torch_logits(discriminator,
                                                                         batch)
  mlm_diff = np.abs(ours_mlm[real] - theirs_mlm[real]).max()
  rtd_diff = np.abs(ours_rtd[real] - theirs_rtd[real]).max()
  print(f"ElectraForMaskedLM parity: max abs {mlm_diff:.2e}; ElectraForPreTraining: "
        f"{rtd_diff:.2e}")
  assert mlm_diff <= 1e-4 and rtd_diff <= 1e-4, (mlm_diff, rtd_diff)
  assert np.abs(theirs_mlm).max() > 1.0 and np.abs(theirs_rtd).max() > 1.0
  # The shared embedding is really the generator's: changing it changes both models.
  layer_norm = params["generator"]["encoder_model"]["embeddings"]["layer_norm"]
  layer_norm["bias"] = layer_norm["bias"] + 0.5  # (not in place: it is the torch tensor's)
  moved = np.asarray(method.discriminator.apply(
      {"params": method.discriminator_params(params)}, batch)["rtd_logits"])
  assert np.abs(moved[real] - ours_rtd[real]).max() > 0.01


def test_conversion_round_trips_exactly(electra_pair):
  method, generator, discriminator = electra_pair
  params = _method_params(method, generator, discriminator)
  for model, ours, model_config, tied in (
      (discriminator, method.transferable_params(params), method.model_config, set()),
      (generator, params["generator"], method.generator_config,
       {"generator_lm_head.weight"})):
    reference = model.state_dict()
    exported = hf.to_hf(ours, model_config, family="electra")
    assert set(exported) == set(reference) - tied
    for name, value in exported.items():
      np.testing.assert_array_equal(value, reference[name].numpy(), err_msg=name)


# --- masking and sampling -------------------------------------------------------------------
@pytest.fixture(scope="module")
def electra_batches():
  """(method of electra_tiny, 8 real batches of 32 rows of 128 tokens)."""
  from encoderx.configs import electra_tiny  # pylint: disable=g-import-not-at-top
  method = electra.ReplacedTokenDetection(config_lib.validate(electra_tiny.get_config()))
  return method, pipeline.take_batches(method.task(), "train", 128, 32, 8, seed=5)


def test_masking_is_electras_15_percent_85_mask_15_kept_none_random(electra_batches):
  method, batches = electra_batches
  prepare = jax.jit(method.prepare)
  mask_id, special = method.vocabulary.mask_id, set(method.vocabulary.special_ids)
  selected = candidates = masked = kept = 0
  for index, batch in enumerate(batches):
    prepared = jax.device_get(prepare(batch, jax.random.key(index)))
    weights = prepared["masked_weights"] > 0
    positions = prepared["masked_positions"]
    now = np.take_along_axis(prepared["input_ids"], positions, axis=1)[weights]
    original = prepared["masked_ids"][weights]
    assert not set(original.tolist()) & special  # never a special or padding token
    np.testing.assert_array_equal(np.take_along_axis(batch["input_ids"], positions,
                                                     axis=1)[weights], original)
    masked += int((now == mask_id).sum())
    kept += int((now == original).sum())
    assert (now == mask_id).sum() + (now == original).sum() == now.size  # none random
    untouched = np.ones_like(batch["input_ids"], bool)
    np.put_along_axis(untouched, positions, ~weights, axis=1)
    np.testing.assert_array_equal(prepared["input_ids"][untouched],
                                  batch["input_ids"][untouched])
    selected += int(weights.sum())
    candidates += int(((batch["segment_ids"] > 0)
                       & ~np.isin(batch["input_ids"], list(special))).sum())
  print(f"selected {selected / candidates:.4f} of {candidates} candidates; [MASK] "
        f"{masked / selected:.4f}, kept {kept / selected:.4f}")
  # Each row masks round(15% of its candidates): the total is within rounding of 15%.
  assert abs(selected - 0.15 * candidates) <= 0.5 * 8 * 32
  # 85% [MASK] within 4 standard deviations of the binomial.
  assert abs(masked - 0.85 * selected) <= 4 * np.sqrt(selected * 0.85 * 0.15)


def test_samples_follow_the_generator_softmax_and_replaced_means_different():
  probabilities = np.asarray([0.5, 0.3, 0.15, 0.05])
  logits = jnp.log(jnp.asarray(probabilities, jnp.float32))
  draws = np.asarray(rtd.sample(jnp.broadcast_to(logits, (4000, 5, 4)), jax.random.key(0)))
  counts = np.bincount(draws.ravel(), minlength=4)
  _, p_value = stats.chisquare(counts, counts.sum() * probabilities)
  assert p_value > 1e-3, counts
  assert jax.grad(lambda x: rtd.sample(x, jax.random.key(1)).sum().astype(float))(
      logits).sum() == 0.0

  batch = {"input_ids": jnp.asarray([[2, 4, 9, 9, 3, 0]]),  # [MASK]=9 at 2 and 3
           "masked_positions": jnp.asarray([[2, 3, 1]]), "masked_ids": jnp.asarray([[5, 6, 4]]),
           "masked_weights": jnp.asarray([[1.0, 1.0, 0.0]])}
  corrupted = rtd.replace_with_samples(batch, jnp.asarray([[5, 7, 8]]))
  # Position 2 sampled its original (not replaced), 3 another token, the unused slot
  # (weight 0) writes nothing.
  np.testing.assert_array_equal(corrupted["input_ids"], [[2, 4, 5, 7, 3, 0]])
  np.testing.assert_array_equal(corrupted["rtd_labels"], [[0, 0, 0, 1, 0, 0]])
  assert float(rtd.sample_terms(jnp.asarray([[5, 7, 8]]), batch)["sampled_correct"]) == 1.0

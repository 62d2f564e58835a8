"""MLM masking: BERT's proportions, what may be chosen, per-step keys, device count."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from encoderx import sharding
from encoderx.objectives import mlm
from encoderx.train import trainer as trainer_lib


def _config(vocabulary, **fields):
  return mlm.MlmConfig(mask_id=vocabulary.mask_id, special_ids=vocabulary.special_ids,
                       vocab_size=vocabulary.vocab_size, **fields)


def _chosen(batch, masked):
  """Per prediction: original id, id after masking, row; weight-0 slots dropped."""
  weights = np.asarray(masked["masked_weights"]) > 0
  rows = np.nonzero(weights)[0]
  positions = np.asarray(masked["masked_positions"])[weights]
  return (batch["input_ids"][rows, positions], np.asarray(masked["input_ids"])[rows, positions],
          rows, positions)


def test_proportions_match_bert(austen_batch, vocabulary):
  config = _config(vocabulary, max_predictions=128)
  mask = jax.jit(lambda b, k: mlm.mask_tokens(b, k, config))
  candidates = np.asarray(mlm.candidate_mask(austen_batch, vocabulary.special_ids))
  originals, news = [], []
  for seed in range(10):
    masked = mask(austen_batch, jax.random.key(seed))
    weights = np.asarray(masked["masked_weights"]) > 0
    expected = np.maximum(np.round(0.15 * candidates.sum(1)), 1)
    np.testing.assert_array_equal(weights.sum(1), expected)
    original, new, _, _ = _chosen(austen_batch, masked)
    originals.append(original)
    news.append(new)
  original, new = np.concatenate(originals), np.concatenate(news)
  assert len(original) > 10_000
  as_mask = np.mean(new == vocabulary.mask_id)
  kept = np.mean(new == original)
  random = np.mean((new != original) & (new != vocabulary.mask_id))
  # 3 standard deviations of a binomial over ~11k predictions is about 0.012.
  assert abs(as_mask - 0.8) < 0.015 and abs(kept - 0.1) < 0.012
  assert abs(random - 0.1) < 0.012
  assert 0.148 < len(original) / (10 * candidates.sum()) < 0.152


def test_never_chooses_special_or_padding_and_never_inserts_special(austen_batch, vocabulary):
  config = _config(vocabulary, max_predictions=20)
  special = set(vocabulary.special_ids)
  for seed in range(5):
    masked = mlm.mask_tokens(austen_batch, jax.random.key(seed), config)
    original, new, rows, positions = _chosen(austen_batch, masked)
    assert not set(original.tolist()) & special
    assert (austen_batch["segment_ids"][rows, positions] > 0).all()
    replaced = new[(new != original) & (new != vocabulary.mask_id)]
    assert not set(replaced.tolist()) & special
    # Outside the chosen positions nothing changes.
    untouched = np.ones(austen_batch["input_ids"].shape, bool)
    untouched[rows, positions] = False
    np.testing.assert_array_equal(np.asarray(masked["input_ids"])[untouched],
                                  austen_batch["input_ids"][untouched])
    assert (np.asarray(masked["masked_weights"]).sum(1) <= 20).all()
    padded_row = austen_batch["segment_ids"][0].sum()
    assert (np.asarray(masked["masked_positions"])[0][
        np.asarray(masked["masked_weights"])[0] > 0] < padded_row).all()


# Units other than 'token' share one selection (mlm.select_units); 'span' stands for them.
@pytest.mark.parametrize("unit", ["token", "span"])
def test_masks_change_with_the_step_and_repeat_for_the_same_step(austen_batch, vocabulary,
                                                                 unit):
  config = _config(vocabulary, unit=unit)
  mask = jax.jit(lambda b, k: mlm.mask_tokens(b, k, config))
  rng = trainer_lib.run_rng(seed=0)
  masks = {}
  for step in (0, 1, 0):
    key, _ = trainer_lib.step_keys(rng, step)
    masks.setdefault(step, []).append(np.asarray(mask(austen_batch, key)["masked_positions"]))
  np.testing.assert_array_equal(masks[0][0], masks[0][1])
  assert np.mean(masks[0][0] != masks[1][0]) > 0.5


@pytest.mark.parametrize("unit", ["token", "span"])
def test_same_seed_and_step_give_the_same_mask_on_one_and_eight_devices(austen_batch,
                                                                        vocabulary, unit):
  assert jax.device_count() == 8
  config = _config(vocabulary, unit=unit)
  key, _ = trainer_lib.step_keys(trainer_lib.run_rng(seed=7), 123)
  mask = lambda b, k: mlm.mask_tokens(b, k, config)  # noqa: E731

  one = jax.jit(mask)(jax.device_put(austen_batch, jax.devices()[0]), key)

  import ml_collections
  mesh = sharding.make_mesh(ml_collections.ConfigDict(dict(data=4, fsdp=2, tensor=1)))
  batch_sharding = sharding.batch_sharding(mesh)
  sharded_batch = jax.device_put(austen_batch, batch_sharding)
  with jax.set_mesh(mesh):
    eight = jax.jit(mask, in_shardings=(batch_sharding, NamedSharding(mesh, PartitionSpec())),
                    out_shardings=batch_sharding)(sharded_batch, key)
  assert len(eight["input_ids"].sharding.device_set) == 8
  for name in one:
    np.testing.assert_array_equal(np.asarray(one[name]), np.asarray(eight[name]), name)


def test_masking_is_a_pure_function_of_its_inputs(austen_batch, vocabulary):
  config = _config(vocabulary)
  key = jax.random.key(3)
  before = austen_batch["input_ids"].copy()
  first = mlm.mask_tokens(austen_batch, key, config)
  second = jax.jit(lambda b, k: mlm.mask_tokens(b, k, config))(
      {k: jnp.asarray(v) for k, v in austen_batch.items()}, key)
  for name in first:
    np.testing.assert_array_equal(np.asarray(first[name]), np.asarray(second[name]))
  np.testing.assert_array_equal(austen_batch["input_ids"], before)  # input not mutated

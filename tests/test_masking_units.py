"""Whole-word, n-gram and span masking: the papers' statistics, whole words only, one
treatment per unit, boundaries, the cap. (Per-step keys and the device count are tested
for every unit in test_masking.py.)"""
import jax
import numpy as np

from encoderx.objectives import base, mlm

SEEDS = 100


def _config(vocabulary, unit, **fields):
  fields = {"max_predictions": 32, "span_geometric_p": 0.2, "max_span_words": 10,
            "max_ngram": 3, **fields}
  return mlm.MlmConfig(mask_id=vocabulary.mask_id, special_ids=vocabulary.special_ids,
                       vocab_size=vocabulary.vocab_size, unit=unit, **fields)


def _single_segments(batch, sep_id):
  """[CLS] A [SEP] B [SEP] -> [CLS] A B [SEP]: one segment per row, as SpanBERT trains on."""
  single = {name: np.zeros_like(batch[name])
            for name in ("input_ids", "token_type_ids", "segment_ids", "positions",
                         "word_starts")}
  for row, ids in enumerate(batch["input_ids"]):
    keep = np.ones(len(ids), bool)
    separators = np.flatnonzero(ids == sep_id)
    if len(separators) > 1:
      keep[separators[0]] = False
    for name in ("input_ids", "segment_ids", "word_starts"):
      single[name][row, :keep.sum()] = batch[name][row][keep]
  real = single["segment_ids"] > 0
  single["positions"] = np.where(real, np.cumsum(real, axis=1) - 1, 0)
  return single


def _packed(single):
  """Each row holds two sequences (segment ids 1 and 2) with no special token between."""
  packed = {name: value.copy() for name, value in single.items()}
  second = (np.arange(single["input_ids"].shape[1]) >= 64)[None, :] & (
      single["segment_ids"] > 0)
  packed["segment_ids"] = np.where(second, 2, single["segment_ids"])
  packed["word_starts"][:, 64] = 1
  return packed


def _mask(batch, config, seeds=SEEDS):
  mask = jax.jit(lambda b, k: mlm.mask_tokens(b, k, config))
  return [jax.device_get(mask(batch, jax.random.key(seed))) for seed in range(seeds)]


def _chosen(masked):
  """[batch, length] bool: the predicted tokens."""
  chosen = np.zeros(masked["input_ids"].shape, bool)
  weights = masked["masked_weights"] > 0
  chosen[np.nonzero(weights)[0], masked["masked_positions"][weights]] = True
  return chosen


def _units(chosen):
  """(rows, firsts, lasts) of the runs of chosen tokens."""
  edges = np.diff(np.pad(chosen, ((0, 0), (1, 1))).astype(int), axis=1)
  rows, firsts = np.nonzero(edges == 1)
  _, ends = np.nonzero(edges == -1)
  return rows, firsts, ends - 1


def _words_in(batch, rows, firsts, lasts):
  starts = np.cumsum(batch["word_starts"], axis=1)
  return starts[rows, lasts] - starts[rows, firsts] + batch["word_starts"][rows, firsts]


def _unit_lengths(batch, config, seeds=SEEDS):
  return np.concatenate([_words_in(batch, *_units(_chosen(masked)))
                         for masked in _mask(batch, config, seeds)])


def test_span_lengths_follow_the_clipped_geometric(austen_batch, vocabulary):
  batch = _single_segments(austen_batch, vocabulary.sep_id)
  lengths = _unit_lengths(batch, _config(vocabulary, "span"))
  # SpanBERT: Geo(0.2) restricted to 1..10 words, renormalized.
  n = np.arange(1, 11)
  p = 0.2 * 0.8 ** (n - 1)
  p /= p.sum()
  mean, sd = (n * p).sum(), np.sqrt((n ** 2 * p).sum() - (n * p).sum() ** 2)
  assert abs(mean - 3.797) < 1e-3
  assert len(lengths) > 20_000 and lengths.min() >= 1 and lengths.max() <= 10
  standard_error = sd / np.sqrt(len(lengths))
  assert abs(lengths.mean() - mean) < 3 * standard_error, (lengths.mean(), mean)
  observed = np.bincount(lengths, minlength=11)[1:]
  chi_square = ((observed - len(lengths) * p) ** 2 / (len(lengths) * p)).sum()
  assert chi_square < 27.9  # 9 degrees of freedom, p = 0.001


def test_ngram_lengths_follow_one_over_n(austen_batch, vocabulary):
  batch = _single_segments(austen_batch, vocabulary.sep_id)
  lengths = _unit_lengths(batch, _config(vocabulary, "ngram"), seeds=40)
  expected = np.array([6, 3, 2]) / 11  # p(n) ~ 1/n, n <= 3 (ALBERT)
  observed = np.bincount(lengths, minlength=4)[1:]
  assert observed.sum() == len(lengths) > 20_000
  chi_square = ((observed - len(lengths) * expected) ** 2 / (len(lengths) * expected)).sum()
  assert chi_square < 13.8  # 2 degrees of freedom, p = 0.001


def test_about_15_percent_of_candidates_are_masked(austen_batch, vocabulary):
  candidates = np.asarray(mlm.candidate_mask(austen_batch, vocabulary.special_ids))
  budget = np.maximum(np.round(0.15 * candidates.sum(1)), 1)
  for unit in ("word", "ngram", "span"):
    counts = np.stack([(m["masked_weights"] > 0).sum(1) for m in
                       _mask(austen_batch, _config(vocabulary, unit), seeds=50)])
    assert (counts >= 1).all() and (counts <= 32).all()
    over = counts - budget  # the unit crossing the budget passes it as often as not
    assert abs(over.mean()) < 4 * over.std() / np.sqrt(over.size), (unit, over.mean())
    assert abs(counts.sum() / (50 * candidates.sum()) - 0.15) < 0.004, unit
    if unit == "word":  # the budget is met to within a word
      word_starts = np.flatnonzero(austen_batch["word_starts"].ravel())
      longest_word = np.diff(word_starts).max()
      assert np.abs(over).max() <= longest_word


def test_units_are_whole_words_of_one_sequence_never_special_or_padding(austen_batch,
                                                                         vocabulary):
  single = _single_segments(austen_batch, vocabulary.sep_id)
  for batch in (austen_batch, _packed(single)):
    special = np.isin(batch["input_ids"], vocabulary.special_ids)
    candidate = (batch["segment_ids"] > 0) & ~special
    # A token continues the word before it (a '##' piece): no unit may start or end there.
    continuation = candidate & (batch["word_starts"] == 0)
    for unit in ("word", "ngram", "span"):
      for masked in _mask(batch, _config(vocabulary, unit), seeds=10):
        chosen = _chosen(masked)
        assert not (chosen & ~candidate).any()
        rows, firsts, lasts = _units(chosen)
        assert not continuation[rows, firsts].any()
        after = np.minimum(lasts + 1, chosen.shape[1] - 1)
        assert not (continuation[rows, after] & (lasts + 1 < chosen.shape[1])).any()
        assert (batch["segment_ids"][rows, firsts] == batch["segment_ids"][rows, lasts]).all()
        assert (batch["token_type_ids"][rows, firsts]
                == batch["token_type_ids"][rows, lasts]).all()
        if unit == "word":
          assert (_words_in(batch, rows, firsts, lasts) == 1).all()
        # Outside the units nothing changes.
        np.testing.assert_array_equal(masked["input_ids"][~chosen], batch["input_ids"][~chosen])


def test_every_prediction_knows_its_unit_boundaries_and_offset(austen_batch, vocabulary):
  for masked in _mask(austen_batch, _config(vocabulary, "span"), seeds=5):
    chosen = _chosen(masked)
    unit_first = np.zeros(chosen.shape, int)
    unit_last = np.zeros(chosen.shape, int)
    for row, first, last in zip(*_units(chosen)):
      unit_first[row, first:last + 1], unit_last[row, first:last + 1] = first, last
    weights = masked["masked_weights"] > 0
    rows = np.nonzero(weights)[0]
    positions = masked["masked_positions"][weights]
    left, right = masked["masked_unit_left"][weights], masked["masked_unit_right"][weights]
    np.testing.assert_array_equal(left, unit_first[rows, positions] - 1)
    np.testing.assert_array_equal(right, unit_last[rows, positions] + 1)
    np.testing.assert_array_equal(masked["masked_unit_offset"][weights],
                                  positions - unit_first[rows, positions])
    # Units never touch: the boundary tokens are seen, never masked.
    assert not chosen[rows, left].any() and not chosen[rows, right].any()
  token = _mask(austen_batch, _config(vocabulary, "token"), seeds=1)[0]
  weights = token["masked_weights"] > 0
  np.testing.assert_array_equal(token["masked_unit_left"][weights],
                                token["masked_positions"][weights] - 1)
  np.testing.assert_array_equal(token["masked_unit_offset"][weights], 0)


def test_each_unit_is_all_mask_all_random_or_all_kept_80_10_10(austen_batch, vocabulary):
  treatments = []
  special = set(vocabulary.special_ids)
  for masked in _mask(austen_batch, _config(vocabulary, "span"), seeds=60):
    for row, first, last in zip(*_units(_chosen(masked))):
      original = austen_batch["input_ids"][row, first:last + 1]
      now = masked["input_ids"][row, first:last + 1]
      as_mask = now == vocabulary.mask_id
      if as_mask.all():
        treatments.append("mask")
      elif (now == original).all():
        treatments.append("kept")
      else:  # random tokens (one may equal the original by chance), never [MASK]
        assert not as_mask.any() and not set(now.tolist()) & special
        treatments.append("random")
  treatments = np.array(treatments)
  count = len(treatments)
  assert count > 10_000
  for treatment, p in (("mask", 0.8), ("random", 0.1), ("kept", 0.1)):
    # 4 standard deviations of a binomial proportion over the units.
    assert abs(np.mean(treatments == treatment) - p) < 4 * np.sqrt(p * (1 - p) / count)


def test_never_more_than_max_predictions(austen_batch, vocabulary):
  config = _config(vocabulary, "span", rate=0.5, max_predictions=12)
  for masked in _mask(austen_batch, config, seeds=5):
    counts = (masked["masked_weights"] > 0).sum(1)
    assert counts.max() <= 12 and counts.min() >= 1
    assert (_chosen(masked).sum(1) == counts).all()  # positions are distinct


def test_classification_terms_score_as_softmax_cross_entropy_and_argmax():
  """The loss is the softmax cross-entropy at the label and a prediction is correct where
  the argmax is the label (the accuracy reads the logsumexp's maximum instead), summed
  over the weighted examples only."""
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(4, 6, 50)).astype(np.float32)
  labels = rng.integers(0, 50, (4, 6))
  labels[0, :3] = logits[0, :3].argmax(-1)  # some right
  weights = (rng.random((4, 6)) > 0.3).astype(np.float32)
  weights[0, :2] = 1
  terms = base.classification_terms(jax.numpy.asarray(logits), jax.numpy.asarray(labels),
                                    jax.numpy.asarray(weights))
  shifted = logits - logits.max(-1, keepdims=True)
  log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
  loss = -np.take_along_axis(log_probs, labels[..., None], -1)[..., 0]
  np.testing.assert_allclose(terms["loss_sum"], (loss * weights).sum(), rtol=1e-6)
  assert terms["correct"] == ((logits.argmax(-1) == labels) * weights).sum() > 0
  assert terms["count"] == weights.sum()

"""Pairs from unlabelled text (crops, ICT) and batches of one source each."""
import math

import numpy as np
import pytest

from encoderx.data import unlabelled_pairs as pairs

DOCUMENTS = [" ".join(f"d{d}w{i}" for i in range(40 + 7 * d)) for d in range(20)]


def test_crops_are_spans_within_ratio_bounds_and_differ():
  made = pairs.crop_pairs(DOCUMENTS, seed=3)
  differ = 0
  for document, anchor, positive in zip(DOCUMENTS, made["text"], made["text_pair"]):
    words = document.split()
    for crop in (anchor, positive):
      assert f" {crop} " in f" {document} "  # a contiguous span of whole words
      ratio = len(crop.split()) / len(words)
      assert 0.1 - 1 / len(words) < ratio <= 0.5
    differ += anchor != positive
  assert differ >= len(DOCUMENTS) - 1


def test_crops_same_seed_same_pairs_other_epoch_other_pairs():
  assert pairs.crop_pairs(DOCUMENTS, 7) == pairs.crop_pairs(DOCUMENTS, 7)
  assert pairs.crop_pairs(DOCUMENTS, 7)["text"] != pairs.crop_pairs(DOCUMENTS, 8)["text"]


def test_ict_query_is_a_sentence_kept_with_probability_a_tenth():
  passage = pairs.sentences("One a. Two b! Three c? Four d. Five e.")
  assert passage == ["One a.", "Two b!", "Three c?", "Four d.", "Five e."]
  count = 4000
  made = pairs.ict_pairs([passage] * count, seed=0)
  kept = 0
  for query, positive in zip(made["text"], made["text_pair"]):
    assert query in passage
    rest = [s for s in passage if s != query]
    assert all(s in positive for s in rest)
    kept += query in positive
  # the binomial's mean 0.1 n, within 4 standard deviations
  assert abs(kept - 0.1 * count) < 4 * math.sqrt(count * 0.1 * 0.9)


def test_sentence_per_line_passages_are_their_lines():
  assert pairs.sentences("a b.\nc d", sentence_per_line=True) == ["a b.", "c d"]


def source_of(row, sizes):
  return int(np.searchsorted(np.cumsum(sizes), row, side="right"))


@pytest.mark.parametrize("sampling", pairs.SOURCE_SAMPLINGS)
def test_every_batch_is_of_one_source(sampling):
  sizes, batch = [400, 100, 40], 4
  starts = np.cumsum([0] + sizes[:-1])
  orders = [list(start + np.random.default_rng(s).permutation(size))
            for s, (start, size) in enumerate(zip(starts, sizes))]
  rows = pairs.source_batch_order(orders, batch, seed=1, sampling=sampling)
  assert len(rows) == len(set(rows)) and len(rows) % batch == 0
  sources = [{source_of(r, sizes) for r in rows[i:i + batch]}
             for i in range(0, len(rows), batch)]
  assert all(len(s) == 1 for s in sources)
  sequence = [s.pop() for s in sources]
  if sampling == "round_robin":
    assert sequence == [0, 1, 2] * (sizes[-1] // batch)
  else:  # every batch of every source, in proportion: sources spread over the epoch
    assert [sequence.count(s) for s in range(3)] == [size // batch for size in sizes]
    first_half = sequence[:len(sequence) // 2]
    assert abs(first_half.count(0) - len(first_half) * 100 / 135) < 4 * math.sqrt(
        len(first_half) * 0.25)
    assert pairs.source_batch_order(orders, batch, 1) == rows
    assert pairs.source_batch_order(orders, batch, 2) != rows

"""Fine-tuning batches cut to length buckets (finetune.length_buckets, encoderx/data/buckets.py):
the cut keeps every real token and drops only padding; a classify run with buckets gives
the losses and dev metrics of the same run at data.seq_length (dropout off), with fewer
padded tokens, and a tagger's evaluation joins per-token outputs of several lengths; the
config refuses buckets outside the sequence length and for methods that read every batch
whole."""
import logging
import re

import jax
import numpy as np
import pytest

from encoderx import config as config_lib
from encoderx import configs, errors, train
from encoderx.configs import common as config_common
from encoderx.data import buckets, pipeline
from encoderx.methods import finetune, registry
from finetune_cases import (  # pylint: disable=g-bad-import-order
    CONLL, classify_config, conll_subset, needs_rotten_tomatoes, tag_config)

ONE_DEVICE = jax.devices()[:1]


def _batch(lengths, seq_length=64):
  """Rows of `lengths` real tokens: input_ids, segment_ids, positions, a per-token label
  [batch, seq_length] and a label [batch]."""
  real = (np.arange(seq_length)[None, :] < np.array(lengths)[:, None]).astype(np.int32)
  return {"input_ids": real * 7, "segment_ids": real, "token_type_ids": 0 * real,
          "positions": np.broadcast_to(np.arange(seq_length), real.shape),
          "tags": real * 3, "label": np.arange(len(lengths)),
          "pair_segment_ids": 0 * real}


def test_a_batch_is_cut_to_the_shortest_bucket_holding_its_longest_row():
  batch = _batch([5, 20, 11])
  assert buckets.real_length(batch) == 20
  assert buckets.bucket_length(batch, (32, 16, 48), 64) == 32
  assert buckets.bucket_length(_batch([50, 3]), (16, 32, 48), 64) == 64  # none holds 50
  cut = buckets.cut(batch, (16, 32, 48), 64)
  assert {name: value.shape for name, value in cut.items()} == {
      **{name: (3, 32) for name in ("input_ids", "segment_ids", "token_type_ids",
                                     "positions", "tags", "pair_segment_ids")},
      "label": (3,)}
  for name, value in cut.items():  # only padding is dropped
    np.testing.assert_array_equal(value, batch[name][:, :32] if value.ndim == 2
                                  else batch[name])
    if value.ndim == 2 and name != "positions":
      assert not batch[name][:, 32:].any()
  assert buckets.cut(batch, (), 64) is batch
  # Another view's tokens count too (SimCSE's pair_segment_ids).
  other = {**_batch([4, 4]), "pair_segment_ids": _batch([40, 2])["segment_ids"]}
  assert buckets.bucket_length(other, (16, 32, 48), 64) == 48


@pytest.mark.slow  # three tiny classify runs: about a minute and a half
def test_classify_with_buckets_trains_as_without_on_fewer_padded_tokens(tmp_path, caplog):
  """Cut (same batches): the losses, metrics and weights of the uncut run; grouped by
  length: other batches, through the same loop."""
  needs_rotten_tomatoes()
  results, lengths = {}, {}
  for name, chosen in (("whole", ()), ("buckets", (48, 64, 80)), ("grouped", (48, 64, 80))):
    (tmp_path / name).mkdir()
    config = classify_config(tmp_path / name, train_rows=96, dev_rows=40)
    config_common.tiny_sizes(config)
    config.model.hidden_dropout = config.model.attention.dropout = 0.0
    config.finetune.classifier_dropout = 0.0
    config.data.seq_length, config.finetune.length_buckets = 96, chosen
    config.finetune.group_by_length = name == "grouped"
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="encoderx"):
      results[name] = train.run(config, str(tmp_path / name / "run"), show_progress=False,
                                devices=ONE_DEVICE)
    lengths[name] = sorted({int(m) for m in re.findall(r"train step at length (\d+)",
                                                       caplog.text)})
  assert lengths["whole"] == [96]
  assert len(lengths["buckets"]) >= 2 and lengths["buckets"][0] < 96, lengths
  whole, cut = results["whole"], results["buckets"]
  for a, b in zip(whole["history"], cut["history"], strict=True):
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-5), (a, b)
  for metric in ("accuracy", "loss"):
    assert whole["eval"][metric] == pytest.approx(cut["eval"][metric], rel=1e-5, abs=1e-6)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5),
                         whole["params"], cut["params"])
  # Grouped by length: other batches (so other losses), trained through the same loop.
  grouped = results["grouped"]
  assert len(grouped["history"]) == len(whole["history"])
  assert all(np.isfinite(entry["loss"]) for entry in grouped["history"])
  assert 0.0 <= grouped["eval"]["accuracy"] <= 1.0 and lengths["grouped"][0] < 96


@pytest.mark.slow  # two tiny tag runs
def test_tag_with_buckets_evaluates_per_token_outputs_of_several_lengths(tmp_path):
  """A tagger's evaluation joins per-token predictions of batches cut to different
  buckets: the dev metrics of the uncut run (dropout off)."""
  if not (CONLL / "train.txt").exists():
    pytest.skip(f"the CoNLL-2003 corpus is not at {CONLL}")
  results = {}
  for name, chosen in (("whole", ()), ("buckets", (16, 24))):
    (tmp_path / name).mkdir()
    config = tag_config(conll_subset(tmp_path / name, "train.txt", 64),
                         conll_subset(tmp_path / name, "dev.txt", 40))
    config.model.hidden_dropout = config.model.attention.dropout = 0.0
    config.finetune.classifier_dropout = 0.0
    config.finetune.length_buckets = chosen
    results[name] = train.run(config, str(tmp_path / name / "run"), show_progress=False,
                              devices=ONE_DEVICE)["eval"]
  assert results["whole"].keys() == results["buckets"].keys()
  for metric, value in results["whole"].items():
    assert results["buckets"][metric] == pytest.approx(value, rel=1e-5, abs=1e-6), metric


def test_outputs_of_cut_batches_join_padded_with_values_no_token_has():
  outputs = [{"word_ids": np.array([[0, 1, -1]]), "start_logits": np.ones([1, 3]),
              "label": np.array([4]), "weights": np.array([1.0])},
             {"word_ids": np.array([[0, -1], [0, 1]]), "start_logits": np.ones([2, 2]),
              "label": np.array([5, 0]), "weights": np.array([1.0, 0.0])}]
  rows = finetune.real_rows(outputs)
  np.testing.assert_array_equal(rows["word_ids"], [[0, 1, -1], [0, -1, -1]])
  np.testing.assert_array_equal(rows["start_logits"], [[1, 1, 1], [1, 1, -np.inf]])
  np.testing.assert_array_equal(rows["label"], [4, 5])
  assert "weights" not in rows


def test_grouped_batches_hold_one_buckets_examples_and_resume(tmp_path):
  needs_rotten_tomatoes()
  config = classify_config(tmp_path, train_rows=400, dev_rows=8)
  task = registry.build(config).task()
  lengths, seq_length = (32, 48, 64), 96

  def batches(group, count, position=None):
    iterator = pipeline.batch_iterator(task, "train", seq_length, 8, seed=3, position=position,
                                       group_lengths=(32, 48, 64) if group else ())
    try:
      return [next(iterator) for _ in range(count)]
    finally:
      iterator.close()

  grouped, plain = batches(True, 30), batches(False, 30)
  def computed(chosen):  # tokens the cut batches hold
    return sum(b["input_ids"].shape[0] * buckets.cut(b, lengths, seq_length)["input_ids"]
               .shape[1] for b in chosen)
  for batch in grouped:  # every example of a batch in the batch's bucket
    real = (batch["segment_ids"] > 0).sum(1)
    bucket = buckets.bucket_length(batch, lengths, seq_length)
    below = max([b for b in lengths if b < bucket], default=0)
    assert (real > below).all() and (real <= bucket).all(), (real, bucket)
  assert computed(grouped) < 0.85 * computed(plain), (computed(grouped), computed(plain))
  # Resumed at batch 12 of the epoch: the batches an unbroken iterator gives next.
  resumed = batches(True, 5, position={"epoch": 0, "batch": 12})
  for a, b in zip(resumed, grouped[12:17]):
    np.testing.assert_array_equal(a["input_ids"], b["input_ids"])


def test_buckets_are_checked_by_the_config():
  config = configs.get("finetune:classify")
  config.finetune.train_file = config.finetune.dev_file = __file__
  config.finetune.format = "tsv"
  config.data.seq_length, config.finetune.length_buckets = 64, (16, 128)
  with pytest.raises(errors.ConfigError, match=r"finetune.length_buckets.*128 is not in "
                     r"\[8, data.seq_length=64\]"):
    config_lib.validate(config)
  config.finetune.length_buckets, config.finetune.group_by_length = (), True
  with pytest.raises(errors.ConfigError, match="group_by_length': needs finetune.length_buckets"):
    config_lib.validate(config)
  pretraining = configs.get("bert:tiny")
  pretraining.finetune.length_buckets = (16,)
  with pytest.raises(errors.ConfigError, match="length buckets are for fine-tuning"):
    config_lib.validate(pretraining)

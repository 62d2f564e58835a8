"""Pairs from unlabelled text (crops, ICT) and batches of one source each."""
import math
import pathlib

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


def crops_config(tmp_path, steps=2, batch=8):
  """configs/embedding.py:tiny (tests' sizes) on crops of the bundled Austen chapters."""
  from encoderx.data import resources  # pylint: disable=g-import-not-at-top
  from test_contrastive import method_config  # pylint: disable=g-import-not-at-top
  config = method_config(tmp_path, steps=steps, batch=batch)
  config.finetune.train_file = ""
  config.contrastive.pairs_from = "crops"
  config.data.files = resources.BUNDLED_CORPUS
  config.data.document_marker = r"^\s*(CHAPTER|Chapter)\s+[0-9IVXLC]+"
  return config


def test_a_run_on_crops_of_austen_trains_and_epochs_differ(tmp_path):
  from encoderx.methods import contrastive as method_lib  # pylint: disable=g-import-not-at-top
  from test_contrastive import run  # pylint: disable=g-import-not-at-top
  config = crops_config(tmp_path, steps=3)
  result = run(config, tmp_path / "run")
  losses = [entry["contrastive_loss"] for entry in result["history"]]
  assert len(losses) == 3 and np.all(np.isfinite(losses)) and losses[0] > 0.5
  method = method_lib.Contrastive(config)
  columns = method.training_columns()
  assert len(columns["document"]) >= 8
  first, again, second = (method.epoch_pairs(columns, seed) for seed in (1, 1, 2))
  assert first == again and first["text"] != second["text"]
  order = method.train_order(first, 1)
  assert sorted(order) == list(range(len(columns["document"])))


def test_each_batch_of_a_mixed_run_is_from_one_file(tmp_path):
  from encoderx.methods import contrastive as method_lib  # pylint: disable=g-import-not-at-top
  from test_contrastive import method_config  # pylint: disable=g-import-not-at-top
  config = method_config(tmp_path, batch=4)
  rows = pathlib.Path(config.finetune.train_file).read_text(encoding="utf-8").splitlines()
  small = tmp_path / "small.tsv"
  small.write_text("\n".join([rows[0], *[f"s{i}\tt{i}\tu{i}" for i in range(12)]]) + "\n",
                   encoding="utf-8")
  config.finetune.train_file = f"{config.finetune.train_file}, {small}"
  method_lib.Contrastive.validate(config)
  method = method_lib.Contrastive(config)
  columns = method.training_columns()
  assert method.source_sizes == [len(rows) - 1, 12]
  for sampling, expected in [("round_robin", [0, 1] * 3), ("proportional", None)]:
    method.config.contrastive.source_sampling = sampling
    order = method.train_order(columns, 5)
    sources = [{columns["text"][row].startswith("s") for row in order[i:i + 4]}
               for i in range(0, len(order), 4)]
    assert all(len(batch) == 1 for batch in sources)
    sequence = [int(batch.pop()) for batch in sources]
    if expected:
      assert sequence == expected
    else:
      assert sequence.count(0) == (len(rows) - 1) // 4 and sequence.count(1) == 3


@pytest.mark.parametrize("change, field, problem", [
    (lambda c: setattr(c.contrastive, "pairs_from", "words"), "pairs_from", "not one of"),
    (lambda c: setattr(c.finetune, "train_file", "x.tsv"), "pairs_from", "empty one"),
    (lambda c: setattr(c.contrastive, "source_sampling", "random"), "source_sampling",
     "not one of"),
    (lambda c: setattr(c.contrastive, "pairs_from", ""), "finetune.train_file", "is empty"),
])
def test_bad_pairs_settings_are_refused_in_one_line(tmp_path, change, field, problem):
  from encoderx import errors  # pylint: disable=g-import-not-at-top
  from encoderx.methods import contrastive as method_lib  # pylint: disable=g-import-not-at-top
  config = crops_config(tmp_path)
  change(config)
  with pytest.raises(errors.ConfigError, match=problem) as error:
    method_lib.Contrastive.validate(config)
  assert field in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("pairs_from, text, found", [
    ("crops", "Only one document here.\n", "1 documents"),
    ("ict", "One sentence.\n\nAnother paragraph\n\nA third.\n", "0 passages")])
def test_too_few_documents_or_passages_are_refused_before_compiling(
    tmp_path, pairs_from, text, found):
  from encoderx import errors  # pylint: disable=g-import-not-at-top
  from test_contrastive import run  # pylint: disable=g-import-not-at-top
  config = crops_config(tmp_path)
  corpus = tmp_path / "corpus.txt"
  corpus.write_text(text, encoding="utf-8")
  config.data.files, config.data.document_marker = str(corpus), ""
  config.data.eval_every_nth_document = 1000
  config.contrastive.pairs_from = pairs_from
  with pytest.raises(errors.ConfigError, match=found) as error:
    run(config, tmp_path / "run")
  assert "\n" not in str(error.value)
  assert not (tmp_path / "run").exists()  # nothing written

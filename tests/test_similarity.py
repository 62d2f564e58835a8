"""Sentence-pair regression (MSE, Pearson / Spearman) and SimCSE (unsupervised and
supervised contrastive training, evaluated by Spearman on STS-B pairs)."""
import csv

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from encoderx import errors
from encoderx import train
from encoderx.methods import simcse, similarity
from encoderx.objectives import contrastive

from finetune_cases import shrunk, simcse_config, stsb_subset  # pylint: disable=g-bad-import-order

ONE_DEVICE = jax.devices()[:1]
def test_correlations_by_hand():
  gold = np.array([0.0, 1.0, 2.0, 3.0])
  # A monotone but not linear prediction: Spearman 1, Pearson below.
  metrics = similarity.correlations(np.array([0.0, 1.0, 4.0, 9.0]), gold)
  assert metrics["spearman"] == pytest.approx(1.0)
  assert metrics["pearson"] == pytest.approx(np.corrcoef([0, 1, 4, 9], gold)[0, 1])
  assert similarity.correlations(-gold, gold) == pytest.approx(
      {"pearson": -1.0, "spearman": -1.0})
  # A constant score (the trivial baseline) has no correlation: 0, not NaN.
  assert similarity.correlations(np.full(4, 2.5), gold) == {"pearson": 0.0, "spearman": 0.0}


def test_regression_on_sts_pairs_reports_correlations_of_its_predictions(tmp_path):
  from encoderx import configs  # pylint: disable=g-import-not-at-top
  config = shrunk(configs.get("finetune:similarity"))
  config.finetune.train_file = stsb_subset(tmp_path, "train.tsv", 64)
  config.finetune.dev_file = stsb_subset(tmp_path, "dev.tsv", 40)
  config.eval.every_steps = config.train.steps  # one evaluation: the best is the last
  run = tmp_path / "run"
  result = train.run(config, str(run), show_progress=False, devices=ONE_DEVICE)
  assert {"pearson", "spearman", "mse"} <= set(result["eval"])
  count, output = train.predict(config, str(run), config.finetune.dev_file,
                                devices=ONE_DEVICE)
  with open(output, encoding="utf-8") as f:
    rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
  assert count == 40 and list(rows[0]) == ["line", "text_a", "text_b", "prediction", "label"]
  predicted = np.array([float(r["prediction"]) for r in rows])  # 7 significant digits
  gold = np.array([float(r["label"]) for r in rows])
  # The evaluation's figures are scipy's on the predictions of the whole dev file.
  assert stats.pearsonr(predicted, gold).statistic == pytest.approx(
      result["eval"]["pearson"], abs=1e-3)
  assert stats.spearmanr(predicted, gold).statistic == pytest.approx(
      result["eval"]["spearman"], abs=1e-2)
  assert np.mean(np.square(predicted - gold)) == pytest.approx(result["eval"]["mse"],
                                                               abs=1e-3)


def test_a_label_column_that_is_not_a_number_names_file_and_line(tmp_path):
  from encoderx import configs  # pylint: disable=g-import-not-at-top
  config = shrunk(configs.get("finetune:similarity"))
  bad = tmp_path / "bad.tsv"
  bad.write_text("score\ttext_a\ttext_b\n4.5\ta\tb\nhigh\tc\td\n")
  config.finetune.train_file = config.finetune.dev_file = str(bad)
  with pytest.raises(errors.UserError, match=r"bad.tsv' line 3"):
    train.run(config, str(tmp_path / "run"), show_progress=False, devices=ONE_DEVICE)


# --- SimCSE ---------------------------------------------------------------------------------
def test_contrastive_loss_by_hand():
  anchors = jnp.array([[1.0, 0.0], [0.0, 2.0]])
  positives = jnp.array([[3.0, 0.0], [1.0, 1.0]])
  negatives = jnp.array([[0.0, 1.0], [-1.0, 0.0]])
  losses, correct = contrastive.ranking_losses(
      anchors, jnp.concatenate([positives, negatives]), 1 / 0.05)
  # Cosines: anchor 0 vs (p0, p1, n0, n1) = (1, 1/sqrt2, 0, -1); anchor 1 = (0, 1/sqrt2,
  # 1, 0). Anchor 1's positive (p1) loses to n0: not ranked first.
  cosines = np.array([[1.0, 2 ** -0.5, 0.0, -1.0], [0.0, 2 ** -0.5, 1.0, 0.0]]) / 0.05
  expected = [np.log(np.exp(row).sum()) - row[i] for i, row in enumerate(cosines)]
  np.testing.assert_allclose(losses, expected, rtol=1e-5, atol=1e-6)  # float32
  np.testing.assert_array_equal(correct, [1.0, 0.0])


def test_unsupervised_simcse_trains_and_its_encoder_embeds(tmp_path):
  config = simcse_config(tmp_path, "unsupervised")
  method = simcse.SimCSE(config)
  sentences = method.training_columns()["text"]
  assert len(sentences) == len(set(sentences)) > 48  # both columns' distinct sentences
  run = tmp_path / "run"
  result = train.run(config, str(run), show_progress=False, devices=ONE_DEVICE)
  assert {"spearman", "pearson"} <= set(result["eval"])
  logged = result["history"][-1]  # the last log interval's means
  assert logged["contrastive_loss"] > 0 and 0 <= logged["accuracy"] <= 1
  # The trained encoder embeds through encoderx.embed, and its cosines give the run's
  # dev Spearman (at the last step, which is evaluated).
  from encoderx import embed  # pylint: disable=g-import-not-at-top
  with open(config.finetune.dev_file, encoding="utf-8") as f:
    rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
  embedder = embed.Embedder(str(run), pooling="mean", normalize=True,
                            max_length=config.data.seq_length)
  first = embedder([r["text_a"] for r in rows])
  second = embedder([r["text_b"] for r in rows])
  spearman = stats.spearmanr((first * second).sum(-1), [float(r["score"]) for r in rows])
  assert spearman.statistic == pytest.approx(result["eval"]["spearman"], abs=2e-3)


def test_supervised_simcse_takes_pairs_and_hard_negatives(tmp_path):
  config = simcse_config(tmp_path, "supervised")
  config.simcse.hard_negative_column = "text_a"  # any column will do for the shapes
  columns = simcse.SimCSE(config).training_columns()
  assert len(columns["text"]) == len(columns["text_pair"]) == len(
      columns["hard_negative"]) == 48
  config.train.steps, config.eval.every_steps = 2, 2
  result = train.run(config, str(tmp_path / "run"), show_progress=False, devices=ONE_DEVICE)
  assert "spearman" in result["eval"]
  config.simcse.kind = "unsupervised"
  with pytest.raises(errors.ConfigError, match="hard_negative_column"):
    simcse.SimCSE.validate(config)

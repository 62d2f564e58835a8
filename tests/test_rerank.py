"""The cross-encoder reranker method (encoderx/methods/rerank.py): each loss's value and
gradient against sentence-transformers' cross_encoder loss in torch on the same logits,
tiny runs that train with each loss, and bad input stopped before anything compiles."""
import jax
import ml_collections
import numpy as np
import pytest

from encoderx import errors, train
from encoderx.methods import rerank

from finetune_cases import shrunk  # pylint: disable=g-bad-import-order

ONE_DEVICE = jax.devices()[:1]
ROWS, DOCUMENTS = 5, 4


# --- the losses against sentence-transformers ----------------------------------------------
@pytest.fixture(scope="module")
def scoring_model(tiny_cross_encoder):
  """A CrossEncoder whose score of the pair (query i, document "i,j") is logits[i, j] of
  the torch tensor set by `use(logits)`: the losses' own code runs on given logits."""
  torch = pytest.importorskip("torch")
  from sentence_transformers.cross_encoder import CrossEncoder  # pylint: disable=g-import-not-at-top
  model = CrossEncoder(tiny_cross_encoder.removeprefix("hf:"))
  table = {}

  def forward(inputs):
    return {"scores": torch.stack([table["logits"][int(q[1:]), int(d.split(",")[1])]
                                   for q, d in inputs["pairs"]])[:, None]}

  model.preprocess = lambda pairs, **unused: {"pairs": list(pairs)}
  model.forward = forward
  model.use = lambda logits: table.update(logits=logits)
  return model


def reference(model, loss, inputs, labels, logits: np.ndarray):
  """(value, gradient w.r.t. the logits) of a sentence-transformers loss in torch; with
  `inputs` None, of its `calculate_loss` on the logits' columns."""
  import torch  # pylint: disable=g-import-not-at-top
  tensor = torch.tensor(logits, dtype=torch.float32, requires_grad=True)
  model.use(tensor)
  value = (loss.calculate_loss(list(tensor.T), logits.shape[0]) if inputs is None
           else loss(inputs, labels))
  value.backward()
  return value.item(), tensor.grad.numpy()


def columns(rows: int, documents: int) -> list[list[str]]:
  """Queries q0.., then one column of documents "i,j" for each j."""
  return [[f"q{i}" for i in range(rows)]] + [[f"{i},{j}" for i in range(rows)]
                                             for j in range(documents)]


def ours(loss: str, logits: np.ndarray, **batch):
  config = ml_collections.ConfigDict({"rerank": rerank.config_section()})
  config.rerank.loss = loss
  return jax.value_and_grad(lambda x: rerank.row_losses(config, x, batch).mean())(logits)


@pytest.mark.parametrize("loss", rerank.LOSSES)
def test_each_loss_and_its_gradient_are_sentence_transformers(scoring_model, loss):
  import torch  # pylint: disable=g-import-not-at-top
  from sentence_transformers.cross_encoder import losses  # pylint: disable=g-import-not-at-top
  generator = np.random.default_rng(0)
  logits = generator.normal(scale=2.0, size=[ROWS, DOCUMENTS]).astype(np.float32)
  teacher = generator.normal(scale=3.0, size=[ROWS, DOCUMENTS]).astype(np.float32)
  labels = np.array([1, 0, 0, 1, 1], np.float32)
  if loss == "binary":
    logits = logits[:, :1]
    expected = reference(scoring_model, losses.BinaryCrossEntropyLoss(scoring_model),
                         columns(ROWS, 1), torch.tensor(labels), logits)
    got = ours(loss, logits, label=labels)
  elif loss == "listwise":  # the positive and hard negatives, no in-batch ones: what
    # MNRL's forward hands calculate_loss with num_negatives=0 (torch.multinomial
    # refuses to draw 0 in-batch negatives, so its forward cannot be called so)
    expected = reference(scoring_model, losses.MultipleNegativesRankingLoss(
        scoring_model, num_negatives=0), None, None, logits)
    got = ours(loss, logits)
  elif loss == "margin_mse":  # the teacher's scores, from which the loss takes margins
    expected = reference(scoring_model, losses.MarginMSELoss(scoring_model),
                         columns(ROWS, DOCUMENTS), torch.tensor(teacher), logits)
    got = ours(loss, logits, teacher=teacher)
  else:  # listnet: a list of documents and their teacher scores per query
    queries, *documents = columns(ROWS, DOCUMENTS)
    expected = reference(scoring_model, losses.ListNetLoss(scoring_model),
                         [queries, [list(row) for row in zip(*documents)]],
                         [torch.tensor(row) for row in teacher], logits)
    got = ours(loss, logits, teacher=teacher)
  assert float(got[0]) == pytest.approx(expected[0], abs=1e-5, rel=1e-5)
  np.testing.assert_allclose(np.asarray(got[1]), expected[1], atol=1e-5, rtol=1e-5)
  assert np.abs(expected[1]).max() > 1e-3  # a gradient that could differ


# --- runs --------------------------------------------------------------------------------
def write_rows(path, header: list[str], rows: list[list]) -> str:
  path.write_text("\t".join(header) + "\n" + "".join(
      "\t".join(str(value) for value in row) + "\n" for row in rows), encoding="utf-8")
  return str(path)


def rerank_config(tmp_path, lines, loss: str, repeats: int = 1):
  """A tiny rerank run over 8 rows (written `repeats` times) whose query is the start of
  its positive line and whose negatives are other lines; the teacher scores the positive
  above the negatives."""
  from encoderx import configs  # pylint: disable=g-import-not-at-top
  config = shrunk(configs.get("finetune:rerank"))
  texts = lines(24)
  train_rows = [[" ".join(texts[i].split()[:4]), texts[i], texts[i + 8], texts[i + 16],
                 i % 2, 2.0 + 0.1 * i, -1.0, -0.5] for i in range(8)] * repeats
  config.finetune.train_file = write_rows(
      tmp_path / "train.tsv", ["query", "positive", "negative", "negative_2", "label",
                               "t_positive", "t_negative", "t_negative_2"], train_rows)
  config.finetune.dev_file = write_rows(
      tmp_path / "dev.tsv", ["query", "positive", "negative_1", "negative_2"],
      [[" ".join(texts[i].split()[:4]), texts[i], texts[i + 1], texts[i + 2]]
       for i in range(8, 18)])
  config.rerank.loss = loss
  config.rerank.negative_columns = ("negative", "negative_2")
  config.rerank.dev_negative_columns = ("negative_1", "negative_2")
  if loss in rerank.DISTILLATION:
    config.rerank.score_columns = ("t_positive", "t_negative", "t_negative_2")
  config.model.hidden_dropout = config.model.attention.dropout = 0.0
  config.finetune.classifier_dropout = 0.0
  config.optimizer.learning_rate, config.optimizer.warmup_steps = 1e-3, 0
  config.train.steps = 6
  config.eval.every_steps = config.checkpoint.every_steps = 6
  return config


@pytest.mark.parametrize("loss", rerank.LOSSES)
def test_a_tiny_run_lowers_each_loss_and_ranks_the_dev_rows(tmp_path, austen_lines, loss):
  config = rerank_config(tmp_path, austen_lines, loss)
  # 4 steps (the parity runs below prove each step; this, that the loss falls) at a rate
  # that makes the fall clear: first-to-last margins observed binary 6e-4, listwise 1.5e-3,
  # margin_mse 4.5e-3, listnet 5e-4 (at 1e-3: ~1e-4 to 9e-4)
  config.train.steps = config.eval.every_steps = config.checkpoint.every_steps = 4
  config.optimizer.learning_rate = 5e-3
  result = train.run(config, str(tmp_path / "run"), show_progress=False,
                     devices=ONE_DEVICE)
  losses = [logged["rerank_loss"] for logged in result["history"]]
  assert len(losses) == 4 and losses[-1] < losses[0], losses
  assert set(result["eval"]) >= {"mrr@10", "ndcg@10"}
  assert 1 / 3 <= result["eval"]["mrr@10"] <= 1.0  # the positive among 3 documents
  if loss != "listwise":
    return
  # The run reranks as encoderx.retrieval --rerank_with=RUN does: its scores of the dev
  # rows' pairs give the run's dev figures.
  from encoderx import retrieval  # pylint: disable=g-import-not-at-top
  reranker = retrieval.Reranker(str(tmp_path / "run"), max_length=config.data.seq_length)
  dev = rerank.Reranking(config).dev_columns()
  documents = [dev[f"doc{i}"] for i in range(3)]
  scores = np.stack([reranker(list(zip(dev["text"], column))) for column in documents], 1)
  assert rerank.ranking_scores(scores) == pytest.approx(
      {name: result["eval"][name] for name in rerank.METRICS}, abs=1e-6)
  assert rerank.Reranking(config).describe_head() == {
      "kind": "cross-encoder", "num_labels": 1, "activation": "sigmoid",
      "pooling": "pooler"}
  # Exported as a CrossEncoder, it predicts the same scores through its sigmoid.
  sentence_transformers = pytest.importorskip("sentence_transformers")
  from encoderx import export  # pylint: disable=g-import-not-at-top
  export.export_cross_encoder(str(tmp_path / "run"), str(tmp_path / "exported"))
  pairs = list(zip(dev["text"], documents[0]))
  predicted = sentence_transformers.CrossEncoder(str(tmp_path / "exported"),
                                                 device="cpu").predict(pairs)
  np.testing.assert_allclose(predicted, 1 / (1 + np.exp(-reranker(pairs))), atol=1e-5)
  card = (tmp_path / "exported" / "README.md").read_text()
  assert "cross_encoder.losses.MultipleNegativesRankingLoss" in card and "sigmoid" in card


@pytest.mark.parametrize("loss", rerank.LOSSES)
def test_steps_match_sentence_transformers_cross_encoder_losses(tmp_path, austen_lines,
                                                                 loss):
  """20 steps (batch 8 of 16 tokens, dropout off) against BertForSequenceClassification
  with one label under sentence-transformers' cross_encoder loss (REFERENCE_LOSSES; the
  pairs' features given to it, sentence_adapters.Rerank) and torch's AdamW, from the same
  weights on the same batches: the bounds of tests/test_training_parity.py (loss 1e-5
  and gradient norm 5e-4 relative, weights 1e-4 absolute; observed <= 9e-7, 2.4e-5 and
  1e-5), but for the classifier's bias under the ranking losses. Those depend on the
  differences of a row's logits (margin_mse, listnet: exactly; listwise: through
  sigmoids of near-equal logits), so the bias's gradient is a sum that cancels to 0 but
  for float32's rounding (~1e-7 of the logits' gradients), which Adam scales up (it
  divides by the gradient's own size plus eps 1e-6): the bias drifts on each side's
  rounding (observed up to 7e-4 apart) while every other weight agrees to 1e-5."""
  import test_training_parity as parity  # pylint: disable=g-import-not-at-top
  # Each batch the 8 rows: written 20 times in one epoch (each epoch restarts the input
  # pipeline: seconds), not shuffled.
  config = rerank_config(tmp_path, austen_lines, loss, repeats=parity.STEPS)
  config.data.shuffle_buffer = 1
  config.train.steps, config.data.seq_length = parity.STEPS, 16
  config.optimizer.warmup_steps, config.optimizer.weight_decay = 4, 0.1
  config.optimizer.clip_norm = 0.02  # below the norms of some steps (~0.003-0.05)
  result, adapter = parity.side_by_side(config)
  assert type(adapter.model).__name__ == "BertForSequenceClassification"
  if loss != "binary":
    del result.param_diffs["classifier.bias"]
  parity.check(result, config, f"rerank {loss} vs {rerank.REFERENCE_LOSSES[loss]}",
               loss_drop=0.0)


@pytest.mark.parametrize("loss, column, value, message", [
    ("margin_mse", "t_negative", "high", r"train.tsv' line 4: t_negative 'high' is not a "
     "number"),
    ("listwise", "negative_2", "", r"train.tsv' line 4: column 'negative_2' is empty"),
    ("binary", "label", "2", r"train.tsv' line 4: label '2' is not 0 or 1"),
])
def test_bad_rows_stop_before_anything_is_compiled_or_written(tmp_path, austen_lines, loss,
                                                              column, value, message):
  config = rerank_config(tmp_path, austen_lines, loss)
  path = tmp_path / "train.tsv"
  lines = path.read_text(encoding="utf-8").splitlines()
  header = lines[0].split("\t")
  row = lines[3].split("\t")
  row[header.index(column)] = value
  lines[3] = "\t".join(row)
  path.write_text("\n".join(lines) + "\n", encoding="utf-8")
  with pytest.raises(errors.UserError, match=message) as raised:
    train.run(config, str(tmp_path / "run"), show_progress=False, devices=ONE_DEVICE)
  assert "\n" not in str(raised.value)
  assert not (tmp_path / "run").exists()  # nothing written


def test_config_mistakes_are_named(tmp_path, austen_lines):
  config = rerank_config(tmp_path, austen_lines, "margin_mse")
  config.rerank.score_columns = ("t_positive",)  # the negatives' are missing
  with pytest.raises(errors.ConfigError, match="rerank.score_columns.*3 columns, got 1"):
    rerank.Reranking.validate(config)
  config.rerank.loss, config.rerank.score_columns = "listwise", ()
  config.rerank.scale = -1.0
  with pytest.raises(errors.ConfigError, match="rerank.scale"):
    rerank.Reranking.validate(config)

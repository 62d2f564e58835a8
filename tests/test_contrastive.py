"""Contrastive losses against sentence-transformers' on the same embeddings, GradCache
against the uncached loss, and the contrastive method's runs."""
import pathlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from encoderx.objectives import contrastive

torch = pytest.importorskip("torch")
losses_lib = pytest.importorskip("sentence_transformers.sentence_transformer.losses")

BATCH, HIDDEN = 6, 16


def embeddings(columns: int, seed: int = 0) -> list[np.ndarray]:
  """anchor, positive and hard-negative columns [BATCH, HIDDEN], positives near anchors."""
  rng = np.random.default_rng(seed)
  anchors = rng.normal(size=(BATCH, HIDDEN)).astype(np.float32)
  others = [anchors + rng.normal(scale=1.5, size=anchors.shape).astype(np.float32)
            for _ in range(columns - 1)]
  return [anchors, *others]


class Precomputed(torch.nn.Module):
  """A 'model' whose forward returns the embeddings given as features."""

  def forward(self, features):
    return {"sentence_embedding": features["embedding"]}

  def get_embedding_dimension(self):
    return HIDDEN


def reference(loss_module, columns: list[np.ndarray]):
  """sentence-transformers' loss and its gradient w.r.t. each column (torch, fp32)."""
  from sentence_transformers.base.losses import merged_forward  # pylint: disable=g-import-not-at-top
  tensors = [torch.tensor(c, requires_grad=True) for c in columns]
  with merged_forward.column_merging_disabled():
    loss = loss_module([{"embedding": t} for t in tensors], None)
  loss.backward()
  return loss.item(), [t.grad.numpy() for t in tensors]


def symmetric_loss(model, scale=20.0):
  """MultipleNegativesSymmetricRankingLoss, as its deprecation says to write it."""
  return losses_lib.MultipleNegativesRankingLoss(
      model, scale=scale, directions=("query_to_doc", "doc_to_query"),
      partition_mode="per_direction")


def ours(columns, **options):
  def mean_loss(columns):
    losses, _ = contrastive.matryoshka_losses(columns[0], jnp.concatenate(columns[1:]),
                                              **options)
    return losses.mean()
  loss, grads = jax.value_and_grad(mean_loss)([jnp.asarray(c) for c in columns])
  return float(loss), [np.asarray(g) for g in grads]


def assert_same(expected, actual):
  assert actual[0] == pytest.approx(expected[0], rel=1e-5, abs=1e-6)
  for want, got in zip(expected[1], actual[1]):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("hard_negatives", [0, 1, 2])
def test_ranking_loss_equals_multiple_negatives_ranking_loss(hard_negatives):
  columns = embeddings(2 + hard_negatives)
  model = Precomputed()
  expected = reference(losses_lib.MultipleNegativesRankingLoss(model, scale=20.0), columns)
  assert_same(expected, ours(columns, scale=20.0))
  # The symmetric form, and another scale.
  expected = reference(symmetric_loss(model, scale=7.0), columns)
  assert_same(expected, ours(columns, scale=7.0, symmetric=True))
  assert abs(ours(columns, scale=7.0)[0] - expected[0]) > 1e-3  # the direction counts


@pytest.mark.parametrize("symmetric", [False, True])
def test_matryoshka_equals_matryoshka_loss(symmetric):
  columns = embeddings(3, seed=1)
  model = Precomputed()
  inner = (symmetric_loss(model) if symmetric
           else losses_lib.MultipleNegativesRankingLoss(model))
  dims, weights = (16, 8, 3), (1.0, 0.5, 2.0)
  expected = reference(losses_lib.MatryoshkaLoss(model, inner, list(dims), list(weights)),
                       columns)
  assert_same(expected, ours(columns, scale=20.0, dims=dims, weights=weights,
                             symmetric=symmetric))


def test_bad_batches_and_matryoshka_settings_are_refused_in_one_line():
  one = jnp.ones((1, HIDDEN))
  with pytest.raises(contrastive.ContrastiveError, match="at least 2"):
    contrastive.ranking_losses(one, one, 20.0)
  two = jnp.ones((2, HIDDEN))
  for dims, weights, problem in [((32, 8), (), "hidden size"), ((8, 16), (), "decreasing"),
                                 ((8, 8), (), "decreasing"), ((16, 8), (1.0,), "weights")]:
    with pytest.raises(contrastive.ContrastiveError, match=problem) as error:
      contrastive.matryoshka_losses(two, two, 20.0, dims, weights)
    assert "\n" not in str(error.value)


# --- gradient caching -----------------------------------------------------------------
class TinyEncoder(nn.Module):
  """Token embeddings -> dense -> dropout -> mean: [rows, length] ids -> [rows, 8]."""

  @nn.compact
  def __call__(self, ids, deterministic):
    x = nn.Embed(50, 8)(ids)
    x = nn.Dropout(0.3)(nn.gelu(nn.Dense(8)(x)), deterministic=deterministic)
    return x.mean(axis=1)


def test_gradient_caching_equals_the_uncached_loss_with_dropout():
  encoder, rows, count = TinyEncoder(), 8, 4
  ids = jax.random.randint(jax.random.key(0), (rows, 3, 5), 0, 50)  # anchor, pos, neg
  params = {"encoder": encoder.init(jax.random.key(1), ids[:, 0], True)["params"],
            "log_scale": jnp.log(20.0)}

  def embed(params, chunk, key):  # chunk [rows / count, 3, length] -> [rows / count, 3, 8]
    return encoder.apply({"params": params["encoder"]}, chunk.reshape(-1, 5), False,
                         rngs={"dropout": key}).reshape(-1, 3, 8)

  def loss_of_embeddings(params, embedded):  # [rows, 3, 8]
    losses, correct = contrastive.ranking_losses(
        embedded[:, 0], embedded[:, 1:].transpose(1, 0, 2).reshape(-1, 8),
        jnp.exp(params["log_scale"]))
    return losses.mean(), correct.sum()

  chunks = contrastive.split_chunks(ids, count)

  def uncached(params, key):
    keys = contrastive.chunk_keys(key, count)
    embedded = jnp.stack([embed(params, chunks[i], keys[i]) for i in range(count)])
    return loss_of_embeddings(params, contrastive.join_chunks(embedded))

  key = jax.random.key(2)
  (loss, correct), grads = jax.jit(jax.value_and_grad(uncached, has_aux=True))(params, key)
  run_cached = jax.jit(lambda p, k: contrastive.cached_value_and_grad(
      embed, p, chunks, loss_of_embeddings, k))
  (cached_loss, cached_correct), cached_grads = run_cached(params, key)
  assert float(cached_loss) == pytest.approx(float(loss), rel=1e-6)
  assert float(cached_correct) == float(correct)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
                         cached_grads, grads)
  assert float(jnp.abs(grads["log_scale"])) > 0
  # Dropout is on: another key gives another loss (so the keys above had to agree).
  assert float(run_cached(params, jax.random.key(3))[0][0]) != pytest.approx(float(loss))
  # The custom VJP gives a train step's value_and_grad the same gradient.
  (wrapped_loss, _), wrapped_grads = jax.jit(jax.value_and_grad(
      lambda p: contrastive.cached_loss(embed, p, chunks, loss_of_embeddings, key),
      has_aux=True))(params)
  assert float(wrapped_loss) == pytest.approx(float(loss), rel=1e-6)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
                         wrapped_grads, grads)


def test_chunks_are_strided_and_join_back():
  rows = jnp.arange(12).reshape(6, 2)
  chunks = contrastive.split_chunks(rows, 3)
  np.testing.assert_array_equal(chunks[0], rows[::3])
  np.testing.assert_array_equal(contrastive.join_chunks(chunks), rows)


# --- the contrastive method -----------------------------------------------------------
ONE_DEVICE = jax.devices()[:1]


def method_config(tmp_path, steps=2, batch=8, dropout=0.0):
  """configs/embedding.py:tiny at the tests' tiny sizes, without dropout by default (so
  that runs on other meshes or in chunks see the same masks)."""
  from encoderx import configs  # pylint: disable=g-import-not-at-top
  from finetune_cases import pairs_file, shrunk, stsb_subset  # pylint: disable=g-import-not-at-top
  config = shrunk(configs.get("embedding:tiny"))
  config.finetune.train_file = pairs_file(tmp_path)
  config.finetune.dev_file = stsb_subset(tmp_path, "dev.tsv", 24)
  config.model.hidden_dropout = config.model.attention.dropout = dropout
  config.train.steps, config.train.batch_size = steps, batch
  config.eval.every_steps = config.checkpoint.every_steps = steps
  return config


def run(config, workdir, devices=ONE_DEVICE):
  from encoderx import train  # pylint: disable=g-import-not-at-top
  return train.run(config, str(workdir), show_progress=False, devices=devices)


def test_contrastive_trains_and_its_loss_decreases(tmp_path):
  config = method_config(tmp_path, steps=12, batch=16, dropout=0.1)
  config.optimizer.learning_rate = 1e-3
  config.contrastive.prompts.query = "query: "
  config.contrastive.prompts.document = "passage: "
  result = run(config, tmp_path / "run")
  losses = [entry["contrastive_loss"] for entry in result["history"]]
  assert len(losses) == 12 and np.mean(losses[-3:]) < np.mean(losses[:3]) - 0.3, losses
  assert {"spearman", "pearson"} <= set(result["eval"])
  from encoderx.methods import contrastive as method_lib  # pylint: disable=g-import-not-at-top
  method = method_lib.Contrastive(config)
  columns = method.training_columns()
  assert list(columns) == ["text", "text_pair", "negative_1"]
  assert columns["text"][0].startswith("query: ")
  assert columns["negative_1"][0].startswith("passage: ")
  assert method.describe_head() == {
      "pooling": "mean", "normalize": True, "matryoshka_dims": [],
      "prompts": {"query": "query: ", "document": "passage: "}}


def test_eight_devices_and_gradient_caching_equal_one_device(tmp_path):
  """The similarity matrix over the global batch: 8 devices (each holding two rows) give
  the 1-device step, and so does gradient caching on the 8 devices in two chunks of 8
  rows, each chunk spread over every device, and in four chunks of 4 rows, fewer than
  the devices (Matryoshka, symmetric and a learned scale on; caching on one
  device: the CachedMNRL parity case); texts packed into rows (the
  default, contrastive.pack_texts) give the step of texts each in a padded row of its
  own."""
  results = {}
  for name, devices, chunk, pack in [("one", ONE_DEVICE, 0, True),
                                     ("eight", jax.devices(), 0, True),
                                     ("cached", jax.devices(), 8, True),
                                     ("cached_small", jax.devices(), 4, True),
                                     ("padded", ONE_DEVICE, 0, False)]:
    config = method_config(tmp_path, batch=16)
    config.contrastive.symmetric, config.contrastive.learn_scale = True, True
    config.contrastive.matryoshka_dims, config.contrastive.matryoshka_weights = (32, 8), (1, .5)
    config.contrastive.cache_chunk_size, config.contrastive.pack_texts = chunk, pack
    results[name] = run(config, tmp_path / name, devices)
  assert "logit_scale" in results["one"]["params"]
  for name in ("eight", "cached", "cached_small", "padded"):
    for got, want in zip(results[name]["history"], results["one"]["history"]):
      assert got["loss"] == pytest.approx(want["loss"], rel=1e-5)
      assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-4)
    jax.tree_util.tree_map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
        results[name]["params"], results["one"]["params"])


@pytest.mark.parametrize("change, field, problem", [
    (lambda c: setattr(c.train, "batch_size", 1), "train.batch_size", "at least 2"),
    (lambda c: setattr(c.train, "grad_accum_steps", 2), "grad_accum_steps", "whole batch"),
    (lambda c: setattr(c.contrastive, "cache_chunk_size", 3), "cache_chunk_size", "divisor"),
    (lambda c: (setattr(c.contrastive, "symmetric", True),
                setattr(c.contrastive.prompts, "query", "query: ")), "prompts", "both"),
])
def test_bad_settings_are_refused_in_one_line(tmp_path, change, field, problem):
  from encoderx import errors  # pylint: disable=g-import-not-at-top
  from encoderx.methods import contrastive as method_lib  # pylint: disable=g-import-not-at-top
  config = method_config(tmp_path)
  change(config)
  with pytest.raises(errors.ConfigError, match=problem) as error:
    method_lib.Contrastive.validate(config)
  assert field in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("dims, problem", [((64, 8), "hidden size"), ((8, 16), "decreasing")])
def test_bad_matryoshka_dims_are_refused_before_compiling(tmp_path, dims, problem):
  from encoderx import errors  # pylint: disable=g-import-not-at-top
  config = method_config(tmp_path)
  config.contrastive.matryoshka_dims = dims
  with pytest.raises(errors.ConfigError, match=problem) as error:
    run(config, tmp_path / "run")
  assert "contrastive.matryoshka_dims" in str(error.value) and "\n" not in str(error.value)
  assert not (tmp_path / "run").exists()  # nothing written


def test_rows_without_a_positive_or_with_an_empty_negative_are_refused(tmp_path):
  from encoderx.data import labelled  # pylint: disable=g-import-not-at-top
  config = method_config(tmp_path)
  rows = pathlib.Path(config.finetune.train_file).read_text(encoding="utf-8").splitlines()
  for column, broken in [("positive", "a\t\tn"), ("negative_2", "a\tp\tn\t")]:
    path = tmp_path / f"no_{column}.tsv"
    header = rows[0] + ("\tnegative_2" if column == "negative_2" else "")
    body = [r + ("\tm" if column == "negative_2" else "") for r in rows[1:4]]
    path.write_text("\n".join([header, *body, broken]) + "\n", encoding="utf-8")
    config.finetune.train_file = str(path)  # negative_2 is found beside negative
    with pytest.raises(labelled.LabelledDataError,
                       match=f"line 5: column '{column}'") as error:
      run(config, tmp_path / f"run_{column}")
    assert "\n" not in str(error.value)
    assert not (tmp_path / f"run_{column}").exists()  # nothing written


@pytest.mark.parametrize("symmetric, chunk, dims, name", [
    (False, 0, (), "MultipleNegativesRankingLoss"),
    (True, 4, (), "CachedMultipleNegativesSymmetricRankingLoss"),
    (False, 0, (64, 32), "MatryoshkaLoss(MultipleNegativesRankingLoss)")])
def test_the_model_card_names_the_loss_as_sentence_transformers_does(
    tmp_path, symmetric, chunk, dims, name):
  from encoderx.methods import contrastive as method_lib  # pylint: disable=g-import-not-at-top
  config = method_config(tmp_path)
  config.contrastive.symmetric, config.contrastive.cache_chunk_size = symmetric, chunk
  config.contrastive.matryoshka_dims = dims
  assert method_lib.Contrastive(config).reference_loss() == name
  for part in name.replace(")", "").split("("):  # classes sentence-transformers has
    assert hasattr(losses_lib, part), part


def test_jsonl_rows_with_numbered_negatives_and_last_token_pooling(tmp_path):
  import json  # pylint: disable=g-import-not-at-top
  from encoderx.methods import contrastive as method_lib  # pylint: disable=g-import-not-at-top
  from encoderx.models import heads  # pylint: disable=g-import-not-at-top
  config = method_config(tmp_path)
  path = tmp_path / "rows.jsonl"
  path.write_text("".join(json.dumps({"anchor": f"a{i}", "positive": f"p{i}",
                                      "negative_2": f"m{i}", "negative_1": f"n{i}"}) + "\n"
                          for i in range(3)), encoding="utf-8")
  config.finetune.train_file, config.finetune.pooling = str(path), "last_token"
  method_lib.Contrastive.validate(config)
  columns = method_lib.Contrastive(config).training_columns()
  assert columns == {"text": ["a0", "a1", "a2"], "text_pair": ["p0", "p1", "p2"],
                     "negative_1": ["n0", "n1", "n2"], "negative_2": ["m0", "m1", "m2"]}
  hidden = jnp.arange(2 * 4 * 3, dtype=jnp.float32).reshape(2, 4, 3)
  segments = jnp.array([[1, 1, 1, 0], [1, 1, 1, 1]])  # the last real tokens: 2 and 3
  np.testing.assert_array_equal(heads.pool(hidden, segments, "last_token"),
                                hidden[jnp.arange(2), jnp.array([2, 3])])


# Each case's contrastive settings, and the sentence-transformers loss the adapter
# (sentence_adapters.Contrastive) trains BertModel + mean pooling with.
STEP_PARITY_CASES = {
    "mnrl": ({}, "MultipleNegativesRankingLoss"),
    "symmetric": ({"symmetric": True}, "MultipleNegativesRankingLoss"),  # per_direction
    "cached": ({"cache_chunk_size": 4}, "CachedMultipleNegativesRankingLoss"),
    "matryoshka": ({"matryoshka_dims": (32, 8), "matryoshka_weights": (1.0, 0.5)},
                   "MatryoshkaLoss"),
    "learned_scale": ({"learn_scale": True}, "MultipleNegativesRankingLoss"),
}


@pytest.mark.parametrize("case", list(STEP_PARITY_CASES))
def test_steps_match_sentence_transformers_loss_on_hugging_face_bert(tmp_path, case):
  """20 steps of the contrastive method (a hard negative column, batch 8 of 16 tokens,
  dropout off) against BertModel + mean pooling + sentence-transformers' loss class
  (MultipleNegativesRankingLoss, its symmetric form, CachedMultipleNegativesRankingLoss
  with mini_batch_size = cache_chunk_size against encoderx's cached step, MatryoshkaLoss
  over MNRL at two weighted sizes; a learned scale as open_clip's logit_scale, exp
  capped at 100 and not decayed) under torch's AdamW, from the same weights on the same
  batches. Bounds: gradient norm 5e-4 relative and weights 1e-4 absolute, as
  tests/test_training_parity.py's; the loss 2e-4 relative, not 1e-5: it is a difference
  of scores scaled by 20 (float32's resolution there is ~2e-6) that falls to ~0.3, where
  the first steps agree to ~5e-7 and the last to ~1e-4 (the symmetric case's worst step
  1.1e-4 since the attention's softmax takes jax's own derivative rule, 8e-5 before)
  while the weights agree to ~7e-6."""
  import test_training_parity as parity  # pylint: disable=g-import-not-at-top
  settings, loss_class = STEP_PARITY_CASES[case]
  config = method_config(tmp_path, steps=parity.STEPS)
  config.data.seq_length = 16
  config.contrastive.update(settings)
  config.optimizer.learning_rate, config.optimizer.warmup_steps = 1e-3, 4
  config.optimizer.weight_decay, config.optimizer.clip_norm = 0.1, 1.0
  result, adapter = parity.side_by_side(config)
  assert type(adapter.loss_module).__name__ == loss_class
  parity.check(result, config, f"contrastive {case} vs {loss_class}", loss_drop=0.5,
               loss_rtol=2e-4)
  if case == "learned_scale":  # it moved by more than the weights' bound, undecayed
    start = np.log(np.float32(config.contrastive.scale))
    assert abs(adapter.model.logit_scale.item() - start) > 10 * parity.PARAM_ATOL
    assert result.param_diffs["logit_scale"] <= parity.PARAM_ATOL


@pytest.mark.parametrize("variant", ["tiny", "mnrl", "cached", "crops", "bert", "modernbert",
                                     "eurobert"])
def test_the_embedding_configs_are_valid(tmp_path, variant):
  from encoderx import config as config_lib, configs  # pylint: disable=g-import-not-at-top
  (tmp_path / "train.tsv").write_text("anchor\tpositive\na\tb\n", encoding="utf-8")
  (tmp_path / "dev.tsv").write_text("score\ttext_a\ttext_b\n1\ta\tb\n", encoding="utf-8")
  config = configs.get(f"embedding:{variant},data={tmp_path}")
  config_lib.validate(config)
  assert config.method == "contrastive" and config.finetune.pooling == "mean"

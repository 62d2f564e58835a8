"""Span boundary objective and SpanBERT: the head reads only a unit's boundaries and
offsets, loss = MLM + SBO in the train step, configs, the batch inspector's spans."""
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from encoderx import errors
from encoderx import config as config_lib, train
from encoderx import configs
from encoderx.data import tasks
from encoderx.models import model_config as model_config_lib
from encoderx.models import embeddings as embeddings_lib, encoder, heads, pretraining
from encoderx.objectives import mlm
from encoderx.tools.data import batch_inspector
from encoderx.train import trainer as trainer_lib

ONE_DEVICE = jax.devices()[:1]


def _span_config(tiny_config, **mlm_fields):
  """The shrunk test config with SpanBERT's objectives and masking."""
  config = tiny_config()
  config.data.builder = "doc_sentences"
  config.objective.names = ("mlm", "sbo")
  config.objective.mlm.unit = "span"
  config.objective.mlm.max_predictions = 32
  for field, value in mlm_fields.items():
    config.objective.mlm[field] = value
  return config


class _HeadWithEmbeddings(nn.Module):
  """SboHead alone, with the token embedding it scores against."""
  config: model_config_lib.ModelConfig

  @nn.compact
  def __call__(self, hidden, left, right, offsets):
    embeddings = embeddings_lib.Embeddings(self.config, name="embeddings")
    return heads.SboHead(self.config, name="sbo_head")(hidden, left, right, offsets,
                                                       embeddings)


def test_sbo_head_reads_only_the_boundaries_and_the_offset(tiny_config):
  model_config = model_config_lib.ModelConfig.from_config(tiny_config().model, vocab_size=300)
  head = _HeadWithEmbeddings(model_config)
  hidden = jax.random.normal(jax.random.key(0), (2, 16, model_config.hidden_size))
  # Row 0: a unit at tokens 5..8 (boundaries 4 and 9), its four tokens at offsets 0..3.
  # Row 1: a unit at 11..12 (boundaries 10 and 13), then two unused slots.
  left = jnp.array([[4, 4, 4, 4], [10, 10, 0, 0]])
  right = jnp.array([[9, 9, 9, 9], [13, 13, 0, 0]])
  offsets = jnp.array([[0, 1, 2, 3], [0, 1, 0, 0]])
  units = {0: np.s_[0, 0:4], 1: np.s_[1, 0:2]}
  params = head.init(jax.random.key(1), hidden, left, right, offsets)
  logits = jax.jit(lambda h: head.apply(params, h, left, right, offsets))
  reference = logits(hidden)
  assert reference.shape == (2, 4, 300)
  noise = 5.0 * jax.random.normal(jax.random.key(2), hidden.shape)

  def perturbed(row, positions):
    return logits(hidden.at[row, positions].add(noise[row, positions]))

  # Inside the units, and anywhere but the boundaries: the logits do not move at all.
  for row, positions in ((0, np.arange(5, 9)), (1, np.r_[0:10, 11:13, 14:16])):
    moved = perturbed(row, positions)
    for unit in units.values():
      np.testing.assert_array_equal(moved[unit], reference[unit])
  # A boundary moves its unit's logits, and only its unit's.
  for row, boundary in ((0, 4), (0, 9), (1, 10), (1, 13)):
    moved = perturbed(row, np.array([boundary]))
    assert np.abs(moved[units[row]] - reference[units[row]]).max(axis=-1).min() > 1e-3
    np.testing.assert_array_equal(moved[units[1 - row]], reference[units[1 - row]])
  # The offset embedding tells the tokens of one unit apart.
  assert np.abs(reference[0, 0] - reference[0, 1]).max() > 1e-4


def _perturb_encoder_output(row, positions, delta):
  """Adds `delta` to the encoder's output at `positions` of `row` (inside the model)."""
  def interceptor(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    if isinstance(context.module, encoder.Encoder) and context.method_name == "__call__":
      out = out.at[row, positions].add(delta)
    return out
  return nn.intercept_methods(interceptor)


def test_model_sbo_logits_ignore_the_encoder_inside_a_span(tiny_config, austen_batch,
                                                          vocabulary):
  config = _span_config(tiny_config)
  trainer = trainer_lib.Trainer(config, devices=ONE_DEVICE)
  batch = {name: value[8:12] for name, value in austen_batch.items()}
  batch = trainer.prepared_batch(batch, step=0)
  params = trainer.init_state().params
  weights = batch["masked_weights"][0] > 0
  lengths = batch["masked_unit_right"][0] - batch["masked_unit_left"][0] - 1
  index = int(np.flatnonzero(weights & (lengths > 1))[0])  # a multi-token unit of row 0
  left, right = int(batch["masked_unit_left"][0, index]), int(batch["masked_unit_right"][0, index])
  unit = (batch["masked_unit_left"][0] == left) & weights
  inside = np.arange(left + 1, right)

  def outputs(positions=None):
    # A new jitted function each time, traced inside the perturbation (eagerly, JAX
    # compiles each of the model's operations on its own: slow).
    apply = lambda: jax.jit(  # noqa: E731
        lambda p, b: trainer.method.model.apply({"params": p}, b))(params, batch)
    if positions is None:
      return apply()
    with _perturb_encoder_output(0, positions, 3.0):
      return apply()

  reference, changed_inside, changed_left = (outputs(), outputs(inside),
                                             outputs(np.array([left])))
  np.testing.assert_allclose(changed_inside["sbo_logits"][0, unit],
                             reference["sbo_logits"][0, unit], atol=1e-6, rtol=0)
  # The MLM head reads those very positions; SBO reads the boundary.
  assert np.abs(changed_inside["mlm_logits"][0, unit]
                - reference["mlm_logits"][0, unit]).max(axis=-1).min() > 1e-3
  assert np.abs(changed_left["sbo_logits"][0, unit]
                - reference["sbo_logits"][0, unit]).max(axis=-1).min() > 1e-3


def test_train_step_loss_is_mlm_plus_sbo_and_trains_the_sbo_head(tiny_config,
                                                                 austen_batch):
  config = _span_config(tiny_config)
  trainer = trainer_lib.Trainer(config, devices=ONE_DEVICE)
  assert [o.name for o in trainer.method.objectives] == ["mlm", "sbo"]
  assert trainer.method.objectives[0].config.unit == "span"
  assert trainer.describe()["heads"] == ["mlm", "sbo"]
  state = trainer.init_state()
  before = jax.device_get(state.params["sbo_head"])
  batch = {name: value[8:16] for name, value in austen_batch.items()}
  step = trainer.train_step(0)
  state, metrics = step(state, trainer.device_batch(batch))
  metrics = jax.device_get(metrics)
  assert metrics["loss"] == pytest.approx(metrics["mlm_loss"] + metrics["sbo_loss"], rel=1e-5)
  # At initialization both predict near-uniformly over the vocabulary.
  assert metrics["sbo_loss"] == pytest.approx(np.log(trainer.method.vocabulary.vocab_size), rel=0.1)
  state, _ = step(state, trainer.device_batch(batch))  # step 0's learning rate is 0
  moved = jax.tree_util.tree_map(lambda a, b: float(np.abs(a - b).max()), before,
                                 jax.device_get(state.params["sbo_head"]))
  assert min(jax.tree_util.tree_leaves(moved)) > 0  # every SBO parameter gets a gradient


def test_spanbert_configs_are_valid_with_the_papers_recipe():
  base, tiny = configs.get("spanbert:base"), configs.get("spanbert:tiny")
  for config in (base, tiny):
    config_lib.validate(config)
    assert tuple(config.objective.names) == ("mlm", "sbo")
    assert config.data.builder == "doc_sentences"
    mlm_fields = config.objective.mlm
    assert (mlm_fields.unit, mlm_fields.span_geometric_p, mlm_fields.max_span_words,
            mlm_fields.rate) == ("span", 0.2, 10, 0.15)
  model = base.model
  assert (model.num_layers, model.hidden_size, model.num_heads) == (12, 768, 12)
  assert (model.vocab_size, model.embeddings.max_positions) == (28996, 512)
  assert not base.data.vocab.lower_case  # cased
  assert (base.data.seq_length, base.train.long_fraction) == (512, 0.0)
  assert (base.train.steps, base.train.batch_size) == (2_400_000, 256)
  assert (base.optimizer.learning_rate, base.optimizer.warmup_steps) == (1e-4, 10_000)
  # The budget (15% of 510) plus the span that crosses it fit the prediction slots.
  assert base.objective.mlm.max_predictions >= 0.15 * 510 + 10


@pytest.mark.parametrize("field, value, message", [
    ("unit", "token", r"objective\.mlm\.unit.*sbo.*'word', 'ngram', 'span'"),
    ("unit", "spans", r"objective\.mlm\.unit.*'spans' is not one of"),
    ("span_geometric_p", 0.0, r"objective\.mlm\.span_geometric_p"),
    ("max_span_words", 0, r"objective\.mlm\.max_span_words"),
    ("max_ngram", 0, r"objective\.mlm\.max_ngram"),
])
def test_bad_masking_fields_name_the_field(tiny_config, field, value, message):
  config = _span_config(tiny_config, **{field: value})
  with pytest.raises(errors.ConfigError, match=message):
    config_lib.validate(config)


def test_batch_inspector_shows_each_span_with_its_boundaries(tiny_config, austen_batch):
  trainer = trainer_lib.Trainer(_span_config(tiny_config), devices=ONE_DEVICE)
  batch = trainer.prepared_batch({k: v[8:12] for k, v in austen_batch.items()}, step=3)
  text = batch_inspector.describe(batch, trainer.method.vocabulary, index=0)
  spans = re.findall(r"span (\d+)-(\d+) '([^']*)' -> (.*) \(boundaries (\d+), (\d+)\)", text)
  weights = batch["masked_weights"][0] > 0
  assert spans and sum(int(b) - int(a) + 1 for a, b, *_ in spans) == weights.sum()
  vocabulary = trainer.method.vocabulary
  for first, last, words, how, left, right in spans:
    first, last = int(first), int(last)
    assert (int(left), int(right)) == (first - 1, last + 1)
    originals = austen_batch["input_ids"][8, first:last + 1]
    assert words == " ".join(vocabulary.id_to_token(int(i)) for i in originals)
    now = batch["input_ids"][0, first:last + 1]
    if how.startswith("[MASK]"):
      assert how == f"[MASK]x{last - first + 1}" and (now == vocabulary.mask_id).all()
    elif how == "kept":
      assert (now == originals).all()
    else:
      assert how.startswith("random '")


def test_spanbert_tiny_learns_on_the_bundled_corpus(tiny_config, tmp_path):
  config = configs.get("spanbert:tiny")
  shrunk = tiny_config()
  for section in ("model", "train", "eval", "checkpoint"):
    config[section] = shrunk[section]
  config.model.hidden_size, config.model.intermediate_size = 64, 128
  config.data.seq_length, config.data.shuffle_buffer = 64, 200
  config.objective.mlm.max_predictions = 16
  config.train.steps = 60
  config.optimizer.learning_rate, config.optimizer.warmup_steps = 3e-3, 5
  result = train.run(config, str(tmp_path), show_progress=False, devices=ONE_DEVICE)
  history = result["history"]
  assert history[-1]["step"] == 60
  for name in ("mlm", "sbo"):
    last = np.mean([h[f"{name}_loss"] for h in history[-10:]])
    assert last < history[0][f"{name}_loss"] - 2.0, (name, history[0][f"{name}_loss"], last)
  assert {"mlm_loss", "sbo_loss", "sbo_accuracy"} <= set(result["eval"])
  assert "nsp_loss" not in result["eval"]

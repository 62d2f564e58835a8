"""ELECTRA (method 'electra'): parity of the generator and discriminator with Hugging Face
(ElectraForMaskedLM, ElectraForPreTraining), ELECTRA's masking and sampling, the
embedding sharing (shared, GDES) and its gradients, joint and decoupled training, sharded
runs, resume, learning, --init_from and validation."""
import functools
import shutil

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
import transformers
from scipy import stats

from encoderx import errors
from encoderx import config as config_lib
from encoderx import initialize, train
from encoderx.data import pipeline, resources
from encoderx.hf import engine
from encoderx.methods import electra
from encoderx.objectives import rtd
from encoderx.train import trainer as trainer_lib

from reference_models import padded_batch  # pylint: disable=g-bad-import-order

ONE_DEVICE = jax.devices()[:1]


def _config(tiny_config, sharing="shared", training="joint", **rtd_fields):
  config = tiny_config("electra:tiny")
  config.rtd.embedding_sharing, config.rtd.training = sharing, training
  for field, value in rtd_fields.items():
    config.rtd[field] = value
  return config


def _deterministic(config):
  config.model.hidden_dropout = config.model.attention.dropout = 0.0
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
  config.model.update(hidden_size=48, num_heads=4, intermediate_size=80, embeddings=dict(size=32, max_positions=64), init=dict(range=0.2))
  return electra.ReplacedTokenDetection(config_lib.validate(config))


def _torch_model(model_class, model_config):
  """A seeded PyTorch ELECTRA in eval mode, biases and LayerNorms perturbed (Hugging Face
  initializes them to 0 and 1, which would hide a mix-up)."""
  torch.manual_seed(0)
  model = model_class(engine.hf_config(model_config, "electra")).eval()
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
  generator_params = engine.from_hf(generator.state_dict(), method.generator_config,
                                    family="electra")
  discriminator_params = engine.from_hf(discriminator.state_dict(), method.model_config,
                                        family="electra")
  params = method.with_transferable_params({electra.GENERATOR: generator_params},
                                           discriminator_params)
  engine.check_tree(params, jax.eval_shape(method.init, jax.random.key(0))["params"])
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
    exported = engine.to_hf(ours, model_config, family="electra")
    assert set(exported) == set(reference) - tied
    for name, value in exported.items():
      np.testing.assert_array_equal(value, reference[name].numpy(), err_msg=name)


# --- masking and sampling -------------------------------------------------------------------
@pytest.fixture(scope="module")
def electra_batches():
  """(method of electra_tiny, 8 real batches of 32 rows of 128 tokens)."""
  from encoderx import configs  # pylint: disable=g-import-not-at-top
  method = electra.ReplacedTokenDetection(config_lib.validate(configs.get("electra:tiny")))
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


def _method_and_batch(config):
  """(method, its initial params, a batch of 8 rows of 64, the batch prepared)."""
  method = electra.ReplacedTokenDetection(config_lib.validate(config))
  # Jitted, as the gradients below: eagerly, JAX compiles each operation of the model on
  # its own, which took a minute for the disentangled encoder.
  params = flax.linen.unbox(jax.jit(method.init)(jax.random.key(0))["params"])
  (batch,) = pipeline.take_batches(method.task(), "train", config.data.seq_length,
                                   config.train.batch_size, 1, seed=3)
  prepared = jax.jit(method.prepare)(dict(batch), jax.random.key(1))
  return method, params, batch, prepared


@functools.cache
def _shared_method_and_batch(sharing):
  """_method_and_batch of the tiny ELECTRA under `sharing`, once per process (read only)."""
  from conftest import _tiny_config  # pylint: disable=g-import-not-at-top
  return _method_and_batch(_config(_tiny_config, sharing))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_generator_never_samples_a_padding_row(tiny_config, dtype):
  """model.vocab_multiple=128 puts the 8,000 tokens in 8,064 rows. The generator scores
  the padding rows at the compute dtype's lowest value, so that even with a padding bias
  that outscores every token (1e4) no sample is a padding id; the samples still spread
  over the real tokens."""
  config = _config(tiny_config)
  config.model.vocab_multiple, config.model.dtype = 128, dtype
  method, params, _, prepared = _method_and_batch(config)
  bias = params["generator"]["mlm_head"]["output_bias"]
  params["generator"]["mlm_head"]["output_bias"] = bias.at[8000:].set(1e4)

  @jax.jit
  def generate(params):
    logits = method.generator.apply({"params": params["generator"]}, prepared)["mlm_logits"]
    return logits, method.generate(params, prepared, None, jax.random.key(5))[1]

  logits, corrupted = generate(params)
  assert logits.dtype == jnp.dtype(dtype) and logits.shape[-1] == 8064
  assert np.all(np.asarray(logits[..., 8000:] == jnp.finfo(logits.dtype).min))
  sampled = np.take_along_axis(np.asarray(corrupted["input_ids"]),
                               np.asarray(prepared["masked_positions"]), axis=1)[
                                   np.asarray(prepared["masked_weights"]) > 0]
  assert sampled.size >= 40 and sampled.max() < 8000
  assert len(set(sampled.tolist())) > sampled.size // 2


# --- embedding sharing and its gradients ----------------------------------------------------


@pytest.mark.parametrize("sharing", ["shared", "gdes"])
def test_the_discriminator_loss_reaches_the_generator_only_through_shared_embeddings(
    sharing):
  """The sample carries no gradient, so the discriminator's loss trains no generator layer
  or head; under 'shared' it trains the shared embedding parameters, under GDES nothing of
  the generator (the discriminator's deltas instead)."""
  method, params, _, prepared = _shared_method_and_batch(sharing)

  def discriminator_loss(generator, discriminator):
    both = {"generator": generator, "discriminator": discriminator}
    _, corrupted = method.generate(both, prepared, jax.random.key(2), jax.random.key(3))
    return method.discriminate(both, prepared, corrupted, jax.random.key(4))["loss_sum"]

  generator_grads, discriminator_grads = (_flat(g) for g in jax.jit(jax.grad(
      discriminator_loss, argnums=(0, 1)))(params["generator"], params["discriminator"]))
  reached = {name for name, grad in generator_grads.items() if np.abs(grad).max() > 0}
  if sharing == "shared":
    assert reached == {f"encoder_model/embeddings/{name}" for name in (
        "word_embeddings/embedding", "position_embeddings/embedding",
        "token_type_embeddings/embedding", "layer_norm/scale", "layer_norm/bias")}
    assert "embedding_deltas" not in params["discriminator"]
  else:
    assert not reached  # every gradient exactly zero
    deltas = {name for name in discriminator_grads if name.startswith("embedding_deltas/")}
    assert deltas == {"embedding_deltas/word_embeddings",
                      "embedding_deltas/position_embeddings"}
    assert all(np.abs(discriminator_grads[name]).max() > 0 for name in deltas)
  # The generator's MLM loss, in turn, never reaches the discriminator.
  mlm_grads = jax.grad(lambda d: method.generate(
      {"generator": params["generator"], "discriminator": d}, prepared, None,
      jax.random.key(3))[0]["loss_sum"])(params["discriminator"])
  assert all(np.abs(g).max() == 0 for g in _flat(mlm_grads).values())


def test_gdes_exports_generator_embedding_plus_delta_and_takes_it_back():
  method, params, batch, _ = _shared_method_and_batch("gdes")
  params = jax.tree_util.tree_map(np.array, params)  # a copy: the shared one stays as is
  deltas = params["discriminator"]["embedding_deltas"]
  assert all(np.all(d == 0) for d in jax.tree_util.tree_leaves(deltas))  # start at zero
  deltas["word_embeddings"] = np.full_like(deltas["word_embeddings"], 0.25)
  exported = method.transferable_params(params)
  embeddings = exported["encoder_model"]["embeddings"]
  np.testing.assert_allclose(
      embeddings["word_embeddings"]["embedding"],
      params["generator"]["encoder_model"]["embeddings"]["word_embeddings"]["embedding"]
      + 0.25)
  # The discriminator's own LayerNorm and token types (GDES shares word and positions only).
  assert embeddings["layer_norm"] is params["discriminator"]["encoder_model"]["embeddings"][
      "layer_norm"]
  taken = method.with_transferable_params(params, exported)
  assert _max_difference(method.transferable_params(taken), exported) == 0.0
  np.testing.assert_array_equal(  # the generator's layers are kept
      _flat(taken["generator"]["encoder_model"]["encoder"])["layer_0/ffn/output/kernel"],
      _flat(params["generator"]["encoder_model"]["encoder"])["layer_0/ffn/output/kernel"])
  # What the discriminator computes is what the exported weights compute.
  ours = method.discriminator.apply({"params": method.discriminator_params(params)}, batch)
  alone = method.discriminator.apply({"params": exported}, batch)
  np.testing.assert_array_equal(ours["rtd_logits"], alone["rtd_logits"])


# --- joint and decoupled training -----------------------------------------------------------
@functools.partial(jax.jit, static_argnums=0)
def _adam_step(optimizer, params, grads):
  """One step of `optimizer` from its initial state, jitted (eagerly, each of optax's
  operations compiled on its own for each parameter shape: a minute)."""
  changes, _ = optimizer.update(grads, optimizer.init(params), params)
  return optax.apply_updates(params, changes)


def test_decoupled_steps_the_generator_by_mlm_then_the_discriminator_on_its_samples(
    tiny_config):
  config = _deterministic(_config(tiny_config, "gdes", "decoupled",
                                  discriminator_learning_rate=3e-3))
  config.optimizer.warmup_steps = 0  # the peak learning rates from step 0
  config.optimizer.learning_rate = 1e-3
  trainer = trainer_lib.Trainer(config, devices=ONE_DEVICE)
  method = trainer.method
  assert [u.name for u in method.updates] == ["generator", "discriminator"]
  # The batch _method_and_batch takes (the same data settings: rows of 64, 8, seed 3).
  batch = dict(_shared_method_and_batch("gdes")[2])
  state = trainer.init_state()
  assert set(state.opt_state) == {"generator", "discriminator"}
  before = jax.device_get(state.params)
  state, metrics = trainer.train_step(0)(state, trainer.device_batch(batch))
  after, metrics = jax.device_get((state.params, metrics))

  # By hand: the generator's AdamW step from its MLM loss alone; its samples (drawn before
  # its step) corrupt the batch; the discriminator's step (its own optimizer, 3x the
  # learning rate) from rtd_lambda x BCE, reading the updated generator's embeddings.
  prepare_key, loss_key = trainer_lib.step_keys(trainer_lib.run_rng(config.train.seed), 0)
  prepared = jax.jit(method.prepare)(dict(batch), prepare_key)
  denominators = method.denominators(prepared)
  generator_key, sample_key, _ = jax.random.split(loss_key, 3)

  def mlm_loss(generator):
    terms, corrupted = method.generate({**before, "generator": generator}, prepared,
                                       generator_key, sample_key)
    return terms["loss_sum"] / denominators["mlm"], corrupted

  (_, corrupted), grads = jax.jit(jax.value_and_grad(mlm_loss, has_aux=True))(
      before["generator"])
  generator = _adam_step(trainer.optimizers["generator"], before["generator"], grads)
  assert _max_difference(generator, after["generator"]) < 1e-6
  _, _, discriminator_key = jax.random.split(jax.random.fold_in(loss_key, 1), 3)

  def bce(discriminator):
    terms = method.discriminate({"generator": generator, "discriminator": discriminator},
                                prepared, corrupted, discriminator_key)
    return 50.0 * terms["loss_sum"] / denominators["rtd"]

  discriminator = _adam_step(trainer.optimizers["discriminator"], before["discriminator"],
                             jax.jit(jax.grad(bce))(before["discriminator"]))
  assert _max_difference(discriminator, after["discriminator"]) < 1e-6
  assert _max_difference(after["discriminator"], before["discriminator"]) > 1e-4
  assert metrics["learning_rate_discriminator"] == pytest.approx(
      3 * metrics["learning_rate_generator"])
  assert metrics["loss_discriminator"] == pytest.approx(50 * metrics["rtd_loss"], rel=1e-6)
  assert metrics["loss_generator"] == pytest.approx(metrics["mlm_loss"], rel=1e-6)


# --- the trainer: sharding, resume, learning ------------------------------------------------
def _losses(trainer, batches):
  state, step = trainer.init_state(), trainer.train_step(0)
  history = []
  for batch in batches:
    state, metrics = step(state, trainer.device_batch(batch))
    history.append(jax.device_get(metrics))
  return history


@pytest.mark.parametrize("sharing,training,accumulate", [
    ("shared", "joint", 1), pytest.param("gdes", "decoupled", 2, marks=pytest.mark.slow)])
def test_mesh_2x2x2_matches_one_device(tiny_config, sharing, training, accumulate):
  """Dropout on; decoupled with 2 micro-batches: the generator's samples are carried to
  the discriminator's update micro-batch by micro-batch."""
  config = _config(tiny_config, sharing, training)
  config.model.num_layers = 1  # (the generator as deep): sharding is what differs
  config.train.grad_accum_steps = accumulate
  config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 2, 2, 2
  sharded = trainer_lib.Trainer(config)
  batches = pipeline.take_batches(sharded.method.task(), "train", 64, 8, 3, seed=11)
  config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 1, 1, 1
  single = trainer_lib.Trainer(config, devices=ONE_DEVICE)
  ours, theirs = _losses(sharded, batches), _losses(single, batches)
  # The joint loss is ~44 (the discriminator's weighted by 50), where one float32 ulp is
  # 4e-6: sums over other shard orders differ by a few ulps, so relative 1e-6 there.
  for metric in ("loss", "mlm_loss", "rtd_loss", "rtd_accuracy", "mlm_sampled_accuracy"):
    np.testing.assert_allclose([m[metric] for m in ours], [m[metric] for m in theirs],
                               atol=1e-5, rtol=1e-6, err_msg=metric)
  assert ours[0]["loss"] != ours[2]["loss"]


def _run(config, workdir, **kwargs):
  return train.run(config, str(workdir), show_progress=False, devices=ONE_DEVICE, **kwargs)


@pytest.mark.slow
def test_stop_and_resume_equals_running_straight_and_runs_export_the_discriminator(
    tiny_config, tmp_path, caplog):
  config = _config(tiny_config, "gdes", "decoupled")
  config.train.steps = 4
  config.checkpoint.every_steps = 100  # only the stop and the end save
  straight = _run(config, tmp_path / "straight")
  first = _run(config, tmp_path / "resumed", stop_at_step=2)
  second = _run(config, tmp_path / "resumed", resume=True)
  assert first["stopped"] and second["step"] == 4
  losses = {h["step"]: (h["loss_generator"], h["loss_discriminator"])
            for h in first["history"] + second["history"]}
  assert [losses[s] for s in range(1, 5)] == [
      (h["loss_generator"], h["loss_discriminator"]) for h in straight["history"]]
  assert second["eval"] == pytest.approx(straight["eval"])
  assert set(straight["eval"]) >= {"mlm_loss", "mlm_accuracy", "mlm_sampled_accuracy",
                                   "rtd_loss", "rtd_accuracy", "rtd_precision",
                                   "rtd_recall", "mlm_perplexity"}

  # Another run starts from this one's discriminator (its word embedding = the
  # generator's + the delta): here BERT pretraining, whose MLM and NSP heads are new.
  bert = tiny_config()
  bert.init_from = str(tmp_path / "straight")
  bert = initialize.resolve_config(bert)
  trainer = trainer_lib.Trainer(bert, devices=ONE_DEVICE)
  with caplog.at_level("INFO", logger="encoderx"):
    state = initialize.initial_state(trainer)
  assert ("initialized fresh: encoder_model/pooler, mlm_head, sentence_head; unused from "
          "the source: rtd_head") in caplog.text
  source = electra.ReplacedTokenDetection(config)
  discriminator = source.transferable_params(jax.device_get(straight["params"]))
  encoder = dict(jax.device_get(state.params)["encoder_model"])
  encoder.pop("pooler")  # BERT's, new
  assert _max_difference(encoder, discriminator["encoder_model"]) == 0.0


def test_init_from_a_hugging_face_electra_discriminator_directory(tiny_config, tmp_path,
                                                                 caplog):
  """`--init_from=hf:DIR` of an ElectraForPreTraining as save_pretrained writes it: the run
  takes its sizes, vocabulary and every weight (the discriminator), and computes its
  logits; the generator's layers start fresh on the shared embeddings."""
  directory = tmp_path / "hf"
  vocab = resources.resolve("bundled:austen-wordpiece")
  vocab_size = sum(1 for _ in open(vocab, encoding="utf-8"))
  torch.manual_seed(0)
  reference = transformers.ElectraForPreTraining(transformers.ElectraConfig(
      vocab_size=vocab_size, embedding_size=32, hidden_size=48, num_hidden_layers=2,
      num_attention_heads=4, intermediate_size=80, max_position_embeddings=64,
      initializer_range=0.2)).eval()
  reference.save_pretrained(directory)
  shutil.copy(vocab, directory / "vocab.txt")
  (directory / "tokenizer_config.json").write_text('{"do_lower_case": true}')

  config = _config(tiny_config)
  config.init_from = f"hf:{directory}"
  config = initialize.resolve_config(config)
  assert (config.model.embeddings.size, config.model.hidden_size,
          config.model.num_heads) == (32, 48, 4)
  assert config.data.vocab.path == str(directory / "vocab.txt")
  trainer = trainer_lib.Trainer(config, devices=ONE_DEVICE)
  with caplog.at_level("INFO", logger="encoderx"):
    state = initialize.initial_state(trainer)
  assert "initialized fresh: -; unused from the source: -" in caplog.text
  method, params = trainer.method, jax.device_get(state.params)
  real, batch = padded_batch(vocab_size)
  ours = np.asarray(method.discriminator.apply(
      {"params": method.discriminator_params(params)}, batch)["rtd_logits"])
  difference = np.abs(ours[real] - _torch_logits(reference, batch)[real]).max()
  print(f"hf:DIR ElectraForPreTraining: max abs {difference:.2e}")
  assert difference <= 1e-4


@pytest.mark.slow
def test_tiny_electra_learns_on_the_bundled_corpus(tiny_config, tmp_path):
  config = _config(tiny_config)
  config.model.hidden_size, config.model.intermediate_size = 64, 128
  config.train.steps = 40
  config.optimizer.learning_rate = 3e-3
  config.optimizer.warmup_steps = 5
  history = _run(config, tmp_path)["history"]
  first, last = history[0], {k: np.mean([h[k] for h in history[-8:]]) for k in history[0]}
  print(f"first step: {first}\nlast 8 steps: {last}")
  assert last["mlm_loss"] < first["mlm_loss"] - 1.0
  assert last["rtd_loss"] < first["rtd_loss"] - 0.15
  assert last["loss"] < first["loss"] - 8.0


@pytest.mark.parametrize("field,value,message", [
    ("rtd.generator_width", 0.85, r"rtd\.generator_width.*hidden size 27 with 2 heads"),
    ("rtd.generator_depth", 0.0, r"rtd\.generator_depth.*must be in \(0, 1\]"),
    ("rtd.training", "alternating", r"rtd\.training.*'joint', 'decoupled'"),
    ("rtd.embedding_sharing", "tied", r"rtd\.embedding_sharing.*'shared', 'gdes'"),
    ("rtd.discriminator_learning_rate", 1e-3, r"discriminator_learning_rate.*decoupled"),
    ("rtd.rtd_lambda", -1.0, r"rtd\.rtd_lambda.*>= 0"),
    ("objective.names", ("mlm", "nsp"), r"objective\.names.*MLM alone"),
    ("data.builder", "sentence_pairs", r"data\.builder.*doc_sentences"),
])
def test_bad_rtd_settings_name_the_field_and_the_fix(tiny_config, field, value, message):
  config = _config(tiny_config)
  section, name = field.split(".")
  config[section][name] = value
  with pytest.raises(errors.ConfigError, match=message):
    config_lib.validate(config)


# --- DeBERTa-v3: this method on DeBERTa's encoder ---------------------------------------------
def test_deberta_v3_is_gdes_replaced_token_detection_on_disentangled_attention(tiny_config):
  """configs/deberta.py:v3_tiny: the generator half as deep and as wide as the DeBERTa
  discriminator; under GDES the discriminator's loss reaches none of the generator but its
  word and position deltas; decoupled steps run on the disentangled encoder (3 steps,
  finite losses, two optimizer states) and what export takes is a DeBERTa encoder."""
  config = tiny_config("deberta:v3_tiny")
  assert (config.method, config.rtd.embedding_sharing, config.rtd.training,
          config.rtd.rtd_lambda) == ("electra", "gdes", "decoupled", 10.0)
  method, params, _, prepared = _method_and_batch(config)
  assert method.generator_config.num_layers == method.model_config.num_layers // 2
  assert method.generator_config.hidden_size == method.model_config.hidden_size
  assert method.model_config.attention.variant == "disentangled"

  def discriminator_loss(generator, discriminator):
    both = {"generator": generator, "discriminator": discriminator}
    _, corrupted = method.generate(both, prepared, jax.random.key(2), jax.random.key(3))
    return method.discriminate(both, prepared, corrupted, jax.random.key(4))["loss_sum"]

  generator_grads, discriminator_grads = (_flat(g) for g in jax.jit(jax.grad(
      discriminator_loss, argnums=(0, 1)))(params["generator"], params["discriminator"]))
  assert all(np.abs(g).max() == 0 for g in generator_grads.values())
  assert np.abs(discriminator_grads["embedding_deltas/word_embeddings"]).max() > 0
  exported = _flat(method.transferable_params(jax.device_get(params)))
  assert "encoder_model/encoder/relative/relative_embeddings" in exported

  trainer = trainer_lib.Trainer(config, devices=ONE_DEVICE)
  assert len(trainer.method.updates) == 2
  batches = pipeline.take_batches(trainer.method.task(), "train", 64, 8, 3, seed=5)
  history = _losses(trainer, batches)
  assert all(np.isfinite(m["loss"]) and np.isfinite(m["rtd_loss"]) for m in history)

"""Hugging Face (PyTorch) reference models and inputs for the parity tests."""

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch

from encoderx.hf import engine
from encoderx.models import model_config
from encoderx.models import pretraining

# Small enough to run in a second. initializer_range is larger than BERT's 0.02 so that
# logits are O(1-10) and a 1e-4 bound means something.
SMALL = model_config.ModelConfig().replace(
    vocab_size=99, hidden_size=48, num_layers=3, num_heads=4, intermediate_size=80,
    hidden_act="gelu", hidden_dropout=0.1, dtype="float32", param_dtype="float32",
    embeddings=dict(size=48, max_positions=40, type_vocab_size=2),
    attention=dict(dropout=0.1), norm=dict(eps=1e-12), init=dict(range=0.2),
    layout=dict(sharing="none", scan=False, remat=False))


def small_model(**changes) -> model_config.ModelConfig:
  """SMALL with `changes` (a group's as a dict: small_model(layout=dict(scan=True)))."""
  return SMALL.replace(**changes)


def perturb(model):
  """`model` in eval mode with its biases and norms (LayerNorm, RMSNorm: every weight
  named for a norm) perturbed by N(0, 0.1), seeded: Hugging Face initializes them to 0
  and 1, which would hide a mix-up between them."""
  torch.manual_seed(0)
  with torch.no_grad():
    for name, parameter in model.named_parameters():
      if name.endswith("bias") or "norm" in name.lower():
        parameter.add_(0.1 * torch.randn_like(parameter))
  return model.eval()


def torch_reference(config: model_config.ModelConfig, family: str = "bert"):
  """The family's PyTorch pretraining model, seeded, in eval mode, with biases and
  norms perturbed (`perturb`)."""
  torch.manual_seed(0)
  return perturb(engine.hf_pretraining_model(config, family))


def model_config_from_hf(hf_config, **changes) -> model_config.ModelConfig:
  """The encoderx ModelConfig of a transformers config (engine.model_fields, as --init_from
  reads a config.json), with `changes`."""
  _, fields = engine.model_fields(hf_config.to_dict())
  config = model_config.ModelConfig().with_fields(fields)
  return config.with_fields({"embeddings.size": config.hidden_size}).replace(**changes)


def hf_forward(model, input_ids, attention_mask=None, **arguments):
  """A Hugging Face model's outputs with every hidden state (output_hidden_states) on
  numpy inputs; `arguments` as the class takes them (token_type_ids, position_ids...)."""
  tensor = lambda x: None if x is None else torch.tensor(np.asarray(x), dtype=torch.long)
  with torch.no_grad():
    return model(input_ids=tensor(input_ids), attention_mask=tensor(attention_mask),
                 output_hidden_states=True,
                 **{name: tensor(value) for name, value in arguments.items()})


def packed_batch(vocab_size: int, rows=((12, 20, 7), (30, 9)), length: int = 48,
                 seed: int = 0, first_id: int = 3):
  """(documents, numpy batch): rows of whole documents of the given lengths, packed
  (segment ids 1, 2, ... per document, positions restarting at 0 in each, then
  padding); `documents` lists (row, start, ids) of each."""
  rng = np.random.default_rng(seed)
  batch = {name: np.zeros((len(rows), length), np.int32) for name in (
      "input_ids", "token_type_ids", "segment_ids", "positions")}
  documents = []
  for row, lengths in enumerate(rows):
    start = 0
    for number, size in enumerate(lengths, 1):
      ids = rng.integers(first_id, vocab_size, size).astype(np.int32)
      span = slice(start, start + size)
      batch["input_ids"][row, span], batch["segment_ids"][row, span] = ids, number
      batch["positions"][row, span] = np.arange(size)
      documents.append((row, start, ids))
      start += size
    assert start <= length
  return documents, batch


def padded_batch(vocab_size: int, seed: int = 0, lengths=(40, 31, 17, 6), pad_id: int = 0,
                 two_segments: bool = True):
  """(real [batch, length] bool, numpy batch): random rows padded with `pad_id`; the
  second half of each row is segment B when `two_segments`."""
  rng = np.random.default_rng(seed)
  length = max(lengths)
  real = np.arange(length)[None, :] < np.asarray(lengths)[:, None]
  input_ids = np.where(real, rng.integers(pad_id + 2, vocab_size, real.shape), pad_id)
  token_types = (np.arange(length)[None, :] >= np.asarray(lengths)[:, None] // 2) * real
  return real, {
      "input_ids": input_ids.astype(np.int32),
      "token_type_ids": (token_types if two_segments else 0 * token_types).astype(np.int32),
      "segment_ids": real.astype(np.int32),
      "positions": np.broadcast_to(np.arange(length, dtype=np.int32), real.shape).copy(),
  }


def torch_outputs(model, batch):
  """The PyTorch model's outputs; RoBERTa derives its positions from input_ids."""
  with torch.no_grad():
    return model(input_ids=torch.tensor(batch["input_ids"], dtype=torch.long),
                 attention_mask=torch.tensor(batch["segment_ids"], dtype=torch.long),
                 token_type_ids=torch.tensor(batch["token_type_ids"], dtype=torch.long))


def mlm_logits(outputs) -> np.ndarray:
  """[batch, length, vocab] of any of the pretraining models' outputs."""
  logits = getattr(outputs, "prediction_logits", None)
  return (outputs.logits if logits is None else logits).numpy()


def flax_from_torch(config: model_config.ModelConfig, torch_model, family: str = "bert",
                    heads=("mlm", "sentence")):
  """(Flax model, params converted from `torch_model`); every weight must fit."""
  model = pretraining.PretrainingModel(config, heads=heads)
  expected = jax.eval_shape(lambda: model.init(jax.random.key(0),
                                               pretraining.init_batch(1, 8)))["params"]
  return model, engine.from_hf(torch_model.state_dict(), config, family=family,
                               expected=expected)


def check_round_trip(state_dict, torch_model, config: model_config.ModelConfig, family: str,
                     tied: set[str], pad_id: int = 0) -> None:
  """`state_dict` (from to_hf) equals `torch_model`'s bit for bit but for the `tied`
  weights, and loaded into a fresh model it computes what `torch_model` does."""
  reference = torch_model.state_dict()
  assert set(state_dict) == set(reference) - tied
  for name, value in state_dict.items():
    np.testing.assert_array_equal(value, reference[name].numpy(), err_msg=name)
  fresh = engine.hf_pretraining_model(config, family).eval()
  missing, unexpected = fresh.load_state_dict(
      {k: torch.from_numpy(v) for k, v in state_dict.items()}, strict=False)
  assert set(missing) <= tied and not unexpected
  _, batch = padded_batch(config.vocab_size, seed=2, pad_id=pad_id,
                         two_segments=config.embeddings.type_vocab_size > 1)
  np.testing.assert_allclose(mlm_logits(torch_outputs(fresh, batch)),
                             mlm_logits(torch_outputs(torch_model, batch)), atol=1e-6)


def mlm_and_hidden_states(config: model_config.ModelConfig, params, batch):
  """encoderx's MLM logits [batch, length, vocab] and hidden states: what entered each
  layer, then the encoder's output (Hugging Face's hidden_states)."""
  # Jitted, as every model call of the tests: eagerly, JAX compiles each of the model's
  # operations on its own, which made these tests minutes long.
  logits = jax.jit(pretraining.PretrainingModel(config, heads=("mlm",)).apply)(
      {"params": params}, batch)["mlm_logits"]
  encoder = pretraining.EncoderModel(config, with_pooler=False, with_layer_inputs=True)
  outputs = jax.jit(encoder.apply)({"params": params["encoder_model"]}, batch)
  return np.asarray(logits), list(np.asarray(outputs["layer_inputs"])) + [
      np.asarray(outputs["hidden"])]


def max_diffs(logits, hidden_states, theirs, real) -> dict[str, float]:
  """Max abs differences on the `real` tokens to a Hugging Face output (`hf_forward`):
  of the logits, and the largest over every hidden state."""
  return {"logits": float(np.abs(logits[real] - theirs.logits.numpy()[real]).max()),
          "hidden": max(float(np.abs(ours[real] - t.numpy()[real]).max())
                        for ours, t in zip(hidden_states, theirs.hidden_states, strict=True))}


def packed_diffs(logits, hidden_states, documents, torch_model) -> dict[str, float]:
  """`max_diffs` of packed rows' documents (`packed_batch`) against `torch_model` run on
  each document alone, the largest over the documents."""
  worst = {"logits": 0.0, "hidden": 0.0}
  for row, start, ids in documents:
    span = (slice(row, row + 1), slice(start, start + len(ids)))
    diffs = max_diffs(logits[span], [h[span] for h in hidden_states],
                      hf_forward(torch_model, ids[None]), np.ones((1, len(ids)), bool))
    worst = {k: max(worst[k], v) for k, v in diffs.items()}
  return worst


def check_init_statistics(ours: dict, theirs: dict) -> dict[str, float]:
  """Freshly initialized weights by Hugging Face name, encoderx's (`ours`, from to_hf)
  against the class's own: the same standard deviation (within 5%) and the same tail
  (the fraction beyond 2.2 standard deviations, 0 when truncated at 2 of the
  distribution's scale, 2.8% for a normal, within 1 point) for every weight of a
  thousand values or more; the smaller ones (norms, biases) equal. Returns the std
  ratios."""
  assert set(ours) <= set(theirs), set(ours) - set(theirs)
  ratios = {}
  for name, value in ours.items():
    reference = np.asarray(theirs[name])
    if value.size < 1000 or reference.std() == 0:
      np.testing.assert_array_equal(value, reference, err_msg=name)
      continue
    ratios[name] = float(value.std() / reference.std())
    tail = lambda x: float(np.mean(np.abs(x) > 2.2 * x.std()))
    assert 0.95 < ratios[name] < 1.05, (name, value.std(), reference.std())
    assert abs(tail(value) - tail(reference)) < 0.01, (name, tail(value), tail(reference))
  return ratios


def fresh_params(model, seed: int = 0) -> dict:
  """`model`'s freshly initialized (unboxed) params. Jitted, as every model call of the
  tests: eagerly, JAX compiles each of the model's operations on its own (slow)."""
  return flax.linen.unbox(jax.jit(model.init)(jax.random.key(seed),
                                              pretraining.init_batch(1, 8))["params"])


def mlm_train_step_gradients(config, batch, seed=0):
  """The gradients of an MLM loss at a few positions, with dropout, from a fresh init."""
  model = pretraining.PretrainingModel(config, heads=("mlm",))
  params = fresh_params(model, seed)
  positions = jnp.asarray([[1, 5, 9], [0, 2, 7]], jnp.int32)
  labels = jnp.take_along_axis(jnp.asarray(batch["input_ids"]), positions, axis=1)

  def loss(params):
    logits = model.apply({"params": params}, {**batch, "masked_positions": positions},
                         deterministic=False, rngs={"dropout": jax.random.key(1)})["mlm_logits"]
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

  value, grads = jax.jit(jax.value_and_grad(loss))(params)
  return float(value), flax.traverse_util.flatten_dict(grads)

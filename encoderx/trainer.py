"""Everything a pretraining run is made of, built from a config, and its step functions.

    trainer = Trainer(config)          # validates; builds vocabulary, model, mesh
    state = trainer.init_state()       # parameters created already sharded
    step = trainer.train_step(phase)   # one jax.jit: mask -> model -> loss -> AdamW
    state, metrics = step(state, trainer.device_batch(batch))

The train step is a single jitted function with explicit in/out shardings and the state
donated (pjit semantics). Masking runs inside it, keyed by fold_in(run key, step), so
the masks of a step do not depend on how many devices run it or on restarts.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec

from encoderx import config as config_lib
from encoderx import objectives as objectives_lib
from encoderx import optim, sharding
from encoderx.data import tasks
from encoderx.models import common, pretraining


@flax.struct.dataclass
class TrainState:
  step: jax.Array  # int32 scalar: optimizer updates done
  params: Any
  opt_state: Any
  rng: jax.Array  # uint32 key data of the run's base key


@dataclasses.dataclass(frozen=True)
class Phase:
  """A stretch of steps at one sequence length (BERT: 90% at 128, then 512)."""
  index: int
  start: int
  end: int
  seq_length: int
  max_predictions: int


def phases(config) -> tuple[Phase, ...]:
  train = config.train
  if not train.long_fraction:
    return (Phase(0, 0, train.steps, config.data.seq_length,
                  config.objective.mlm.max_predictions),)
  switch = int(round(train.steps * (1.0 - train.long_fraction)))
  return (Phase(0, 0, switch, config.data.seq_length, config.objective.mlm.max_predictions),
          Phase(1, switch, train.steps, train.long_seq_length, train.long_max_predictions))


def run_rng(seed: int) -> jax.Array:
  """The run's base key (as uint32 key data) for a seed."""
  return jax.random.key_data(jax.random.fold_in(jax.random.key(seed), 1))


def step_keys(rng: jax.Array, step) -> tuple[jax.Array, jax.Array]:
  """(masking key, dropout key) of a step: functions of the run key and step alone."""
  return tuple(jax.random.split(jax.random.fold_in(jax.random.wrap_key_data(rng), step)))


def prepare(objectives, batch: dict, key: jax.Array) -> dict:
  """Applies every objective's `prepare` (masking) with its own key."""
  for index, objective in enumerate(objectives):
    batch = objective.prepare(batch, jax.random.fold_in(key, index))
  return batch


def _micro_batches(batch: dict, count: int) -> dict:
  """[batch, ...] -> [count, batch / count, ...], micro-batch i = rows i, i+count, ...

  Strided rows keep every micro-batch spread over all data-parallel devices.
  """
  def split(x):
    x = x.reshape((x.shape[0] // count, count) + x.shape[1:]).swapaxes(0, 1)
    spec = PartitionSpec(None, sharding.BATCH_AXES, *([None] * (x.ndim - 2)))
    return jax.lax.with_sharding_constraint(x, spec)
  return jax.tree_util.tree_map(split, batch)


class Trainer:
  """Vocabulary, model, mesh, optimizer and jitted steps of one config."""

  def __init__(self, config, devices=None):
    self.config = config_lib.validate(config)
    self.vocabulary = tasks.build_vocabulary(config.data.vocab)
    self.model_config = common.ModelConfig.from_config(config.model,
                                                       self.vocabulary.vocab_size)
    if self.model_config.vocab_size < self.vocabulary.vocab_size:
      raise config_lib.ConfigError(
          f"config field 'model.vocab_size': {self.model_config.vocab_size} is smaller "
          f"than the vocabulary's {self.vocabulary.vocab_size} tokens "
          f"({config.data.vocab.path}). Set it to 0 to use the vocabulary's size.")
    self.phases = phases(config)
    self.objectives = {p.index: objectives_lib.build(config.objective, self.vocabulary,
                                                     p.max_predictions)
                       for p in self.phases}
    self.model = pretraining.PretrainingModel(
        self.model_config, heads=objectives_lib.model_heads(self.objectives[0]))
    self.schedule = optim.learning_rate_schedule(config.optimizer, config.train.steps)
    self.optimizer = optim.build(config.optimizer, config.train.steps)
    self.mesh = sharding.make_mesh(config.mesh, devices)
    self.state_shardings = self._state_shardings()

  # --- state ----------------------------------------------------------------------------
  def _boxed_params(self, key):
    batch = pretraining.init_batch(1, 8, max_predictions=2)
    return self.model.init({"params": key, "dropout": key}, batch)["params"]

  def describe(self) -> dict:
    """What checkpoints must agree on to be resumed or converted by this config.

    Model fields at their default value are left out, so that a checkpoint written
    before a field was added (with a default that keeps the old behaviour) still matches.
    """
    model = {field.name: getattr(self.model_config, field.name)
             for field in dataclasses.fields(self.model_config)
             if field.default is dataclasses.MISSING
             or getattr(self.model_config, field.name) != field.default}
    return {"model": model, "heads": list(self.model.heads)}

  def _state_shardings(self) -> TrainState:
    key = jax.random.key(0)
    boxed = jax.eval_shape(self._boxed_params, key)
    param_specs = nn.get_partition_spec(boxed)
    params = nn.unbox(boxed)
    opt_state = jax.eval_shape(self.optimizer.init, params)
    opt_specs = optax.tree_map_params(
        self.optimizer, lambda _, spec: spec, opt_state, param_specs,
        transform_non_params=lambda _: PartitionSpec(),
        is_leaf=lambda x: isinstance(x, PartitionSpec))
    abstract = TrainState(
        step=jax.ShapeDtypeStruct((), jnp.int32), params=params, opt_state=opt_state,
        rng=jax.ShapeDtypeStruct((2,), jnp.uint32))
    specs = TrainState(step=PartitionSpec(), params=param_specs, opt_state=opt_specs,
                       rng=PartitionSpec())
    self.abstract_state = abstract
    return sharding.logical_to_shardings(specs, abstract, self.mesh)

  def abstract_state_with_shardings(self) -> TrainState:
    """ShapeDtypeStructs carrying shardings: what orbax restores into."""
    return jax.tree_util.tree_map(
        lambda leaf, s: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=s),
        self.abstract_state, self.state_shardings)

  def init_state(self, params=None) -> TrainState:
    """A fresh state created sharded; `params` (e.g. converted weights) replace init."""
    seed = self.config.train.seed

    def init(params):
      key = jax.random.key(seed)
      if params is None:
        params = nn.unbox(self._boxed_params(jax.random.fold_in(key, 0)))
      return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                        opt_state=self.optimizer.init(params), rng=run_rng(seed))

    with self._context():
      if params is None:
        return jax.jit(lambda: init(None), out_shardings=self.state_shardings)()
      return jax.jit(init, out_shardings=self.state_shardings)(params)

  # --- steps ----------------------------------------------------------------------------
  def _context(self):
    """The mesh and logical axis rules that tracing and sharding constraints read."""
    stack = contextlib.ExitStack()
    stack.enter_context(jax.set_mesh(self.mesh))
    stack.enter_context(nn.logical_axis_rules(sharding.LOGICAL_AXIS_RULES))
    return stack

  def device_batch(self, batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
    """This process's numpy batch -> global arrays split over the data axes."""
    batch_sharding = sharding.batch_sharding(self.mesh)
    return {name: jax.make_array_from_process_local_data(batch_sharding, value)
            for name, value in batch.items()}

  def _loss_and_grads(self, objectives, params, batch, dropout_key):
    denominators = {o.name: o.denominator(batch) for o in objectives}

    def loss_fn(params, micro_batch, key):
      outputs = self.model.apply({"params": params}, micro_batch, deterministic=False,
                                 rngs={"dropout": key})
      terms = {o.name: o.terms(outputs, micro_batch) for o in objectives}
      loss = sum(terms[name]["loss_sum"] / denominators[name] for name in terms)
      return loss, terms

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    accumulate = self.config.train.grad_accum_steps
    if accumulate == 1:
      (loss, terms), grads = grad_fn(params, batch, dropout_key)
      return loss, terms, grads

    def add_micro_batch(total, inputs):
      index, micro_batch = inputs
      result = grad_fn(params, micro_batch, jax.random.fold_in(dropout_key, index))
      return jax.tree_util.tree_map(jnp.add, total, result), None

    micro_batches = _micro_batches(batch, accumulate)
    first = jax.tree_util.tree_map(lambda x: x[0], micro_batches)
    zeros = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype),
                                   jax.eval_shape(grad_fn, params, first, dropout_key))
    ((loss, terms), grads), _ = jax.lax.scan(
        add_micro_batch, zeros, (jnp.arange(accumulate), micro_batches))
    return loss, terms, grads

  def _train_step(self, objectives, state: TrainState, batch: dict):
    prepare_key, dropout_key = step_keys(state.rng, state.step)
    batch = prepare(objectives, batch, prepare_key)
    loss, terms, grads = self._loss_and_grads(objectives, state.params, batch, dropout_key)
    updates, opt_state = self.optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads),
               "learning_rate": self.schedule(state.step)}
    metrics.update(summarize(terms))
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

  @functools.cache
  def train_step(self, phase_index: int = 0):
    """jit(state, batch) -> (state, metrics) for a phase; the state is donated."""
    step = jax.jit(functools.partial(self._train_step, self.objectives[phase_index]),
                   in_shardings=(self.state_shardings, sharding.batch_sharding(self.mesh)),
                   out_shardings=(self.state_shardings, sharding.replicated(self.mesh)),
                   donate_argnums=(0,))
    return self._in_context(step)

  def prepared_batch(self, batch: dict, step: int, phase_index: int = 0) -> dict:
    """The batch as the train step of `step` sees it (masked, with targets), on host.

    For looking at what the model is trained on; uses the run key of the config's seed.
    """
    prepare_key, _ = step_keys(run_rng(self.config.train.seed), step)
    prepared = jax.jit(functools.partial(prepare, self.objectives[phase_index]))(
        {k: jnp.asarray(v) for k, v in batch.items()}, prepare_key)
    return jax.device_get(prepared)

  def _eval_terms(self, objectives, params, batch: dict, key: jax.Array) -> dict:
    batch = prepare(objectives, batch, key)
    outputs = self.model.apply({"params": params}, batch, deterministic=True)
    return {o.name: o.terms(outputs, batch) for o in objectives}

  @functools.cache
  def eval_terms(self, phase_index: int = 0):
    """jit(params, batch, key) -> {objective: {loss_sum, correct, count}}."""
    terms = jax.jit(functools.partial(self._eval_terms, self.objectives[phase_index]),
                    in_shardings=(self.state_shardings.params,
                                  sharding.batch_sharding(self.mesh),
                                  sharding.replicated(self.mesh)),
                    out_shardings=sharding.replicated(self.mesh))
    return self._in_context(terms)

  def _in_context(self, function):
    @functools.wraps(function)
    def call(*args):
      with self._context():
        return function(*args)
    return call


def summarize(terms: dict) -> dict:
  """{objective: sums} -> {objective_loss, objective_accuracy} means."""
  metrics = {}
  for name, t in terms.items():
    count = jnp.maximum(t["count"], 1.0)
    metrics[f"{name}_loss"] = t["loss_sum"] / count
    metrics[f"{name}_accuracy"] = t["correct"] / count
  return metrics

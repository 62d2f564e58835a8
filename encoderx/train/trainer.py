"""Everything a training run is made of, built from a config, and its step functions.

    trainer = Trainer(config)          # validates; builds the method, mesh, optimizers
    state = trainer.init_state()       # parameters (and method state) created sharded
    step = trainer.train_step(phase)   # one jax.jit: prepare -> loss -> gradients -> update
    state, metrics = step(state, trainer.device_batch(batch))
    step, cost = trainer.compile_train_step(state, batch, phase)  # ahead of time
    rows = trainer.evaluation_batch_size(phase.seq_length)  # eval.batch_size, resolved

The trainer knows no objective, head or model family: those belong to the training
method (`config.method`, see encoderx/methods/base.py). The train step is a single jitted
function with explicit in/out shardings and the state donated (pjit semantics). The
method's `prepare` (masking) runs inside it, keyed by fold_in(run key, step), so what a
step computes does not depend on how many devices run it or on restarts.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import time
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec

from encoderx import errors
from encoderx import checkpoint as checkpoint_lib
from encoderx import config as config_lib
from encoderx.methods import base as method_lib
from encoderx.methods import registry as method_registry
from encoderx import optim, sharding


@flax.struct.dataclass
class TrainState:
  step: jax.Array  # int32 scalar: train steps done
  params: Any
  opt_state: Any  # {update name: optimizer state}
  rng: jax.Array  # uint32 key data of the run's base key
  method_state: Any  # what the method keeps besides parameters ({} for most)
  # int32 scalars: steps skipped for a non-finite loss or gradient norm, in a row up to
  # now and in all (see Trainer._train_step).
  skipped_in_a_row: jax.Array
  skipped_total: jax.Array


@dataclasses.dataclass(frozen=True)
class StepCost:
  """What XLA says of a compiled step: its FLOPs (matmuls and elementwise, as XLA counts
  them, per device) and memory, and how long compiling it took."""
  flops: float
  bytes_accessed: float
  argument_bytes: int
  output_bytes: int
  temp_bytes: int
  compile_seconds: float
  alias_bytes: int = 0  # outputs written over donated arguments

  @property
  def device_bytes(self) -> int:
    """What the step holds on a device: arguments, temporaries (packed by liveness) and
    outputs not written over donated arguments (XLA's peak_memory_in_bytes is less than
    the temporaries on CPU)."""
    return self.argument_bytes + self.temp_bytes + self.output_bytes - self.alias_bytes

  @classmethod
  def of(cls, compiled, compile_seconds: float) -> "StepCost":
    cost = compiled.cost_analysis() or {}
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost  # one per device, older
    memory = compiled.memory_analysis()
    size = lambda name: int(getattr(memory, name, 0) or 0)
    return cls(flops=float(cost.get("flops", 0.0)),
               bytes_accessed=float(cost.get("bytes accessed", 0.0)),
               argument_bytes=size("argument_size_in_bytes"),
               output_bytes=size("output_size_in_bytes"),
               temp_bytes=size("temp_size_in_bytes"), compile_seconds=compile_seconds,
               alias_bytes=size("alias_size_in_bytes"))

  def describe(self, arguments: str = "state, batch") -> str:
    mb = lambda n: f"{n / 2**20:,.0f} MB"
    donated = " (the state's donated)" if self.alias_bytes else ""
    return (f"compiled in {self.compile_seconds:.1f} s: {self.flops / 1e9:,.1f} GFLOP and "
            f"{self.bytes_accessed / 1e9:,.1f} GB accessed per step and device; memory "
            f"{mb(self.argument_bytes)} in ({arguments}), {mb(self.temp_bytes)} "
            f"temporaries, {mb(self.output_bytes)} out{donated}: "
            f"{mb(self.device_bytes)} in all")


class NonFiniteError(errors.UserError, RuntimeError):
  """Training produced non-finite values for longer than the run allows."""


@dataclasses.dataclass(frozen=True)
class Phase:
  """A stretch of steps at one sequence length and one global batch size: one compiled
  train step. BERT's recipe has two lengths (90% of the steps at 128, then 512: `long`);
  a batch-size warmup (train.batch_size_schedule) splits them further. Phases of one
  length read one data stream (`stream`), which continues from one to the next."""
  index: int
  start: int
  end: int
  seq_length: int
  batch_size: int = 0  # global, per optimizer update
  long: bool = False  # rows of train.long_seq_length (the last train.long_fraction of steps)

  @property
  def stream(self) -> int:
    """The data stream the phase reads (0: data.seq_length, 1: train.long_seq_length)."""
    return int(self.long)


def batch_size_at(config, step: int) -> int:
  """The global batch size of train step `step` (train.batch_size_schedule, then
  train.batch_size)."""
  for end, size in config.train.batch_size_schedule:
    if step < end:
      return int(size)
  return config.train.batch_size


def phases(config) -> tuple[Phase, ...]:
  train = config.train
  switch = (int(round(train.steps * (1.0 - train.long_fraction))) if train.long_fraction
            else train.steps)
  ends = sorted({switch, train.steps} | {int(end) for end, _ in train.batch_size_schedule
                                         if 0 < int(end) < train.steps} - {0})
  result = []
  for start, end in zip([0] + ends, ends):
    long = start >= switch
    result.append(Phase(len(result), start, end,
                        train.long_seq_length if long else config.data.seq_length,
                        batch_size_at(config, start), long))
  return tuple(result)


def stream_unit(phases_: tuple[Phase, ...], stream: int) -> int:
  """The global batch that a data stream is read in: the greatest common divisor of its
  phases' batch sizes; a step of a phase takes batch_size / unit of them, so that the
  stream, and its position in checkpoints, continue across a change of batch size."""
  return math.gcd(*[p.batch_size for p in phases_ if p.stream == stream])


def run_rng(seed: int) -> jax.Array:
  """The run's base key (as uint32 key data) for a seed."""
  return jax.random.key_data(jax.random.fold_in(jax.random.key(seed), 1))


def step_keys(rng: jax.Array, step) -> tuple[jax.Array, jax.Array]:
  """(prepare key, loss key) of a step: functions of the run key and step alone."""
  return tuple(jax.random.split(jax.random.fold_in(jax.random.wrap_key_data(rng), step)))


def _split_micro_batches(tree, count: int):
  """[batch, ...] -> [count, batch / count, ...], micro-batch i = rows i, i+count, ...

  Strided rows keep every micro-batch spread over all data-parallel devices.
  """
  def split(x):
    x = x.reshape((x.shape[0] // count, count) + x.shape[1:]).swapaxes(0, 1)
    spec = PartitionSpec(None, sharding.BATCH_AXES, *([None] * (x.ndim - 2)))
    return jax.lax.with_sharding_constraint(x, spec)
  return jax.tree_util.tree_map(split, tree)


def _join_micro_batches(tree):
  """Inverse of _split_micro_batches: [count, batch / count, ...] -> [batch, ...]."""
  return jax.tree_util.tree_map(
      lambda x: x.swapaxes(0, 1).reshape((-1,) + x.shape[2:]), tree)


def _select(params: dict, groups: tuple[str, ...] | None) -> tuple[dict, dict]:
  """(the parameter groups an update trains, the others)."""
  if groups is None:
    return params, {}
  return ({k: v for k, v in params.items() if k in groups},
          {k: v for k, v in params.items() if k not in groups})


def _cached_per_trainer(method):
  """Caches a method's result per Trainer and arguments, in the Trainer itself.

  Not functools.cache: its cache lives on the class, keeps every Trainer and its
  compiled steps alive for the whole process, and each compiled step holds hundreds of
  memory mappings; a long test process then exceeds the kernel's map count and XLA
  crashes while compiling.
  """
  @functools.wraps(method)
  def cached(self, *args):
    cache = self.__dict__.setdefault("_step_cache", {})
    key = (method.__name__, args)
    if key not in cache:
      cache[key] = method(self, *args)
    return cache[key]
  return cached

class Trainer:
  """Method, mesh, optimizers and jitted steps of one config."""

  def __init__(self, config, devices=None):
    self.config = config_lib.validate(config)
    self.method = method_registry.build(config)
    self.phases = phases(config)
    by_length = {}  # one method per length (the long phase's cap differs), built once
    for p in self.phases:
      if p.long not in by_length:
        by_length[p.long] = self.method.for_phase(p)
    self.methods = {p.index: by_length[p.long] for p in self.phases}
    self.updates = self.method.updates
    self.schedules = {u.name: optim.learning_rate_schedule(config.optimizer, config.train.steps,
                                                           u.learning_rate)
                      for u in self.updates}
    self.optimizers = {u.name: optim.build(config.optimizer, config.train.steps,
                                           u.learning_rate, config.train.ema_decay)
                       for u in self.updates}
    self.mesh = sharding.make_mesh(config.mesh, devices)
    self.axis_rules = sharding.rules_from_config(config.mesh.rules)
    self._check_batch_sizes()
    self.state_shardings, unsplit = self._state_shardings()
    # Only the parameters': their optimizer state follows them and would repeat each.
    self.unsplit_dimensions = [u for u in unsplit if u.path.startswith(".params")]
    for u in self.unsplit_dimensions:
      logging.warning("sharding: %s (its optimizer state too)", u)

  def _check_batch_sizes(self) -> None:
    """Every batch (train, micro-batch, evaluation) splits evenly over the hosts and the
    data-parallel devices: checked before anything is compiled or trained."""
    parallel = sharding.data_parallel_size(self.mesh)
    train, hosts = self.config.train, jax.process_count()
    devices = (f"the {parallel} data-parallel devices (mesh "
               + " x ".join(f"{a}={self.mesh.shape[a]}" for a in sharding.BATCH_AXES) + ")")
    sizes = [("train.batch_size", train.batch_size)]
    if self.config.eval.batch_size:  # 0: a micro-batch's tokens, divisible by construction
      sizes.append(("eval.batch_size", self.config.eval.batch_size))
    sizes += [("train.batch_size_schedule", int(size))
              for _, size in train.batch_size_schedule]
    for field, size in sizes:
      for count, what in ((hosts, f"the {hosts} hosts"), (parallel, devices)):
        if size % count:
          errors.fail(field, f"{size} is not divisible by {what}.",
                          f"Use a multiple of {count}.")
    for phase in self.phases:
      micro = phase.batch_size // train.grad_accum_steps
      if micro % parallel:
        errors.fail("train.grad_accum_steps", f"splits the batch of {phase.batch_size} "
                        f"into micro-batches of {micro}, which is not divisible by "
                        f"{devices}.", f"Use fewer micro-batches, or a batch of "
                        f"{parallel} x {train.grad_accum_steps} x n.")

  def evaluation_batch_size(self, seq_length: int) -> int:
    """The global batch of an evaluation (or prediction) at `seq_length`: eval.batch_size,
    or with 0 (the default) the rows of the largest training micro-batch's tokens at that
    length (at any, where none trains at it), rounded down to the data-parallel devices
    (one row each at least): never more tokens than training holds with its gradients."""
    if self.config.eval.batch_size:
      return self.config.eval.batch_size
    accumulate = self.config.train.grad_accum_steps
    trained = [p for p in self.phases if p.seq_length == seq_length] or self.phases
    tokens = max(p.batch_size // accumulate * p.seq_length for p in trained)
    parallel = sharding.data_parallel_size(self.mesh)
    return max(1, tokens // seq_length // parallel) * parallel

  # --- state ----------------------------------------------------------------------------
  def describe(self) -> dict:
    """What checkpoints must agree on to be resumed by this config: the method and its
    model (never changeable) and, under "training", what the run trains on and toward:
    the method's config sections and the batch size and seed that the data position and
    the per-step keys depend on (fields at their defaults left out)."""
    training = {section: config_lib.changed_fields(self.config, section)
                for section in self.method.config_sections}
    training["train"] = {k: v for k, v in config_lib.changed_fields(self.config, "train")
                         .items() if k in ("batch_size", "seed", "batch_size_schedule")}
    return {"method": self.config.method, **self.method.describe(),
            checkpoint_lib.TRAINING: training}

  def _init_key(self) -> jax.Array:
    return jax.random.fold_in(jax.random.key(self.config.train.seed), 0)

  def _opt_states(self, params):
    return {u.name: self.optimizers[u.name].init(_select(params, u.groups)[0])
            for u in self.updates}

  def _state_shardings(self) -> tuple[TrainState, list[sharding.Unsplit]]:
    boxed = jax.eval_shape(self.method.init, self._init_key())
    param_specs = nn.get_partition_spec(boxed["params"])
    state_specs = nn.get_partition_spec(boxed.get("state", {}))
    params = nn.unbox(boxed["params"])
    opt_state = jax.eval_shape(self._opt_states, params)
    opt_specs = {
        u.name: optax.tree_map_params(
            self.optimizers[u.name], lambda _, spec: spec, opt_state[u.name],
            _select(param_specs, u.groups)[0],
            transform_non_params=lambda _: PartitionSpec(),
            is_leaf=lambda x: isinstance(x, PartitionSpec))
        for u in self.updates}
    counter = jax.ShapeDtypeStruct((), jnp.int32)
    abstract = TrainState(
        step=counter, params=params, opt_state=opt_state,
        rng=jax.ShapeDtypeStruct((2,), jnp.uint32),
        method_state=nn.unbox(boxed.get("state", {})), skipped_in_a_row=counter,
        skipped_total=counter)
    specs = TrainState(step=PartitionSpec(), params=param_specs, opt_state=opt_specs,
                       rng=PartitionSpec(), method_state=state_specs,
                       skipped_in_a_row=PartitionSpec(), skipped_total=PartitionSpec())
    self.abstract_state = abstract
    return sharding.logical_to_shardings(specs, abstract, self.mesh, self.axis_rules)

  def weights(self, state: TrainState):
    """The run's weights: its parameters, or with train.ema_decay their moving average
    (kept by each update's optimizer, optim.with_ema), which evaluations, the best
    checkpoint, predictions, export and --init_from use."""
    if not self.config.train.ema_decay:
      return state.params
    params = dict(state.params)
    for update in self.updates:
      params.update(state.opt_state[update.name].ema)
    return params

  def abstract_state_with_shardings(self) -> TrainState:
    """ShapeDtypeStructs carrying shardings: what orbax restores into."""
    return jax.tree_util.tree_map(
        lambda leaf, s: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=s),
        self.abstract_state, self.state_shardings)

  def init_params(self):
    """Freshly initialized parameters, sharded as in the train state."""
    with self._context():
      return jax.jit(lambda: nn.unbox(self.method.init(self._init_key())["params"]),
                     out_shardings=self.state_shardings.params)()

  def init_state(self, params=None) -> TrainState:
    """A fresh state created sharded; `params` (e.g. converted weights) replace init."""
    seed = self.config.train.seed

    def init(params):
      variables = self.method.init(self._init_key())
      if params is None:
        params = nn.unbox(variables["params"])
      zero = jnp.zeros((), jnp.int32)
      return TrainState(step=zero, params=params, opt_state=self._opt_states(params),
                        rng=run_rng(seed), method_state=nn.unbox(variables.get("state", {})),
                        skipped_in_a_row=zero, skipped_total=zero)

    with self._context():
      if params is None:
        return jax.jit(lambda: init(None), out_shardings=self.state_shardings)()
      return jax.jit(init, out_shardings=self.state_shardings)(params)

  # --- steps ----------------------------------------------------------------------------
  def _context(self):
    """The mesh and logical axis rules that tracing and sharding constraints read."""
    stack = contextlib.ExitStack()
    stack.enter_context(jax.set_mesh(self.mesh))
    stack.enter_context(nn.logical_axis_rules(self.axis_rules))
    return stack

  def process_rows(self, global_size: int) -> slice:
    """The rows of a global batch that this process's devices hold (what
    device_batch places from this process's local batch)."""
    indices = sharding.batch_sharding(self.mesh).addressable_devices_indices_map(
        (global_size,)).values()
    starts = [i[0].start or 0 for i in indices]
    stops = [global_size if i[0].stop is None else i[0].stop for i in indices]
    return slice(min(starts), max(stops))

  def device_batch(self, batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
    """This process's numpy batch -> global arrays split over the data axes."""
    batch_sharding = sharding.batch_sharding(self.mesh)
    return {name: jax.make_array_from_process_local_data(batch_sharding, value)
            for name, value in batch.items()}

  def _loss_and_grads(self, method, update, params, method_state, batch, key,
                      denominators, carry):
    """(loss, LossOutput, gradients of update's groups) over the whole batch, in
    grad_accum_steps micro-batches whose gradients are added."""
    trained, frozen = _select(params, update.groups)

    def loss_fn(trained, state, micro_batch, key, carry):
      return method.loss({**frozen, **trained}, state, micro_batch, key, denominators,
                         update, carry)

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    accumulate = self.config.train.grad_accum_steps
    if accumulate == 1:
      (loss, output), grads = grad_fn(trained, method_state, batch, key, carry)
      return loss, output, grads

    # The method state is split with the batch when it holds a row per example, else
    # threaded through the micro-batches; a carry comes stacked by micro-batch.
    per_example = method.per_example_state
    micro_batches = _split_micro_batches(batch, accumulate)
    micro_states = _split_micro_batches(method_state, accumulate) if per_example else None

    def add_micro_batch(totals, inputs):
      (loss_total, sums_total, grads_total), threaded_state = totals
      index, micro_batch, micro_state, micro_carry = inputs
      state = micro_state if per_example else threaded_state
      (loss, output), grads = grad_fn(trained, state, micro_batch,
                                      jax.random.fold_in(key, index), micro_carry)
      added = jax.tree_util.tree_map(jnp.add, (loss_total, sums_total, grads_total),
                                     (loss, output.sums, grads))
      return ((added, threaded_state if per_example else output.state),
              (output.carry, output.state if per_example else None))

    first = jax.tree_util.tree_map(lambda x: x[0], (micro_batches, micro_states, carry))
    (_, first_output), first_grads = jax.eval_shape(
        grad_fn, trained, first[1] if per_example else method_state, first[0], key, first[2])
    zeros = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype),
                                   ((jax.ShapeDtypeStruct((), jnp.float32),
                                     first_output.sums, first_grads)))
    ((loss, sums, grads), threaded), (carries, states) = jax.lax.scan(
        add_micro_batch, (zeros, method_state),
        (jnp.arange(accumulate), micro_batches, micro_states, carry))
    new_state = _join_micro_batches(states) if per_example else threaded
    return loss, method_lib.LossOutput(sums=sums, state=new_state, carry=carries), grads

  def _train_step(self, method, state: TrainState, batch: dict):
    """One step: every update in order; if any update's loss or gradient norm is not
    finite, the step is skipped: parameters, optimizer states (their update count, so
    the learning rate schedule, included) and method state stay as they were, as with
    optax.apply_if_finite, while the step counter advances, as the data does, and the
    skip is counted. A bad batch or a spike never writes NaN into the state."""
    prepare_key, loss_key = step_keys(state.rng, state.step)
    batch = method.prepare(batch, prepare_key, state.step)
    denominators = method.denominators(batch)
    params, method_state, opt_state = state.params, state.method_state, dict(state.opt_state)
    metrics, sums, carry = {}, {}, None
    finite = jnp.array(True)
    several = len(self.updates) > 1
    for index, update in enumerate(self.updates):
      key = jax.random.fold_in(loss_key, index) if index else loss_key
      loss, output, grads = self._loss_and_grads(method, update, params, method_state,
                                                 batch, key, denominators, carry)
      trained, frozen = _select(params, update.groups)
      changes, opt_state[update.name] = self.optimizers[update.name].update(
          grads, opt_state[update.name], trained)
      params = {**frozen, **optax.apply_updates(trained, changes)}
      method_state, carry, sums = output.state, output.carry, {**sums, **output.sums}
      suffix = f"_{update.name}" if several else ""
      metrics[f"loss{suffix}"] = loss
      metrics[f"grad_norm{suffix}"] = optax.tree.norm(grads)
      # The optimizers count the updates they applied (skipped steps are none).
      metrics[f"learning_rate{suffix}"] = self.schedules[update.name](
          state.step - state.skipped_total)
      finite &= jnp.isfinite(loss) & jnp.isfinite(metrics[f"grad_norm{suffix}"])
    if several:
      metrics["loss"] = sum(metrics[f"loss_{u.name}"] for u in self.updates)
    metrics.update(method.summarize(sums))
    metrics["skipped"] = (~finite).astype(jnp.float32)  # its mean: the fraction skipped
    params, opt_state, method_state = jax.tree_util.tree_map(
        lambda new, old: jnp.where(finite, new, old), (params, opt_state, method_state),
        (state.params, state.opt_state, state.method_state))
    skipped = (~finite).astype(jnp.int32)
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state,
                         method_state=method_state,
                         skipped_in_a_row=(state.skipped_in_a_row + 1) * skipped,
                         skipped_total=state.skipped_total + skipped), metrics

  @functools.cached_property
  def _all_finite(self):
    def all_finite(state):
      leaves = [x for x in jax.tree_util.tree_leaves(state)
                if jnp.issubdtype(x.dtype, jnp.inexact)]
      return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))
    return jax.jit(all_finite, out_shardings=sharding.replicated(self.mesh))

  def state_is_finite(self, state: TrainState) -> bool:
    """Whether every float of the state is finite (checked before each save)."""
    with self._context():
      return bool(self._all_finite(state))

  @_cached_per_trainer
  def train_step(self, phase_index: int = 0):
    """jit(state, batch) -> (state, metrics) for a phase; the state is donated."""
    step = jax.jit(functools.partial(self._train_step, self.methods[phase_index]),
                   in_shardings=(self.state_shardings, sharding.batch_sharding(self.mesh)),
                   out_shardings=(self.state_shardings, sharding.replicated(self.mesh)),
                   donate_argnums=(0,))
    return self._in_context(step)

  def compile_train_step(self, state: TrainState, batch: dict[str, jax.Array],
                         phase_index: int = 0):
    """(the phase's train step compiled ahead of time for `state` and `batch`'s shapes,
    its StepCost). It computes what `train_step(phase_index)` computes; a batch of other
    shapes is an error instead of a recompilation."""
    return self._compiled(self.train_step(phase_index), state, batch)

  def _compiled(self, step, *args):
    """(a jitted `step` compiled ahead of time for `args`' shapes, its StepCost)."""
    start = time.perf_counter()
    with self._context():
      compiled = step.__wrapped__.lower(*args).compile()
    return self._in_context(compiled), StepCost.of(compiled, time.perf_counter() - start)

  def prepared_batch(self, batch: dict, step: int, phase_index: int = 0) -> dict:
    """The batch as the train step of `step` sees it (e.g. masked, with targets), on host.

    For looking at what the model is trained on; uses the run key of the config's seed.
    """
    prepare_key, _ = step_keys(run_rng(self.config.train.seed), step)
    prepared = self._prepare(phase_index)(
        {k: jnp.asarray(v) for k, v in batch.items()}, prepare_key, jnp.int32(step))
    return jax.device_get(prepared)

  @_cached_per_trainer
  def _prepare(self, phase_index: int):
    """The phase's method.prepare, jitted once (prepared_batch is called step by step)."""
    return jax.jit(self.methods[phase_index].prepare)

  @_cached_per_trainer
  def evaluate_step(self, phase_index: int = 0):
    """jit(params, method_state, batch, key) -> the method's evaluation outputs."""
    evaluate = jax.jit(self.methods[phase_index].evaluate,
                       in_shardings=(self.state_shardings.params,
                                     self.state_shardings.method_state,
                                     sharding.batch_sharding(self.mesh),
                                     sharding.replicated(self.mesh)),
                       out_shardings=sharding.replicated(self.mesh))
    return self._in_context(evaluate)

  def compile_evaluate_step(self, params, method_state, batch: dict[str, jax.Array],
                            key: jax.Array, phase_index: int = 0):
    """(the phase's evaluation step compiled ahead of time for these arguments' shapes,
    its StepCost): what `evaluate_step(phase_index)` then runs for batches of these
    shapes, without compiling again."""
    return self._compiled(self.evaluate_step(phase_index), params, method_state, batch, key)

  @_cached_per_trainer
  def predict_step(self):
    """jit(params, method_state, batch) -> the method's per-example predictions."""
    predict = jax.jit(self.methods[self.phases[-1].index].predict,
                      in_shardings=(self.state_shardings.params,
                                    self.state_shardings.method_state,
                                    sharding.batch_sharding(self.mesh)),
                      out_shardings=sharding.replicated(self.mesh))
    return self._in_context(predict)

  def _in_context(self, function):
    @functools.wraps(function)
    def call(*args):
      with self._context():
        return function(*args)
    return call

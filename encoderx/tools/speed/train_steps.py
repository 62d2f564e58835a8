"""The bench's train steps: encoderx's jitted step and its PyTorch counterpart (the
method's adapter, torch_adapters.py) on the same batches, timed side by side; the row of
figures of each model; and the training loop's own speed."""
from __future__ import annotations

import dataclasses
import statistics

import jax

from encoderx.train import trainer as trainer_lib
from encoderx.data import buckets
from encoderx.tools.speed import bench_models
from encoderx.tools.speed.timing import (StepTiming, Stepper, WARMUP_STEPS, describe_timing,
                                         paired_ratios, paired_summary, time_interleaved,
                                         time_steps)


def encoderx_stepper(config, batches: list[dict]):
  """(its Stepper, its Trainer: its method's model configs are the sizes PyTorch must
  match, and its prepared_batch what PyTorch is fed; the first batch's compiled step's
  StepCost). Batches of several shapes (length
  buckets) get a step compiled for each, before any runs: the cost's compile_seconds
  is their sum."""
  trainer = trainer_lib.Trainer(config, devices=jax.devices()[:1])
  state = trainer.init_state()
  train_steps, costs = {}, []
  for batch in batches:
    if buckets.shapes(batch) not in train_steps:
      train_steps[buckets.shapes(batch)], cost = trainer.compile_train_step(
          state, trainer.device_batch(batch))
      costs.append(cost)

  def run_step(index):
    nonlocal state
    batch = batches[index % len(batches)]
    state, metrics = train_steps[buckets.shapes(batch)](state, trainer.device_batch(batch))
    jax.block_until_ready(metrics)

  num_params = sum(x.size for x in jax.tree_util.tree_leaves(state.params))
  cost = dataclasses.replace(costs[0], compile_seconds=sum(c.compile_seconds for c in costs))
  return Stepper(run_step, num_params), trainer, cost


def prepared_batches(trainer, batches: list[dict]) -> list[dict]:
  """Each batch as the train step of step = the batch's index sees it
  (`Trainer.prepared_batch`: the run's masks at the training rate, XLNet's targets and
  orders), on the host: what PyTorch is fed. (Without the step, `prepare` masks at the
  evaluation's rate: ModernBERT's 15%, not its 30%, where Hugging Face's sparse
  prediction would score half the positions encoderx's head does.)"""
  return [trainer.prepared_batch(batch, step) for step, batch in enumerate(batches)]


def torch_stepper(trainer, batches: list[dict], device: str = "cpu") -> Stepper:
  """The method's PyTorch counterpart (torch_adapters.adapter, not strict: the same work
  on every row) at its sizes, freshly initialized, in train mode (dropout on): forward
  with its loss, backward, AdamW's step (torch_optim.adamw), zero_grad; fed the batches
  as encoderx's train step sees them (prepared_batches, on the host before timing). On `device`
  "cuda": the model and inputs there, bf16 autocast, SDPA attention (transformers'
  default), each step synchronized. Raises torch_adapters.NoAdapterError where the
  method has no counterpart."""
  import torch  # pylint: disable=g-import-not-at-top
  from encoderx.tools.parity import torch_adapters, torch_optim  # pylint: disable=g-import-not-at-top
  torch.manual_seed(0)
  adapter = torch_adapters.adapter(trainer.method, strict=False)
  model = adapter.model.train().to(device)
  optimizer = torch_optim.adamw(trainer.config.optimizer, model.parameters())
  inputs = [adapter.inputs(prepared).to(device)
            for prepared in prepared_batches(trainer, batches)]
  autocast = torch.autocast("cuda", torch.bfloat16, enabled=device == "cuda")

  def run_step(index):
    with autocast:
      loss = adapter.loss(inputs[index % len(inputs)])
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    if device == "cuda":
      torch.cuda.synchronize()

  return Stepper(run_step, adapter.num_params)


def torch_refusal(method) -> str | None:
  """Why `method` has no PyTorch counterpart (None: it has one)."""
  from encoderx.tools.parity import torch_adapters  # pylint: disable=g-import-not-at-top
  try:
    torch_adapters.adapter_class(method)
  except torch_adapters.NoAdapterError as error:
    return str(error)
  return None


def torch_scores_every_position(method) -> bool:
  """Whether `method`'s PyTorch counterpart scores every position against the vocabulary
  (Hugging Face's MLM heads) or, as encoderx's head, the masked ones only (ModernBERT's
  sparse prediction): the work its MFU counts."""
  from encoderx.tools.parity import torch_adapters  # pylint: disable=g-import-not-at-top
  return torch_adapters.adapter_class(method).scores_every_position(method)


@dataclasses.dataclass
class ModelFigures:
  """One model's measurements: encoderx's step (and its compiled cost), PyTorch's, and
  the model FLOPs per token each framework does (flops.py)."""
  name: str
  batch_size: int
  seq_length: int
  jax_timing: StepTiming
  cost: trainer_lib.StepCost
  flops_per_token: float
  torch_timing: StepTiming | None = None
  torch_flops_per_token: float = 0.0
  interleaved: bool = False

  @property
  def tokens_per_step(self) -> int:
    return self.batch_size * self.seq_length

  def paired_ratios(self) -> list[float]:
    """encoderx's speed over PyTorch's for each pair of steps timed side by side."""
    return paired_ratios(self.jax_timing.times, self.torch_timing.times)


def measure_model(name: str, config, batches: list[dict], steps: int,
                  torch_device: str | None = "cpu", warmup: int = WARMUP_STEPS
                  ) -> ModelFigures:
  """Times encoderx's step, and PyTorch's on `torch_device` (None: not) where the method
  has a PyTorch counterpart: interleaved with encoderx's on CPU, after it on an
  accelerator (see bench.py's module doc)."""
  jax_stepper, trainer, cost = encoderx_stepper(config, batches)
  method = trainer.method
  refusal = torch_refusal(method) if torch_device else None
  if refusal:
    print(f"  pytorch   none: {refusal}", flush=True)
  with_torch = bool(torch_device) and refusal is None
  interleave = with_torch and torch_device == "cpu"
  if interleave:
    torch_step = torch_stepper(trainer, batches, torch_device)
    jax_times, torch_times = time_interleaved(
        [jax_stepper.run_step, torch_step.run_step], warmup, steps)
  else:
    jax_times = time_steps(jax_stepper.run_step, warmup, steps)
  jax_timing = StepTiming(jax_times, cost.compile_seconds, jax_stepper.num_params)
  figures = ModelFigures(name, config.train.batch_size, config.data.seq_length,
                         jax_timing, cost, bench_models.model_flops_per_token(config, method),
                         interleaved=interleave)
  print(describe_timing("encoderx", jax_timing, figures.tokens_per_step), flush=True)
  if with_torch:
    if not interleave:
      torch_step = torch_stepper(trainer, batches, torch_device)
      torch_times = time_steps(torch_step.run_step, warmup, steps)
    figures.torch_timing = StepTiming(torch_times, num_params=torch_step.num_params)
    figures.torch_flops_per_token = bench_models.model_flops_per_token(
        config, method, scores_every_position=torch_scores_every_position(method))
    print(describe_timing("pytorch", figures.torch_timing, figures.tokens_per_step),
          flush=True)
    if interleave:
      ratios = figures.paired_ratios()
      print(f"  encoderx / pytorch, step by step: median {statistics.median(ratios):.2f}x "
            f"({min(ratios):.2f}x .. {max(ratios):.2f}x over {len(ratios)} pairs)",
            flush=True)
  return figures


def model_row(figures: ModelFigures, peak: float, pipeline_rate: float | None) -> dict:
  """The figures of a model as numbers (report.TABLES['train_steps'] shows them):
  milliseconds, tokens/s, MFU and ratios as fractions; torch's None without PyTorch."""
  tokens = figures.tokens_per_step
  jax_tokens = figures.jax_timing.per_second(tokens)
  row = {"model": figures.name, "batch_size": figures.batch_size,
         "seq_length": figures.seq_length, "steps": len(figures.jax_timing.times),
         "params": figures.jax_timing.num_params,
         "compile_seconds": figures.jax_timing.compile_seconds,
         "jax_ms": figures.jax_timing.mean * 1e3, "jax_ms_sd": figures.jax_timing.stdev * 1e3,
         "jax_tokens_per_second": jax_tokens,
         "mflop_per_token": figures.flops_per_token / 1e6,
         "xla_mflop_per_token": figures.cost.flops / tokens / 1e6,
         "mfu": figures.flops_per_token * jax_tokens / peak,
         "torch_ms": None, "torch_tokens_per_second": None, "torch_mfu": None,
         "jax_over_torch": None}
  if figures.torch_timing:
    torch_tokens = figures.torch_timing.per_second(tokens)
    row.update({"torch_params": figures.torch_timing.num_params,
                "torch_ms": figures.torch_timing.mean * 1e3,
                "torch_ms_sd": figures.torch_timing.stdev * 1e3,
                "torch_tokens_per_second": torch_tokens,
                "torch_mflop_per_token": figures.torch_flops_per_token / 1e6,
                "torch_mfu": figures.torch_flops_per_token * torch_tokens / peak,
                "jax_over_torch": jax_tokens / torch_tokens})
    if figures.interleaved:
      row.update(paired_summary(figures.paired_ratios()))
  if pipeline_rate is not None:
    step_examples = figures.jax_timing.per_second(figures.batch_size)
    row.update({"pipeline_examples_per_second": pipeline_rate,
                "step_examples_per_second": step_examples,
                "pipeline_headroom": pipeline_rate / step_examples})
  return row


def loop_tokens_per_second(config, steps: int) -> float:
  """tokens/s that `encoderx.train` itself logs over `steps` steps of `config` on one
  device, as the bench's step runs (the mean of its log intervals after the first,
  which includes compilation)."""
  import tempfile  # pylint: disable=g-import-not-at-top
  from encoderx import train  # pylint: disable=g-import-not-at-top
  config = config.copy_and_resolve_references()
  config.train.steps = steps
  config.optimizer.warmup_steps = min(config.optimizer.warmup_steps, steps // 2)
  config.train.log_every = max(1, steps // 6)
  config.checkpoint.every_steps = steps
  config.eval.every_steps, config.eval.batches = 0, 1
  with tempfile.TemporaryDirectory() as workdir:
    history = train.run(config, workdir, devices=jax.devices()[:1])["history"]
  speeds = [h["tokens_per_second"] for h in history if "tokens_per_second" in h]
  if not speeds:
    raise ValueError(f"{steps} steps gave no timed log interval; give more")
  return statistics.fmean(speeds)

"""What a design choice costs, timed by the bench: DeBERTa's disentangled attention
against BERT's (--attention_cost), and contraction.py's kernel gradients against jax's
order (--kernel_gradient_cost)."""
from __future__ import annotations

import dataclasses
import statistics
import time

import jax
import numpy as np

from encoderx.methods import pretrain
from encoderx.models import contraction, pretraining
from encoderx.models import model_config as model_config_lib
from encoderx.tools.speed import bench_models, train_steps
from encoderx.tools.speed.timing import (StepTiming, WARMUP_STEPS, describe_timing,
                                         paired_ratios, paired_summary, time_interleaved,
                                         time_steps)

ATTENTION_LENGTHS = (128, 512)


# --- attention cost ---------------------------------------------------------------------
def attention_variants(model: model_config_lib.ModelConfig
                       ) -> dict[str, model_config_lib.ModelConfig]:
  """BERT's attention (absolute positions) and DeBERTa v2/v3's disentangled attention
  (relative positions only), otherwise the same model."""
  longest = max(ATTENTION_LENGTHS)
  return {
      "standard": model.replace(
          attention=dict(variant="standard"), heads=dict(enhanced_mask_decoder=False),
          embeddings=dict(position="absolute", position_offset=0, max_positions=longest)),
      "disentangled": model.replace(
          attention=dict(variant="disentangled", relative_terms=("c2p", "p2c"),
                         share_att_key=True, position_buckets=256,
                         max_relative_positions=512),
          embeddings=dict(position="none", max_positions=longest),
          heads=dict(enhanced_mask_decoder=False))}


def bench_encoder(model_config: model_config_lib.ModelConfig, batch_size: int, length: int,
                  steps: int) -> StepTiming:
  """The jitted gradient of the encoder's mean squared output: [batch, length] rows of
  random tokens, one sequence each, dropout on."""
  model = pretraining.EncoderModel(model_config, with_pooler=False)
  rng = np.random.default_rng(0)
  batch = {"input_ids": rng.integers(5, model_config.vocab_size, (batch_size, length)),
           "token_type_ids": np.zeros((batch_size, length)),
           "segment_ids": np.ones((batch_size, length)),
           "positions": np.broadcast_to(np.arange(length), (batch_size, length))}
  batch = {k: jax.numpy.asarray(v, jax.numpy.int32) for k, v in batch.items()}
  params = jax.jit(lambda key: model.init(key, pretraining.init_batch(1, 8)))(
      jax.random.key(0))["params"]

  @jax.jit
  def gradient(params, key):
    def loss(params):
      hidden = model.apply({"params": params}, batch, deterministic=False,
                           rngs={"dropout": key})["hidden"]
      return jax.numpy.mean(jax.numpy.square(hidden.astype(jax.numpy.float32)))
    return jax.grad(loss)(params)

  def run_step(index):
    jax.block_until_ready(gradient(params, jax.random.key(index)))

  start = time.perf_counter()
  run_step(0)
  compile_seconds = time.perf_counter() - start
  times = time_steps(lambda i: run_step(i + 1), WARMUP_STEPS, steps)
  return StepTiming(times, compile_seconds, pretraining.count_params(params))


def attention_cost(args) -> list[dict]:
  """For each model of args.models and each of ATTENTION_LENGTHS, the two attentions'
  mean step time (ms) and their ratio, as numbers."""
  rows = []
  for model_name in args.models:
    config = bench_models.build_config(model_name, args.batch_size)
    model_config = model_config_lib.ModelConfig.from_config(
        config.model, pretrain.build_vocabulary(config.data.vocab).vocab_size)
    for length in ATTENTION_LENGTHS:
      timings = {name: bench_encoder(variant, args.batch_size, length, args.steps)
                 for name, variant in attention_variants(model_config).items()}
      for name, timing in timings.items():
        print(describe_timing(f"{model_name} {name} @{length}", timing,
                              args.batch_size * length), flush=True)
      standard, relative = timings["standard"].mean, timings["disentangled"].mean
      rows.append({"model": f"{model_name} ({model_config.num_layers} x "
                            f"{model_config.hidden_size})",
                   "length": length, "batch": args.batch_size,
                   "standard_ms": standard * 1e3, "disentangled_ms": relative * 1e3,
                   "disentangled_over_standard": relative / standard})
  return rows


# --- kernel gradients -------------------------------------------------------------------
def kernel_gradient_row(name: str, config, batches: list[dict], steps: int,
                        warmup: int = WARMUP_STEPS) -> dict:
  """`config`'s train step with contraction's kernel gradients against jax's order on
  `batches`: the median step times (ms) and the ratio of each pair of interleaved steps."""
  contracted, _, _ = train_steps.encoderx_stepper(config, batches)
  with contraction.jax_order():
    jax_ordered, _, _ = train_steps.encoderx_stepper(config, batches)
  ours, theirs = time_interleaved([contracted.run_step, jax_ordered.run_step], warmup,
                                  steps)
  tokens = config.train.batch_size * config.data.seq_length
  for kind, times in (("contract", ours), ("jax order", theirs)):
    print(describe_timing(f"{name} {kind}",
                          StepTiming(times, num_params=contracted.num_params), tokens),
          flush=True)
  return {"model": name, "steps": steps, "contract_ms": statistics.median(ours) * 1e3,
          "jax_order_ms": statistics.median(theirs) * 1e3,
          **paired_summary(paired_ratios(ours, theirs))}


def kernel_gradient_cost(args) -> list[dict]:
  """kernel_gradient_row of each model of --models at the bench's length."""
  rows = []
  for model_name in args.models:
    config = bench_models.build_config(model_name, args.batch_size)
    _, _, batches = bench_models.measure_pipeline(config, 1 + WARMUP_STEPS + args.steps)
    rows.append(kernel_gradient_row(model_name, config, batches, args.steps))
  return rows

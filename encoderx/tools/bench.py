"""Throughput of encoderx pretraining on this machine, against Hugging Face PyTorch.

    python -m encoderx.tools.bench [--batch_size=32] [--steps=10] \
        [--models=bert_tiny,bert_small,roberta_tiny,albert_tiny,spanbert_tiny,deberta_tiny,
                  electra_tiny,electra_small,bert_electra_small,xlnet_tiny] [--skip_torch]
    python -m encoderx.tools.bench --attention_cost [--models=bert_small] [--batch_size=8]
    python -m encoderx.tools.bench --kernel_gradient_cost [--models=bert_small]
    python -m encoderx.tools.bench --models=bert_mini --train_loop_steps=60
    python -m encoderx.tools.bench --device=gpu   # or tpu: BERT-base/large at 128 and 512, bf16

For each model, at sequence length 128 (its tiny config's data settings):

- encoderx: the jitted train step (`Trainer.train_step`: masking, forward, loss,
  backward, the config's optimizer with clipping: AdamW, LAMB for ALBERT) on real
  batches of the bundled corpus. Compilation (the first call) is timed apart; then
  WARMUP_STEPS untimed steps; then the mean of --steps timed steps, each one
  `device_batch` + step + `block_until_ready`.
- PyTorch: `transformers.BertForPreTraining`, `RobertaForMaskedLM`,
  `AlbertForPreTraining` or `DebertaV2ForMaskedLM` of the same sizes and vocabulary
  (DeBERTa's without the enhanced mask decoder, which Hugging Face lacks: encoderx's
  re-runs the last layer twice for the masked positions), in train mode (dropout on),
  on the same batches: forward with `labels` (15% of the real tokens, -100 elsewhere,
  drawn on the host before timing) and the sentence label (`next_sentence_label`,
  `sentence_order_label`) where the family has one; backward, `AdamW.step()` (PyTorch
  has no LAMB), `zero_grad()`. Same warm-up and timed steps.
- tokens/s = batch * 128 / mean step time; the ratio is encoderx / PyTorch. On CPU
  the two frameworks' timed steps are interleaved (one encoderx step, one PyTorch step,
  the first of each pair alternating; never concurrently), so that a change in the
  machine's speed during the run (a shared host, frequency scaling) reaches both
  alike; the line of each model also gives the ratio of each pair of steps (median and
  range). On GPU they run one after the other (each framework holds its own memory).
- MFU: model FLOPs per token (encoderx/tools/flops.py, from the config: 6 x the layers'
  matmul parameters + attention scores + the MLM head on what each framework scores)
  x tokens/s, over the machine's peak: the best of a few large float32 matmuls
  (PEAK_MATMUL_SIZE square) timed in the same run. "XLA MFLOP/tok" is XLA's own count of
  the compiled step (cost analysis: every op, elementwise included), a cross-check.
- --train_loop_steps=N: also runs `encoderx.train` itself (the training loop: input
  pipeline, progress bar, metrics, TensorBoard, a checkpoint at the end) for N steps of
  each model and prints the loop's own tokens/s (its logged intervals after the first,
  which includes compilation) beside the bench step's; their ratio shows what the loop
  costs.
- --device=gpu|tpu: BERT-base and BERT-large (BERT_ACCELERATOR_SIZES) at --lengths (128
  and 512) in bfloat16 (float32 parameters), the same train step, each with the config's
  attention dropout and without it, ACCELERATOR_WARMUP_STEPS untimed steps, MFU against
  the device's published dense bf16 peak (PUBLISHED_PEAKS), and on GPU Hugging Face
  PyTorch (SDPA attention, bf16 autocast, the same dropouts) beside it. On GPU the
  default model.attention_kernel="auto" computes attention with dropout in one Pallas
  kernel (encoderx/models/flash_attention.py) and without it in cuDNN's;
  --attention_kernels=xla,auto adds rows of XLA's attention, which writes the dropped
  probabilities out. launch/gpu_bench.py runs these rows on a GPU host without the text
  stack.
- electra_tiny (method 'electra': the generator's MLM, sampling, the discriminator's
  replaced-token detection): PyTorch runs `ElectraForMaskedLM` (the generator) and
  `ElectraForPreTraining` (the discriminator) sharing one embeddings module: the
  generator's MLM loss on its input (15% of the real tokens chosen on the host, 85% of
  them [MASK], the rest kept), a sample at each chosen position from its softmax (no
  gradient), the discriminator's loss on the sampled batch, loss = MLM + 50 x BCE; one
  backward and one AdamW step over both models.
- xlnet_tiny (method 'xlnet': permutation LM, two streams, a memory of 96 tokens per
  layer, rows of XLNet's streams): the step includes `prepare` (targets, orders and
  masks on device). PyTorch: `XLNetLMHeadModel` with mem_len / reuse_len / bi_data as
  the config's, fed the same rows' `perm_mask`, `target_mapping` and labels (made by
  encoderx's `prepare` on the host before timing) and its own `mems` of the step
  before; the loss is its cross-entropy over the same predictions.
- spanbert_tiny (span masking, MLM + SBO heads, single-segment rows) has no PyTorch
  column: Hugging Face has no SpanBERT pretraining class (no SBO head).
- --attention_cost: instead of the above, the cost of DeBERTa's disentangled attention
  against BERT's at the same sizes (each model of --models) and lengths 128 and 512:
  the jitted forward + backward of the encoder alone (embeddings and layers, dropout
  on, full rows), BERT's attention with absolute positions against the disentangled
  one with relative positions only (c2p and p2c, share_att_key, 256 log buckets up to
  512: DeBERTa v2/v3), and their ratio.
- --kernel_gradient_cost: instead of the above, the train step of each model of
  --models (default bert_small) compiled twice, its layers' kernel gradients formed as
  `encoderx/models/contraction.py` forms them (the smaller of input and output gradient
  transposed) and in jax's own order (`contraction.jax_order`), the two timed
  interleaved, with the step-by-step ratio.
- Padding: the share of padding positions in rows of each example builder
  (sentence_pairs for BERT, RoBERTa's full_sentences and doc_sentences) on the bundled
  corpus, at lengths 128 and 512.
- Pipeline headroom: examples/s of `pipeline.BatchIterator` over the bundled corpus
  Task (batches pulled back to back after the first, which fills the shuffle buffer),
  divided by the examples/s the train step consumes (batch / step time). Above 1 the
  input pipeline keeps up. The pipeline depends on the data config only (vocabulary,
  example builder), so it is measured once per data config, before any model runs,
  and its batches are shared by the models that read it.

The two frameworks do not do identical work: encoderx runs the MLM head on the
gathered masked positions only (config.objective.mlm.max_predictions of them per row)
and clips gradients, while the Hugging Face models score every position against the
whole vocabulary (and do not isolate the documents of a packed RoBERTa row, which costs
the same). Both are what each framework does for pretraining by default.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import itertools
import os
import statistics
import time
from typing import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# PyTorch runs beside jax on a GPU: jax must not reserve 75% of its memory up front.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # pylint: disable=g-import-not-at-top
import numpy as np
from absl import logging as absl_logging

from encoderx import config as config_lib
from encoderx.tools import flops as flops_lib
from encoderx import host_allocator
from encoderx.methods import registry as method_registry
from encoderx import trainer as trainer_lib
from encoderx.export import hf
from encoderx import configs
from encoderx.data import packing, pipeline, tasks
from encoderx.models import common, contraction, pretraining

SEQ_LENGTH = 128
PEAK_MATMUL_SIZE = 2048  # the square f32 matmul whose speed is the machine's peak
WARMUP_STEPS = 2  # untimed steps after compilation (allocator, caches, thread pools)
# On GPU PyTorch's first steps after these are still slow (cuBLAS and SDPA pick their
# kernels): a BERT-base step's spread was 293 ms about a 29 ms minimum with 2.
ACCELERATOR_WARMUP_STEPS = 5
PIPELINE_MIN_BATCHES = 40  # timed pipeline batches; more if the train steps need more
MLM_RATE = 0.15

# Model name -> (Hugging Face family or None, its tiny config, the model fields it changes).
MODELS = {
    "bert_tiny": ("bert", "bert:tiny", {}),
    "bert_small": ("bert", "bert:tiny", dict(num_layers=4, hidden_size=512, num_heads=8,
                                           intermediate_size=2048)),
    # BERT-Mini's sizes (4 x 256): the model of the 600-step real-run comparison.
    "bert_mini": ("bert", "bert:tiny", dict(num_layers=4, hidden_size=256, num_heads=4,
                                          intermediate_size=1024)),
    "roberta_tiny": ("roberta", "roberta:tiny", {}),
    "albert_tiny": ("albert", "albert:tiny", {}),
    "spanbert_tiny": (None, "spanbert:tiny", {}),
    "deberta_tiny": ("deberta-v2", "deberta:tiny", {}),
    "electra_tiny": ("electra", "electra:tiny", {}),
    # ELECTRA-Small's sizes (12 x 256, 4 heads, FFN 1024; embeddings 128 wide) on the
    # bundled vocabulary, and a BERT of the same sizes (the paper's BERT-Small; Hugging
    # Face's BERT has no narrower embeddings): what replaced-token detection costs.
    "electra_small": ("electra", "electra:tiny", dict(num_layers=12, hidden_size=256,
                                                    num_heads=4, intermediate_size=1024,
                                                    embedding_size=128)),
    "bert_electra_small": ("bert", "bert:tiny", dict(num_layers=12, hidden_size=256,
                                                   num_heads=4, intermediate_size=1024)),
    "xlnet_tiny": ("xlnet", "xlnet:tiny", {}),
}
ATTENTION_LENGTHS = (128, 512)
# --device=gpu|tpu: the paper's BERT-base and BERT-large, on the bundled vocabulary.
BERT_ACCELERATOR_SIZES = {
    "bert_base": dict(num_layers=12, hidden_size=768, num_heads=12, intermediate_size=3072),
    "bert_large": dict(num_layers=24, hidden_size=1024, num_heads=16,
                       intermediate_size=4096)}
ACCELERATOR_LENGTHS = (128, 512)
# --device=gpu|tpu times each row with the config's attention dropout and without it:
# jax has no fused attention with a usable dropout (encoderx/models/attention.py), so
# only the second runs cuDNN's flash attention on GPU.
ACCELERATOR_ATTENTION_DROPOUTS = (None, 0.0)  # None: the config's
# Dense bf16 peak FLOP/s per device, as published, by a substring of jax's device_kind.
PUBLISHED_PEAKS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L4": 121e12,
                   "TPU v4": 275e12, "TPU v5 lite": 197e12, "TPU v5e": 197e12,
                   "TPU v5p": 459e12, "TPU v5": 459e12, "TPU v6": 918e12}


@dataclasses.dataclass
class StepTiming:
  """Mean and spread of timed steps, in seconds."""
  times: list[float]
  compile_seconds: float | None = None
  num_params: int = 0

  @property
  def mean(self) -> float:
    return statistics.fmean(self.times)

  @property
  def stdev(self) -> float:
    return statistics.stdev(self.times) if len(self.times) > 1 else 0.0

  def per_second(self, per_step: int) -> float:
    return per_step / self.mean


def build_config(model_name: str, batch_size: int, seq_length: int = SEQ_LENGTH):
  _, spec, model_fields = MODELS[model_name]
  config = configs.get(spec)
  for field, value in model_fields.items():
    config.model[field] = value
  config.data.seq_length = seq_length
  config.model.max_position_embeddings = max(config.model.max_position_embeddings,
                                             seq_length)
  config.train.batch_size = batch_size
  return config


def measure_matmul_peak(dtype=np.float32, size: int = PEAK_MATMUL_SIZE,
                        repeats: int = 5) -> float:
  """FLOP/s of the best of `repeats` [size, size] @ [size, size] matmuls on device 0."""
  matmul = jax.jit(lambda a, b: a @ b)
  a = jax.numpy.ones((size, size), dtype)
  jax.block_until_ready(matmul(a, a))
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(matmul(a, a))
    best = min(best, time.perf_counter() - start)
  return 2 * size**3 / best


def model_flops_per_token(config, method, scores_every_position: bool = False) -> float:
  """The step's model FLOPs per token (encoderx/tools/flops.py) for the method's sizes: the
  MLM head on the config's predictions per row, or on every position (Hugging Face's
  MLM heads); XLNet's on its predictions either way (its target mapping)."""
  seq_length = config.data.seq_length
  if config.method == "xlnet":
    predictions = config.objective.plm.num_predict
  else:
    predictions = seq_length if scores_every_position else (
        config.objective.mlm.max_predictions)
  return flops_lib.training_flops_per_token(
      method.model_config, seq_length, predictions,
      getattr(method, "generator_config", None),
      span_boundary="sbo" in config.objective.names)


def paired_ratios(times: list[float], other_times: list[float]) -> list[float]:
  """How many times faster the first is, for each pair of steps `time_interleaved` timed
  in the same round: other_times[i] / times[i]."""
  return [other / time_ for time_, other in zip(times, other_times)]


def time_steps(step: Callable[[int], None], warmup: int, steps: int) -> list[float]:
  """Runs `step(i)` warmup + steps times; returns the wall time of the timed ones."""
  return time_interleaved([step], warmup, steps)[0]


def time_interleaved(steps_of: list[Callable[[int], None]], warmup: int, steps: int
                     ) -> list[list[float]]:
  """The wall times of `steps` timed steps of each of `steps_of` (after `warmup` untimed
  ones each), taken in turn: round i runs step i of each, one at a time, the order
  reversed every other round, so that the machine's changing speed reaches all alike."""
  for step in steps_of:
    for index in range(warmup):
      step(index)
  times = [[] for _ in steps_of]
  for index in range(warmup, warmup + steps):
    order = range(len(steps_of)) if index % 2 == 0 else reversed(range(len(steps_of)))
    for which in order:
      start = time.perf_counter()
      steps_of[which](index)
      times[which].append(time.perf_counter() - start)
  return times


# --- data pipeline ----------------------------------------------------------------------
def pretraining_task(config):
  """The Task the config's method trains on (XLNet's row streams for method 'xlnet')."""
  if config.method != "pretrain":
    return method_registry.build(config_lib.validate(config)).task()
  return tasks.register_pretraining_task(config)


def measure_pipeline(config, num_batches: int) -> tuple[float, float, list[dict]]:
  """(seconds to the first batch, examples/s after it, the batches pulled)."""
  task = pretraining_task(config)
  batches = pipeline.BatchIterator(task, "train", SEQ_LENGTH, config.train.batch_size,
                                   seed=0)
  try:
    start = time.perf_counter()
    pulled = [next(batches)]
    first_seconds = time.perf_counter() - start
    start = time.perf_counter()
    pulled += [next(batches) for _ in range(num_batches)]
    examples_per_second = num_batches * config.train.batch_size / (
        time.perf_counter() - start)
  finally:
    batches.close(wait=True)  # the next epoch may be opening in the background
  del batches
  gc.collect()  # frees tf.data's iterators, so no prefetch thread runs in the timings
  return first_seconds, examples_per_second, pulled


PADDING_BUILDERS = {"sentence_pairs": ("mlm", "nsp"), "full_sentences": ("mlm",),
                    "doc_sentences": ("mlm",)}


def measure_padding(lengths=(128, 512), num_batches: int = 8) -> list[dict]:
  """Share of padding per example builder and length, on the bundled corpus."""
  rows = []
  for builder, objectives in PADDING_BUILDERS.items():
    row = {"builder": builder}
    for length in lengths:
      config = configs.get("bert:tiny")
      config.data.builder, config.objective.names = builder, objectives
      config.data.seq_length = length
      pulled = pipeline.take_batches(pretraining_task(config), "train", length, 16,
                                     num_batches)
      row[f"padding at {length}"] = f"{packing.padding_fraction(pulled):.1%}"
    rows.append(row)
  return rows


# --- encoderx ---------------------------------------------------------------------------
@dataclasses.dataclass
class Stepper:
  """A framework's train step ready to run: `run_step(index)` trains on batch `index`
  (modulo the batches) and returns when the step is done."""
  run_step: Callable[[int], None]
  num_params: int


def encoderx_stepper(config, batches: list[dict]):
  """(its Stepper, the trainer's method: its model configs are the sizes PyTorch must
  match, the compiled step's StepCost)."""
  trainer = trainer_lib.Trainer(config, devices=jax.devices()[:1])
  state = trainer.init_state()
  train_step, cost = trainer.compile_train_step(state, trainer.device_batch(batches[0]))

  def run_step(index):
    nonlocal state
    state, metrics = train_step(state, trainer.device_batch(batches[index % len(batches)]))
    jax.block_until_ready(metrics)

  num_params = sum(x.size for x in jax.tree_util.tree_leaves(state.params))
  return Stepper(run_step, num_params), trainer.method, cost


# --- PyTorch / Hugging Face -------------------------------------------------------------
# The keyword of each family's sentence-level label (RoBERTa has none).
SENTENCE_LABEL = {"bert": "next_sentence_label", "albert": "sentence_order_label"}


def xlnet_torch_inputs(method, batches: list[dict]) -> list[dict]:
  """XLNetLMHeadModel's keyword arguments for each batch: the permutation mask, target
  mapping and labels of the method's `prepare` for (seed 0, step = the batch's index)."""
  prepare = jax.jit(method.prepare)
  return [_xlnet_torch_batch(jax.device_get(prepare(
      batch, jax.random.fold_in(jax.random.key(0), index))))
          for index, batch in enumerate(batches)]


def _xlnet_torch_batch(prepared: dict) -> dict:
  import torch  # pylint: disable=g-import-not-at-top
  weights = prepared["target_weights"] > 0
  mapping = np.zeros(prepared["target_positions"].shape + prepared["input_ids"].shape[1:],
                     np.float32)
  rows, slots = np.nonzero(weights)
  mapping[rows, slots, prepared["target_positions"][rows, slots]] = 1.0
  as_long = lambda x: torch.from_numpy(np.asarray(x, np.int64))
  return {"input_ids": as_long(prepared["input_ids"]),
          "attention_mask": as_long(prepared["segment_ids"] > 0),
          "token_type_ids": as_long(prepared["token_type_ids"]),
          "perm_mask": torch.from_numpy((~prepared["perm_visible"]).astype(np.float32)),
          "target_mapping": torch.from_numpy(mapping),
          "labels": as_long(np.where(weights, prepared["target_ids"], -100))}


def torch_inputs(family: str, batch: dict, rng: np.random.Generator) -> dict:
  """A numpy batch as the Hugging Face model's keyword arguments, with MLM labels.

  RoBERTa derives its positions from input_ids (padding is <pad>); BERT and ALBERT take
  the token types and their sentence label too.
  """
  import torch  # pylint: disable=g-import-not-at-top
  real = batch["segment_ids"] > 0
  chosen = real & (rng.random(real.shape) < MLM_RATE)
  labels = np.where(chosen, batch["input_ids"], -100)
  as_long = lambda x: torch.from_numpy(np.asarray(x, np.int64))
  inputs = {"input_ids": as_long(batch["input_ids"]), "attention_mask": as_long(real),
            "labels": as_long(labels)}
  if family in SENTENCE_LABEL:
    inputs.update(token_type_ids=as_long(batch["token_type_ids"]),
                  **{SENTENCE_LABEL[family]: as_long(batch["sentence_label"])})
  return inputs


def torch_adamw(config, parameters):
  import torch  # pylint: disable=g-import-not-at-top
  optimizer_config = config.optimizer
  return torch.optim.AdamW(
      parameters, lr=optimizer_config.learning_rate,
      betas=(optimizer_config.b1, optimizer_config.b2), eps=optimizer_config.eps,
      weight_decay=optimizer_config.weight_decay)


def torch_stepper(family: str, config, method, batches: list[dict],
                  device: str = "cpu") -> Stepper:
  """Hugging Face's model of `family` at `method`'s sizes, its AdamW step on `batches`.
  On `device` "cuda": the model and inputs there, bf16 autocast, SDPA attention
  (transformers' default), each step synchronized."""
  import torch  # pylint: disable=g-import-not-at-top
  if family == "electra":
    return torch_electra_stepper(config, method, batches)
  torch.manual_seed(0)
  overrides = {}
  if family == "xlnet":  # its memory as the config's: HF keeps mems when mem_len is set
    plm = config.objective.plm
    overrides = dict(mem_len=plm.mem_len, reuse_len=plm.reuse_len, bi_data=plm.bi_data)
  model = hf.hf_pretraining_model(method.model_config, family, **overrides).train()
  model.to(device)
  optimizer = torch_adamw(config, model.parameters())
  rng = np.random.default_rng(0)
  if family == "xlnet":
    inputs = xlnet_torch_inputs(method, batches)
  else:
    inputs = [torch_inputs(family, batch, rng) for batch in batches]
  inputs = [{k: v.to(device) for k, v in batch.items()} for batch in inputs]
  autocast = torch.autocast("cuda", torch.bfloat16, enabled=device == "cuda")
  memory = None

  def run_step(index):
    nonlocal memory
    extra = {"mems": memory, "use_mems": True} if family == "xlnet" else {}
    with autocast:
      outputs = model(**inputs[index % len(inputs)], **extra)
    loss = outputs.loss
    if family == "xlnet":
      memory = outputs.mems  # detached by XLNetModel.cache_mem
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    if device == "cuda":
      torch.cuda.synchronize()

  return Stepper(run_step, sum(p.numel() for p in model.parameters()))


# --- attention cost ---------------------------------------------------------------------
def attention_variants(model_config: common.ModelConfig) -> dict[str, common.ModelConfig]:
  """BERT's attention (absolute positions) and DeBERTa v2/v3's disentangled attention
  (relative positions only), otherwise the same model."""
  longest = max(ATTENTION_LENGTHS)
  return {
      "standard": dataclasses.replace(model_config, attention="standard",
                                      position_embedding="absolute", position_offset=0,
                                      max_position_embeddings=longest,
                                      enhanced_mask_decoder=False),
      "disentangled": dataclasses.replace(
          model_config, attention="disentangled", position_embedding="none",
          relative_attention_terms=("c2p", "p2c"), share_att_key=True, position_buckets=256,
          max_relative_positions=512, max_position_embeddings=longest,
          enhanced_mask_decoder=False)}


def bench_encoder(model_config: common.ModelConfig, batch_size: int, length: int,
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
  rows = []
  for model_name in args.models:
    config = build_config(model_name, args.batch_size)
    model_config = common.ModelConfig.from_config(
        config.model, tasks.build_vocabulary(config.data.vocab).vocab_size)
    for length in ATTENTION_LENGTHS:
      timings = {name: bench_encoder(variant, args.batch_size, length, args.steps)
                 for name, variant in attention_variants(model_config).items()}
      for name, timing in timings.items():
        print(describe_timing(f"{model_name} {name} @{length}", timing,
                              args.batch_size * length), flush=True)
      standard, relative = timings["standard"].mean, timings["disentangled"].mean
      rows.append({"model": f"{model_name} ({model_config.num_layers} x "
                            f"{model_config.hidden_size})",
                   "length": str(length), "batch": str(args.batch_size),
                   "BERT attention ms": f"{standard * 1e3:.1f}",
                   "disentangled ms": f"{relative * 1e3:.1f}",
                   "disentangled / BERT": f"{relative / standard:.2f}x"})
  return rows
def torch_electra_stepper(config, method, batches: list[dict]) -> Stepper:
  """ELECTRA's step in PyTorch (see the module docstring), the sizes of `method`'s
  generator and discriminator."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  torch.manual_seed(0)
  discriminator = hf.hf_pretraining_model(method.model_config, "electra").train()
  generator = transformers.ElectraForMaskedLM(
      hf.hf_config(method.generator_config, "electra")).train()
  generator.electra.embeddings = discriminator.electra.embeddings  # shared, and the
  # generator's output layer tied to the shared table (as from_pretrained would tie it)
  generator.generator_lm_head.weight = discriminator.electra.embeddings.word_embeddings.weight
  parameters = {id(p): p for model in (generator, discriminator)
                for p in model.parameters()}
  optimizer = torch_adamw(config, list(parameters.values()))
  rng = np.random.default_rng(0)
  inputs = []
  for batch in batches:
    common_inputs = torch_inputs("electra", batch, rng)  # input_ids, attention_mask, labels
    common_inputs["token_type_ids"] = torch.from_numpy(
        np.asarray(batch["token_type_ids"], np.int64))
    chosen = common_inputs["labels"] >= 0
    masked = torch.from_numpy(rng.random(chosen.shape) < 0.85) & chosen
    inputs.append((common_inputs, chosen, torch.where(
        masked, method.vocabulary.mask_id, common_inputs["input_ids"])))

  def run_step(index):
    common_inputs, chosen, masked_ids = inputs[index % len(inputs)]
    original = common_inputs["input_ids"]
    generated = generator(**{**common_inputs, "input_ids": masked_ids})
    with torch.no_grad():
      sampled = torch.distributions.Categorical(logits=generated.logits[chosen]).sample()
      corrupted = original.clone()
      corrupted[chosen] = sampled
    discriminated = discriminator(**{**common_inputs, "input_ids": corrupted,
                                     "labels": (corrupted != original).long()})
    loss = generated.loss + method.rtd_lambda * discriminated.loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()

  return Stepper(run_step, sum(p.numel() for p in parameters.values()))


def kernel_gradient_cost(args) -> list[dict]:
  """Each model's train step with contraction's kernel gradients against jax's order."""
  rows = []
  for model_name in args.models:
    config = build_config(model_name, args.batch_size)
    _, _, batches = measure_pipeline(config, 1 + WARMUP_STEPS + args.steps)
    contracted, _, _ = encoderx_stepper(config, batches)
    with contraction.jax_order():
      jax_ordered, _, _ = encoderx_stepper(config, batches)
    ours, theirs = time_interleaved([contracted.run_step, jax_ordered.run_step],
                                    WARMUP_STEPS, args.steps)
    tokens = args.batch_size * config.data.seq_length
    for name, times in (("contract", ours), ("jax order", theirs)):
      print(describe_timing(f"{model_name} {name}",
                            StepTiming(times, num_params=contracted.num_params), tokens),
            flush=True)
    pairs = paired_ratios(ours, theirs)
    spread = f"{min(pairs):.3f} .. {max(pairs):.3f}"
    rows.append({"model": model_name,
                 "contract ms": f"{statistics.median(ours) * 1e3:.1f}",
                 "jax order ms": f"{statistics.median(theirs) * 1e3:.1f}",
                 "jax order / contract (median of pairs)":
                     f"{statistics.median(pairs):.3f} ({spread})"})
  return rows


# --- report -----------------------------------------------------------------------------
def header(args) -> str:
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  lengths = (" and ".join(map(str, ATTENTION_LENGTHS)) if args.attention_cost else
             " and ".join(map(str, args.lengths)) if args.device != "cpu" else
             SEQ_LENGTH)
  warmup = ACCELERATOR_WARMUP_STEPS if args.device != "cpu" else WARMUP_STEPS
  return (f"encoderx bench: batch {args.batch_size} x length {lengths}, "
          f"{warmup} warm-up + {args.steps} timed steps\n"
          f"  jax {jax.__version__}: platform {jax.default_backend()}, "
          f"{jax.device_count()} device(s) (the step runs on 1)\n"
          f"  torch {torch.__version__}, transformers {transformers.__version__}: "
          f"{torch.get_num_threads()} thread(s)\n"
          f"  host: {os.cpu_count()} CPU core(s), load average {os.getloadavg()[0]:.2f} "
          "(other processes on the host skew every figure); malloc: "
          f"{host_allocator.name()} (both frameworks run on it)")


def describe_timing(name: str, timing: StepTiming, tokens_per_step: int) -> str:
  compile_part = (f"compile {timing.compile_seconds:.1f} s, "
                  if timing.compile_seconds is not None else "")
  return (f"  {name:<9} {timing.num_params / 1e6:6.2f}M params, {compile_part}"
          f"step {timing.mean * 1e3:.1f} ms (sd {timing.stdev * 1e3:.1f}, "
          f"min {min(timing.times) * 1e3:.1f}), "
          f"{timing.per_second(tokens_per_step):,.0f} tokens/s")


def format_table(rows: list[dict]) -> str:
  columns = list(rows[0])
  cells = [columns] + [[row[c] for c in columns] for row in rows]
  widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
  lines = ["  ".join(cell.rjust(width) if i else cell.ljust(width)
                     for i, (cell, width) in enumerate(zip(line, widths)))
           for line in cells]
  lines.insert(1, "  ".join("-" * width for width in widths))
  return "\n".join(lines)


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

  @property
  def tokens_per_step(self) -> int:
    return self.batch_size * self.seq_length

  def paired_ratios(self) -> list[float]:
    """encoderx's speed over PyTorch's for each pair of steps timed side by side."""
    return paired_ratios(self.jax_timing.times, self.torch_timing.times)


def mfu(flops_per_token: float, tokens_per_second: float, peak: float) -> str:
  return f"{flops_per_token * tokens_per_second / peak:.0%}"


def table_row(figures: ModelFigures, peak: float, pipeline_rate: float | None) -> dict:
  jax_tokens = figures.jax_timing.per_second(figures.tokens_per_step)
  row = {"model": figures.name,
         "params": f"{figures.jax_timing.num_params / 1e6:.2f}M",
         "compile s": f"{figures.jax_timing.compile_seconds:.1f}",
         "jax ms/step": f"{figures.jax_timing.mean * 1e3:.1f}",
         "jax tok/s": f"{jax_tokens:,.0f}",
         "MFLOP/tok": f"{figures.flops_per_token / 1e6:.1f}",
         "XLA MFLOP/tok": f"{figures.cost.flops / figures.tokens_per_step / 1e6:.1f}",
         "MFU": mfu(figures.flops_per_token, jax_tokens, peak),
         "torch ms/step": "-", "torch tok/s": "-", "torch MFU": "-", "jax/torch": "-"}
  if figures.torch_timing:
    torch_tokens = figures.torch_timing.per_second(figures.tokens_per_step)
    row.update({"torch ms/step": f"{figures.torch_timing.mean * 1e3:.1f}",
                "torch tok/s": f"{torch_tokens:,.0f}",
                "torch MFU": mfu(figures.torch_flops_per_token, torch_tokens, peak),
                "jax/torch": f"{jax_tokens / torch_tokens:.2f}x"})
  if pipeline_rate is not None:
    step_examples = figures.jax_timing.per_second(figures.batch_size)
    row.update({"pipe ex/s": f"{pipeline_rate:,.0f}",
                "step ex/s": f"{step_examples:,.0f}",
                "headroom": f"{pipeline_rate / step_examples:.1f}x"})
  return row


def measure_model(name: str, family: str | None, config, batches: list[dict], steps: int,
                  torch_device: str | None = "cpu", warmup: int = WARMUP_STEPS
                  ) -> ModelFigures:
  """Times encoderx's step, and PyTorch's on `torch_device` (None: not) where the
  Hugging Face `family` has a model: interleaved with encoderx's on CPU, after it on an
  accelerator (see the module doc)."""
  jax_stepper, method, cost = encoderx_stepper(config, batches)
  with_torch = bool(family and torch_device)
  interleave = with_torch and torch_device == "cpu"
  if interleave:
    torch_step = torch_stepper(family, config, method, batches, torch_device)
    jax_times, torch_times = time_interleaved(
        [jax_stepper.run_step, torch_step.run_step], warmup, steps)
  else:
    jax_times = time_steps(jax_stepper.run_step, warmup, steps)
  jax_timing = StepTiming(jax_times, cost.compile_seconds, jax_stepper.num_params)
  figures = ModelFigures(name, config.train.batch_size, config.data.seq_length,
                         jax_timing, cost, model_flops_per_token(config, method))
  print(describe_timing("encoderx", jax_timing, figures.tokens_per_step), flush=True)
  if with_torch:
    if not interleave:
      torch_step = torch_stepper(family, config, method, batches, torch_device)
      torch_times = time_steps(torch_step.run_step, warmup, steps)
    figures.torch_timing = StepTiming(torch_times, num_params=torch_step.num_params)
    figures.torch_flops_per_token = model_flops_per_token(config, method,
                                                          scores_every_position=True)
    print(describe_timing("pytorch", figures.torch_timing, figures.tokens_per_step),
          flush=True)
    if interleave:
      ratios = figures.paired_ratios()
      print(f"  encoderx / pytorch, step by step: median {statistics.median(ratios):.2f}x "
            f"({min(ratios):.2f}x .. {max(ratios):.2f}x over {len(ratios)} pairs)",
            flush=True)
  return figures


# --- the training loop ------------------------------------------------------------------
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


# --- accelerators -----------------------------------------------------------------------
def published_peak(device_kind: str) -> float | None:
  return next((peak for name, peak in PUBLISHED_PEAKS.items() if name in device_kind),
              None)


def accelerator_config(size: str, length: int, batch_size: int,
                       attention_dropout: float | None = None,
                       attention_kernel: str = "auto"):
  """BERT of `size` (BERT_ACCELERATOR_SIZES, or a bench MODELS name) at `length`, bf16;
  `attention_dropout` replaces the config's unless None."""
  if size in BERT_ACCELERATOR_SIZES:
    config = build_config("bert_tiny", batch_size, length)
    for field, value in BERT_ACCELERATOR_SIZES[size].items():
      config.model[field] = value
  else:
    config = build_config(size, batch_size, length)
  config.model.dtype = "bfloat16"
  config.model.attention_kernel = attention_kernel
  if attention_dropout is not None:
    config.model.attention_dropout = attention_dropout
  config.objective.mlm.max_predictions = round(length * MLM_RATE)
  return config


def accelerator_rows(sizes, lengths, batch_size: int, steps: int, with_torch: bool,
                     attention_dropouts=ACCELERATOR_ATTENTION_DROPOUTS,
                     attention_kernels=("auto",)) -> list[dict]:
  """BERT train steps in bf16 on jax's default device: MFU against its published peak
  (else its measured bf16 matmul peak), with PyTorch on CUDA beside it on GPU (the same
  attention dropout: Hugging Face's SDPA fuses attention with dropout too); a row for
  each attention dropout and `model.attention_kernel`."""
  device = jax.devices()[0]
  peak = published_peak(device.device_kind)
  peak_source = "published"
  if peak is None:
    peak, peak_source = measure_matmul_peak(jax.numpy.bfloat16), "measured bf16 matmul"
  print(f"\n{device.device_kind}: peak {peak / 1e12:,.1f} TFLOP/s ({peak_source})",
        flush=True)
  torch_device = "cuda" if jax.default_backend() == "gpu" else "cpu"
  rows = []
  for size in sizes:
    family = "bert" if size in BERT_ACCELERATOR_SIZES else MODELS[size][0]
    for length in lengths:
      # The data config is the same whatever the dropout: one set of batches for all.
      batches = pipeline.take_batches(
          pretraining_task(accelerator_config(size, length, batch_size)), "train", length,
          batch_size, 1 + ACCELERATOR_WARMUP_STEPS + steps)
      for attention_dropout, kernel in itertools.product(attention_dropouts,
                                                         attention_kernels):
        config = accelerator_config(size, length, batch_size, attention_dropout, kernel)
        name = (f"{size} @{length}, attention dropout "
                f"{config.model.attention_dropout:g}"
                + ("" if kernel == "auto" else f", {kernel} kernel"))
        print(f"\n{name}:", flush=True)
        figures = measure_model(name, family, config, batches, steps,
                                torch_device if with_torch else None,
                                ACCELERATOR_WARMUP_STEPS)
        rows.append(table_row(figures, peak, None))
        gc.collect()
  return rows


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
  parser.add_argument("--batch_size", type=int, default=32)
  parser.add_argument("--steps", type=int, default=10, help="timed steps per model")
  parser.add_argument("--models", default=None,
                      help=f"comma-separated, among {', '.join(MODELS)} (default: all; "
                      "with --attention_cost or --kernel_gradient_cost, bert_small)")
  parser.add_argument("--skip_torch", action="store_true",
                      help="time encoderx and the pipeline only")
  parser.add_argument("--skip_padding", action="store_true",
                      help="do not measure the example builders' padding")
  parser.add_argument("--attention_cost", action="store_true",
                      help="only time DeBERTa's disentangled attention against BERT's at "
                      f"lengths {' and '.join(map(str, ATTENTION_LENGTHS))}")
  parser.add_argument("--kernel_gradient_cost", action="store_true",
                      help="only time the train step with contraction's kernel gradients "
                      "against jax's order")
  parser.add_argument("--train_loop_steps", type=int, default=0,
                      help="also run encoderx.train this many steps per model and compare "
                      "its logged tokens/s with the bench's")
  parser.add_argument("--device", choices=("cpu", "gpu", "tpu"), default="cpu",
                      help="gpu|tpu: BERT-base and BERT-large at lengths "
                      f"{' and '.join(map(str, ACCELERATOR_LENGTHS))} in bfloat16, MFU "
                      "against the device's published peak")
  parser.add_argument("--lengths", default=",".join(map(str, ACCELERATOR_LENGTHS)),
                      help="with --device=gpu|tpu: the sequence lengths, in this order")
  parser.add_argument("--attention_kernels", default="auto",
                      help="with --device=gpu|tpu: model.attention_kernel of each row, "
                      f"comma-separated among {', '.join(common.ATTENTION_KERNELS)} "
                      "(auto: on GPU the Pallas kernel with attention dropout, cuDNN's "
                      "without; xla: XLA's attention with dropout)")
  args = parser.parse_args(argv)
  accelerator = args.device != "cpu"
  if args.models is None:
    args.models = ("bert_small" if args.attention_cost or args.kernel_gradient_cost else
                   ",".join(BERT_ACCELERATOR_SIZES) if accelerator else ",".join(MODELS))
  args.models = [m.strip() for m in args.models.split(",") if m.strip()]
  known = {**MODELS, **BERT_ACCELERATOR_SIZES} if accelerator else MODELS
  unknown = [m for m in args.models if m not in known]
  if unknown:
    parser.error(f"unknown model(s) {unknown}; choose among {list(known)}")
  try:
    args.lengths = [int(length) for length in args.lengths.split(",")]
  except ValueError:
    parser.error(f"--lengths: comma-separated integers, got {args.lengths!r}")
  args.attention_kernels = [k.strip() for k in args.attention_kernels.split(",")]
  if set(args.attention_kernels) - set(common.ATTENTION_KERNELS):
    parser.error(f"--attention_kernels: among {', '.join(common.ATTENTION_KERNELS)}, got "
                 f"{','.join(args.attention_kernels)}")
  if args.steps < 1 or args.batch_size < 1 or args.train_loop_steps < 0 or min(
      args.lengths) < 8:
    parser.error("--steps and --batch_size must be positive, --train_loop_steps not "
                 "negative, --lengths at least 8")
  return args


def main(argv=None) -> None:
  args = parse_args(argv)
  # seqio warns at every epoch that the text source is uncached; noise here.
  absl_logging.set_verbosity(absl_logging.ERROR)
  print(header(args), flush=True)
  if args.device in ("gpu", "tpu"):
    if jax.default_backend() != args.device:
      raise SystemExit(f"--device={args.device}: jax's backend is "
                       f"{jax.default_backend()} (devices {jax.devices()})")
    print("\nBERT train steps in bfloat16:", flush=True)
    print("\n" + format_table(accelerator_rows(
        args.models, args.lengths, args.batch_size, args.steps,
        with_torch=not args.skip_torch, attention_kernels=args.attention_kernels)))
    return
  if args.attention_cost:
    print("\nencoder forward + backward, BERT's attention against DeBERTa's disentangled "
          "attention:", flush=True)
    print("\n" + format_table(attention_cost(args)))
    return
  if args.kernel_gradient_cost:
    print("\ntrain step, kernel gradients by contraction.contract against jax's order:",
          flush=True)
    print("\n" + format_table(kernel_gradient_cost(args)))
    return

  # Every step reuses these batches; the pipeline is timed while they are pulled, once
  # per data config.
  num_batches = max(PIPELINE_MIN_BATCHES, 1 + WARMUP_STEPS + args.steps)
  data = {}
  for model_name in args.models:
    config = build_config(model_name, args.batch_size)
    task = pretraining_task(config).name
    if task not in data:
      data[task] = measure_pipeline(config, num_batches)
      first_seconds, pipeline_rate, _ = data[task]
      examples = config.data.builder if config.method == "pretrain" else config.method
      print(f"\npipeline ({config.data.vocab.kind}, {examples}): first batch "
            f"after {first_seconds:.1f} s (shuffle buffer), then {pipeline_rate:,.0f} "
            f"examples/s over {num_batches} batches", flush=True)

  peak = measure_matmul_peak()
  print(f"\nmachine peak: {peak / 1e9:,.1f} GFLOP/s (best {PEAK_MATMUL_SIZE}-square "
        "float32 matmul)", flush=True)
  rows, loop_rows = [], []
  for model_name in args.models:
    config = build_config(model_name, args.batch_size)
    _, pipeline_rate, batches = data[pretraining_task(config).name]
    print(f"\n{model_name}:", flush=True)
    figures = measure_model(model_name, MODELS[model_name][0], config, batches,
                            args.steps, None if args.skip_torch else "cpu")
    rows.append(table_row(figures, peak, pipeline_rate))
    gc.collect()
    if args.train_loop_steps:
      bench_tokens = figures.jax_timing.per_second(figures.tokens_per_step)
      loop_tokens = loop_tokens_per_second(config, args.train_loop_steps)
      loop_rows.append({"model": model_name, "steps": str(args.train_loop_steps),
                        "bench tok/s": f"{bench_tokens:,.0f}",
                        "train loop tok/s": f"{loop_tokens:,.0f}",
                        "loop / bench": f"{loop_tokens / bench_tokens:.2f}"})
      print(f"  train loop {loop_tokens:,.0f} tokens/s", flush=True)

  print("\n" + format_table(rows))
  if loop_rows:
    print("\nthe training loop (python -m encoderx.train) against the bench's step:")
    print(format_table(loop_rows))
  if not args.skip_padding:
    print("\npadding of the example builders on the bundled corpus (16 x 8 rows):")
    print(format_table(measure_padding()))


if __name__ == "__main__":
  main()

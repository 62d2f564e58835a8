"""Throughput of encoderx pretraining on this machine, against Hugging Face PyTorch.

    python -m encoderx.bench [--batch_size=32] [--steps=10] \
        [--models=bert_tiny,bert_small,roberta_tiny,albert_tiny,spanbert_tiny,xlnet_tiny] \
        [--skip_torch]

For each model, at sequence length 128 (its tiny config's data settings):

- encoderx: the jitted train step (`Trainer.train_step`: masking, forward, loss,
  backward, the config's optimizer with clipping: AdamW, LAMB for ALBERT) on real
  batches of the bundled corpus. Compilation (the first call) is timed apart; then
  WARMUP_STEPS untimed steps; then the mean of --steps timed steps, each one
  `device_batch` + step + `block_until_ready`.
- PyTorch: `transformers.BertForPreTraining`, `RobertaForMaskedLM` or
  `AlbertForPreTraining` of the same sizes and vocabulary, in train mode (dropout on),
  on the same batches: forward with `labels` (15% of the real tokens, -100 elsewhere,
  drawn on the host before timing) and the sentence label (`next_sentence_label`,
  `sentence_order_label`) where the family has one; backward, `AdamW.step()` (PyTorch
  has no LAMB), `zero_grad()`. Same warm-up and timed steps.
- tokens/s = batch * 128 / mean step time; the ratio is encoderx / PyTorch, both
  measured in this process one after the other (never concurrently).
- xlnet_tiny (method 'xlnet': permutation LM, two streams, a memory of 96 tokens per
  layer, rows of XLNet's streams): the step includes `prepare` (targets, orders and
  masks on device). PyTorch: `XLNetLMHeadModel` with mem_len / reuse_len / bi_data as
  the config's, fed the same rows' `perm_mask`, `target_mapping` and labels (made by
  encoderx's `prepare` on the host before timing) and its own `mems` of the step
  before; the loss is its cross-entropy over the same predictions.
- spanbert_tiny (span masking, MLM + SBO heads, single-segment rows) has no PyTorch
  column: Hugging Face has no SpanBERT pretraining class (no SBO head).
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
import os
import statistics
import time
from typing import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax  # pylint: disable=g-import-not-at-top
import numpy as np
from absl import logging as absl_logging

from encoderx import config as config_lib
from encoderx import method as method_lib
from encoderx import trainer as trainer_lib
from encoderx.export import hf
from encoderx.configs import albert_tiny, bert_tiny, roberta_tiny, spanbert_tiny, xlnet_tiny
from encoderx.data import packing, pipeline, tasks

SEQ_LENGTH = 128
WARMUP_STEPS = 2  # untimed steps after compilation (allocator, caches, thread pools)
PIPELINE_MIN_BATCHES = 40  # timed pipeline batches; more if the train steps need more
MLM_RATE = 0.15

# Model name -> (Hugging Face family or None, its tiny config, the model fields it changes).
MODELS = {
    "bert_tiny": ("bert", bert_tiny, {}),
    "bert_small": ("bert", bert_tiny, dict(num_layers=4, hidden_size=512, num_heads=8,
                                           intermediate_size=2048)),
    "roberta_tiny": ("roberta", roberta_tiny, {}),
    "albert_tiny": ("albert", albert_tiny, {}),
    "spanbert_tiny": (None, spanbert_tiny, {}),
    "xlnet_tiny": ("xlnet", xlnet_tiny, {}),
}


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


def build_config(model_name: str, batch_size: int):
  _, config_module, model_fields = MODELS[model_name]
  config = config_module.get_config()
  for field, value in model_fields.items():
    config.model[field] = value
  config.data.seq_length = SEQ_LENGTH
  config.train.batch_size = batch_size
  return config


def time_steps(step: Callable[[int], None], warmup: int, steps: int) -> list[float]:
  """Runs `step(i)` warmup + steps times; returns the wall time of the timed ones."""
  for index in range(warmup):
    step(index)
  times = []
  for index in range(warmup, warmup + steps):
    start = time.perf_counter()
    step(index)
    times.append(time.perf_counter() - start)
  return times


# --- data pipeline ----------------------------------------------------------------------
def pretraining_task(config):
  """The Task the config's method trains on (XLNet's row streams for method 'xlnet')."""
  if config.method != "pretrain":
    return method_lib.build(config_lib.validate(config)).task()
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
      config = bert_tiny.get_config()
      config.data.builder, config.objective.names = builder, objectives
      config.data.seq_length = length
      pulled = pipeline.take_batches(pretraining_task(config), "train", length, 16,
                                     num_batches)
      row[f"padding at {length}"] = f"{packing.padding_fraction(pulled):.1%}"
    rows.append(row)
  return rows


# --- encoderx ---------------------------------------------------------------------------
def bench_encoderx(config, batches: list[dict], steps: int):
  """(timing, the resolved ModelConfig: the sizes PyTorch must match)."""
  trainer = trainer_lib.Trainer(config, devices=jax.devices()[:1])
  state = trainer.init_state()
  train_step = trainer.train_step(0)

  def run_step(index):
    nonlocal state
    state, metrics = train_step(state, trainer.device_batch(batches[index % len(batches)]))
    jax.block_until_ready(metrics)

  start = time.perf_counter()
  run_step(0)  # traces and compiles
  compile_seconds = time.perf_counter() - start
  num_params = sum(x.size for x in jax.tree_util.tree_leaves(state.params))
  times = time_steps(lambda i: run_step(i + 1), WARMUP_STEPS, steps)
  return StepTiming(times, compile_seconds, num_params), trainer.method.model_config


# --- PyTorch / Hugging Face -------------------------------------------------------------
# The keyword of each family's sentence-level label (RoBERTa has none).
SENTENCE_LABEL = {"bert": "next_sentence_label", "albert": "sentence_order_label"}


def xlnet_torch_inputs(config, batches: list[dict]) -> list[dict]:
  """XLNetLMHeadModel's keyword arguments for each batch: the permutation mask, target
  mapping and labels of encoderx's `prepare` for (seed 0, step = the batch's index)."""
  prepare = jax.jit(method_lib.build(config_lib.validate(config)).prepare)
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


def bench_torch(family: str, config, model_config, batches: list[dict],
                steps: int) -> StepTiming:
  import torch  # pylint: disable=g-import-not-at-top
  torch.manual_seed(0)
  overrides = {}
  if family == "xlnet":  # its memory as the config's: HF keeps mems when mem_len is set
    plm = config.objective.plm
    overrides = dict(mem_len=plm.mem_len, reuse_len=plm.reuse_len, bi_data=plm.bi_data)
  model = hf.hf_pretraining_model(model_config, family, **overrides).train()
  optimizer_config = config.optimizer
  optimizer = torch.optim.AdamW(
      model.parameters(), lr=optimizer_config.learning_rate,
      betas=(optimizer_config.b1, optimizer_config.b2), eps=optimizer_config.eps,
      weight_decay=optimizer_config.weight_decay)
  rng = np.random.default_rng(0)
  if family == "xlnet":
    inputs = xlnet_torch_inputs(config, batches)
  else:
    inputs = [torch_inputs(family, batch, rng) for batch in batches]
  memory = None

  def run_step(index):
    nonlocal memory
    extra = {"mems": memory, "use_mems": True} if family == "xlnet" else {}
    outputs = model(**inputs[index % len(inputs)], **extra)
    loss = outputs.loss
    if family == "xlnet":
      memory = outputs.mems  # detached by XLNetModel.cache_mem
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()

  times = time_steps(run_step, WARMUP_STEPS, steps)
  num_params = sum(p.numel() for p in model.parameters())
  return StepTiming(times, num_params=num_params)


# --- report -----------------------------------------------------------------------------
def header(args) -> str:
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  return (f"encoderx bench: batch {args.batch_size} x length {SEQ_LENGTH}, "
          f"{WARMUP_STEPS} warm-up + {args.steps} timed steps\n"
          f"  jax {jax.__version__}: platform {jax.default_backend()}, "
          f"{jax.device_count()} device(s) (the step runs on 1)\n"
          f"  torch {torch.__version__}, transformers {transformers.__version__}: "
          f"{torch.get_num_threads()} thread(s)\n"
          f"  host: {os.cpu_count()} CPU core(s), load average {os.getloadavg()[0]:.2f} "
          "(other processes on the host skew every figure)")


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


def table_row(model_name, batch_size, jax_timing, torch_timing, pipeline_rate) -> dict:
  tokens_per_step = batch_size * SEQ_LENGTH
  jax_tokens = jax_timing.per_second(tokens_per_step)
  step_examples = jax_timing.per_second(batch_size)
  row = {"model": model_name,
         "params": f"{jax_timing.num_params / 1e6:.2f}M",
         "compile s": f"{jax_timing.compile_seconds:.1f}",
         "jax ms/step": f"{jax_timing.mean * 1e3:.1f}",
         "jax tok/s": f"{jax_tokens:,.0f}",
         "torch ms/step": "-", "torch tok/s": "-", "jax/torch": "-"}
  if torch_timing:
    torch_tokens = torch_timing.per_second(tokens_per_step)
    row.update({"torch ms/step": f"{torch_timing.mean * 1e3:.1f}",
                "torch tok/s": f"{torch_tokens:,.0f}",
                "jax/torch": f"{jax_tokens / torch_tokens:.2f}x"})
  row.update({"pipe ex/s": f"{pipeline_rate:,.0f}",
              "step ex/s": f"{step_examples:,.0f}",
              "headroom": f"{pipeline_rate / step_examples:.1f}x"})
  return row


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
  parser.add_argument("--batch_size", type=int, default=32)
  parser.add_argument("--steps", type=int, default=10, help="timed steps per model")
  parser.add_argument("--models",
                      default="bert_tiny,bert_small,roberta_tiny,albert_tiny,spanbert_tiny,"
                      "xlnet_tiny",
                      help=f"comma-separated, among {', '.join(MODELS)}")
  parser.add_argument("--skip_torch", action="store_true",
                      help="time encoderx and the pipeline only")
  parser.add_argument("--skip_padding", action="store_true",
                      help="do not measure the example builders' padding")
  args = parser.parse_args(argv)
  args.models = [m.strip() for m in args.models.split(",") if m.strip()]
  unknown = [m for m in args.models if m not in MODELS]
  if unknown:
    parser.error(f"unknown model(s) {unknown}; choose among {list(MODELS)}")
  if args.steps < 1 or args.batch_size < 1:
    parser.error("--steps and --batch_size must be positive")
  return args


def main(argv=None) -> None:
  args = parse_args(argv)
  # seqio warns at every epoch that the text source is uncached; noise here.
  absl_logging.set_verbosity(absl_logging.ERROR)
  print(header(args), flush=True)

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

  rows = []
  for model_name in args.models:
    config = build_config(model_name, args.batch_size)
    _, pipeline_rate, batches = data[pretraining_task(config).name]
    print(f"\n{model_name}:", flush=True)
    tokens_per_step = args.batch_size * SEQ_LENGTH
    jax_timing, model_config = bench_encoderx(config, batches, args.steps)
    print(describe_timing("encoderx", jax_timing, tokens_per_step), flush=True)
    torch_timing = None
    family = MODELS[model_name][0]
    if family and not args.skip_torch:
      torch_timing = bench_torch(family, config, model_config, batches, args.steps)
      print(describe_timing("pytorch", torch_timing, tokens_per_step), flush=True)
    rows.append(table_row(model_name, args.batch_size, jax_timing, torch_timing,
                          pipeline_rate))
    gc.collect()

  print("\n" + format_table(rows))
  if not args.skip_padding:
    print("\npadding of the example builders on the bundled corpus (16 x 8 rows):")
    print(format_table(measure_padding()))


if __name__ == "__main__":
  main()

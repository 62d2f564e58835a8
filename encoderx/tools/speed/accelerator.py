"""The bench's --device=gpu|tpu rows: BERT-base and BERT-large train steps in bfloat16
(float32 parameters) on jax's default device, MFU against the device's published peak,
PyTorch beside them on GPU (gpu_bench.py runs them on a GPU host without the text
stack)."""
from __future__ import annotations

import gc
import itertools
import os

import jax

from encoderx.tools.speed import bench_models, train_steps
from encoderx.tools.speed.timing import measure_matmul_peak

# PyTorch runs beside jax on a GPU: jax must not reserve 75% of its memory when its backend
# starts (at the first device use, after this import).
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
MLM_RATE = 0.15
# On GPU PyTorch's first steps after these are still slow (cuBLAS and SDPA pick their
# kernels): a BERT-base step's spread was 293 ms about a 29 ms minimum with 2.
ACCELERATOR_WARMUP_STEPS = 5
# The paper's BERT-base and BERT-large, on the bundled vocabulary.
BERT_ACCELERATOR_SIZES = {
    "bert_base": dict(num_layers=12, hidden_size=768, num_heads=12, intermediate_size=3072),
    "bert_large": dict(num_layers=24, hidden_size=1024, num_heads=16,
                       intermediate_size=4096)}
ACCELERATOR_LENGTHS = (128, 512)
# Each row is timed with the config's attention dropout and without it: jax has no fused
# attention with a usable dropout (encoderx/models/attention.py), so only the second runs
# cuDNN's flash attention on GPU.
ACCELERATOR_ATTENTION_DROPOUTS = (None, 0.0)  # None: the config's
# Dense bf16 peak FLOP/s per device, as published, by a substring of jax's device_kind.
PUBLISHED_PEAKS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L4": 121e12,
                   "TPU v4": 275e12, "TPU v5 lite": 197e12, "TPU v5e": 197e12,
                   "TPU v5p": 459e12, "TPU v5": 459e12, "TPU v6": 918e12}


def published_peak(device_kind: str) -> float | None:
  return next((peak for name, peak in PUBLISHED_PEAKS.items() if name in device_kind),
              None)


def device_peak() -> float:
  """The default device's peak FLOP/s: its published dense bf16 peak, else its measured
  bf16 matmul peak (printed, with where it comes from)."""
  kind = jax.devices()[0].device_kind
  peak, source = published_peak(kind), "published"
  if peak is None:
    peak, source = measure_matmul_peak(jax.numpy.bfloat16), "measured bf16 matmul"
  print(f"\n{kind}: peak {peak / 1e12:,.1f} TFLOP/s ({source})", flush=True)
  return peak


def accelerator_config(size: str, length: int, batch_size: int,
                       attention_dropout: float | None = None,
                       attention_kernel: str = "auto"):
  """BERT of `size` (BERT_ACCELERATOR_SIZES, or a bench MODELS name) at `length`, bf16;
  `attention_dropout` replaces the config's unless None."""
  if size in BERT_ACCELERATOR_SIZES:
    config = bench_models.build_config("bert_tiny", batch_size, length)
    for field, value in BERT_ACCELERATOR_SIZES[size].items():
      config.model[field] = value
  else:
    config = bench_models.build_config(size, batch_size, length)
  config.model.dtype = "bfloat16"
  config.model.attention.kernel = attention_kernel
  if attention_dropout is not None:
    config.model.attention.dropout = attention_dropout
  mlm = config.objective.mlm  # room for the config's own rate (ModernBERT's 30%)
  mlm.max_predictions = round(length * max(MLM_RATE, mlm.rate))
  return config


def accelerator_rows(sizes, lengths, batch_size: int, steps: int, with_torch: bool,
                     attention_dropouts=ACCELERATOR_ATTENTION_DROPOUTS,
                     attention_kernels=("auto",), peak: float | None = None,
                     take_batches=bench_models.training_batches) -> list[dict]:
  """BERT train steps in bf16 on jax's default device: MFU against `peak` (None: its
  `device_peak`), with PyTorch on CUDA beside it on GPU (the same attention dropout:
  Hugging Face's SDPA fuses attention with dropout too); a row (numbers,
  train_steps.model_row) for each attention dropout and `model.attention.kernel`, on the
  batches `take_batches(config, count)` gives (the pipeline's, or gpu_bench's recorded)."""
  if peak is None:
    peak = device_peak()
  torch_device = "cuda" if jax.default_backend() == "gpu" else "cpu"
  rows = []
  for size in sizes:
    for length in lengths:
      # The data config is the same whatever the dropout: one set of batches for all.
      batches = take_batches(accelerator_config(size, length, batch_size),
                             1 + ACCELERATOR_WARMUP_STEPS + steps)
      for attention_dropout, kernel in itertools.product(attention_dropouts,
                                                         attention_kernels):
        config = accelerator_config(size, length, batch_size, attention_dropout, kernel)
        name = (f"{size} @{length}, attention dropout "
                f"{config.model.attention.dropout:g}"
                + ("" if kernel == "auto" else f", {kernel} kernel"))
        print(f"\n{name}:", flush=True)
        figures = train_steps.measure_model(name, config, batches, steps,
                                            torch_device if with_torch else None,
                                            ACCELERATOR_WARMUP_STEPS)
        rows.append(train_steps.model_row(figures, peak, None))
        gc.collect()
  return rows

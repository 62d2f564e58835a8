"""The tables the benchmarks measure: their columns and formats (one place for the printed
tables and for docs/performance.md), the plain-text table, and the JSON record a run
writes with --json: the figures as numbers, with what they were measured on.

    {"kind": "train_steps", "date": "2026-12-01T10:00:00+00:00", "commit": "abc...+dirty",
     "device": "AMD EPYC, AVX-512, 2 cores", "malloc": "tcmalloc",
     "command": "python -m encoderx.tools.speed.bench --models=bert_tiny", "peak_gflops": 97.1,
     "rows": [{"model": "bert_tiny", "jax_tokens_per_second": 61234.0, ...}],
     "tables": {"padding": [...], ...}}

`rows` is the table of `kind`; `tables` holds the other tables the same run measured, by
kind. A kind's columns (TABLES) say how each number is shown.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import os
import re
import shlex
import subprocess
from typing import Any, Callable

from encoderx import host_allocator


# --- columns ----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Column:
  """A table column: its title, the row's key and how a value is shown (None: '-'). With
  no key, `show` reads the whole row."""
  title: str
  key: str | None
  show: Callable[[Any], str] = str


def fixed(digits: int) -> Callable[[float], str]:
  return lambda value: f"{value:.{digits}f}"


def times(digits: int) -> Callable[[float], str]:
  return lambda value: f"{value:,.{digits}f}x"


def percent(digits: int) -> Callable[[float], str]:
  return lambda value: f"{value:.{digits}%}"


# Below this, a rate is shown with SIGNIFICANT_DIGITS, not as a whole number (ModernBERT-
# base's 0.13 examples/s on a CPU at 1,024 tokens, not 0).
WHOLE_FROM = 10
SIGNIFICANT_DIGITS = 2


def thousands(value: float) -> str:
  """A count or rate: whole, with thousands separators; under WHOLE_FROM, with
  SIGNIFICANT_DIGITS (0.13, 2.5)."""
  if abs(value) < WHOLE_FROM:
    return f"{value:.{SIGNIFICANT_DIGITS}g}"
  return f"{value:,.0f}"


def millions(value: float) -> str:
  return f"{value / 1e6:.2f}M"


def paired(row: dict) -> str:
  """The ratio of each pair of interleaved steps: median (min .. max)."""
  if row.get("paired_median") is None:
    return "-"
  return (f"{row['paired_median']:.2f}x ({row['paired_min']:.2f}x .. "
          f"{row['paired_max']:.2f}x)")


@dataclasses.dataclass(frozen=True)
class Table:
  """A kind of measurement: its title, its printed columns and the columns of its table
  in docs/performance.md (default: the printed ones)."""
  title: str
  columns: tuple[Column, ...]
  page_columns: tuple[Column, ...] | None = None

  @property
  def page(self) -> tuple[Column, ...]:
    return self.page_columns or self.columns


_STEP = (Column("model", "model"), Column("params", "params", millions),
         Column("compile s", "compile_seconds", fixed(1)),
         Column("jax ms/step", "jax_ms", fixed(1)),
         Column("jax tok/s", "jax_tokens_per_second", thousands),
         Column("MFLOP/tok", "mflop_per_token", fixed(1)),
         Column("XLA MFLOP/tok", "xla_mflop_per_token", fixed(1)),
         Column("MFU", "mfu", percent(0)),
         Column("torch ms/step", "torch_ms", fixed(1)),
         Column("torch tok/s", "torch_tokens_per_second", thousands),
         Column("torch MFU", "torch_mfu", percent(0)),
         Column("jax/torch", "jax_over_torch", times(2)),
         Column("pipe ex/s", "pipeline_examples_per_second", thousands),
         Column("step ex/s", "step_examples_per_second", thousands),
         Column("headroom", "pipeline_headroom", times(1)))
_STEP_PAGE = (_STEP[0], _STEP[1], Column("batch", "batch_size"), _STEP[3], _STEP[4],
              _STEP[8], _STEP[9], _STEP[11],
              Column("jax/torch step by step: median (range)", None, paired),
              _STEP[7], _STEP[10], _STEP[14])

TABLES: dict[str, Table] = {
    "train_steps": Table("Train steps at length 128, encoderx against Hugging Face PyTorch",
                         _STEP, _STEP_PAGE),
    "accelerator": Table("Train steps in bfloat16 on accelerators", _STEP[:12],
                         _STEP_PAGE[:-1]),
    "train_loop": Table("The training loop (python -m encoderx.train) against the bench's step",
                        (Column("model", "model"), Column("steps", "steps"),
                         Column("bench tok/s", "bench_tokens_per_second", thousands),
                         Column("train loop tok/s", "loop_tokens_per_second", thousands),
                         Column("loop / bench", "loop_over_bench", fixed(2)))),
    "pipeline": Table("Input pipeline of the bench's data configs (examples/s after the first "
                      "batch)",
                      (Column("vocabulary", "vocabulary"), Column("examples", "examples"),
                       Column("batch", "batch_size"),
                       Column("first batch s", "first_batch_seconds", fixed(1)),
                       Column("ex/s", "examples_per_second", thousands))),
    "padding": Table("Padding of the example builders on the bundled corpus",
                     (Column("builder", "builder"),
                      Column("padding at 128", "padding_at_128", percent(1)),
                      Column("padding at 512", "padding_at_512", percent(1)))),
    "attention_cost": Table(
        "Encoder forward + backward, BERT's attention against DeBERTa's disentangled one",
        (Column("model", "model"), Column("length", "length"), Column("batch", "batch"),
         Column("BERT attention ms", "standard_ms", fixed(1)),
         Column("disentangled ms", "disentangled_ms", fixed(1)),
         Column("disentangled / BERT", "disentangled_over_standard", times(2)))),
    "kernel_gradient_cost": Table(
        "Train step, kernel gradients by contraction.contract against jax's order",
        (Column("model", "model"), Column("contract ms", "contract_ms", fixed(1)),
         Column("jax order ms", "jax_order_ms", fixed(1)),
         Column("jax order / contract (median of pairs)", None,
                lambda row: f"{row['paired_median']:.3f} ({row['paired_min']:.3f} .. "
                            f"{row['paired_max']:.3f})"))),
    "data_scales": Table(
        "Input pipeline against corpus size (python -m encoderx.tools.data.bench_data)",
        (Column("source", "source"), Column("corpus", "corpus"),
         Column("start-up s", "start-up s", fixed(2)), Column("memory MB", "memory MB", fixed(0)),
         Column("resume s", "resume s", fixed(2)), Column("load", "load", fixed(1)))),
    "data_builders": Table(
        "Examples/s per core of each example builder, bundled corpus, length 128",
        (Column("builder", "builder"), Column("vocabulary", "vocabulary"),
         Column("build ex/s/core", "build_examples_per_second", thousands),
         Column("read ex/s/core", "read_examples_per_second", thousands),
         Column("preprocess x1 s", "preprocess_seconds",
                lambda s: f"{s:.0f}" if s else "(done before)"))),
    "finetune": Table(
        "Fine-tuning train steps from a released encoder at length 64, encoderx against "
        "Hugging Face PyTorch on the same batches "
        "(python -m encoderx.tools.speed.bench --finetune)",
        (Column("case", "case"), Column("params", "params", millions),
         Column("batch", "batch_size"),
         Column("real tokens", "real_tokens", thousands),
         Column("jax tokens", "jax_tokens", thousands),
         Column("jax ms/step", "jax_ms", fixed(1)),
         Column("jax ex/s", "jax_examples_per_second", fixed(1)),
         Column("jax at 64 ms/step", "jax_full_ms", fixed(1)),
         Column("torch tokens", "torch_tokens", thousands),
         Column("torch ms/step", "torch_ms", fixed(1)),
         Column("torch ex/s", "torch_examples_per_second", fixed(1)),
         Column("jax/torch", "jax_over_torch", times(2)),
         Column("jax/torch step by step: median (range)", None, paired),
         Column("jax at 64/torch", "jax_full_over_torch", times(2)))),
    "finetune_end_to_end": Table(
        "Whole fine-tuning runs end to end (load, data, compile, steps, dev evaluation, "
        "checkpoint), encoderx.train against a plain PyTorch loop",
        (Column("case", "case"), Column("steps", "steps"), Column("batch", "batch_size"),
         Column("encoderx s", "jax_seconds", fixed(0)),
         Column("pytorch s", "torch_seconds", fixed(0)),
         Column("jax/torch", "jax_over_torch", times(2)))),
    "gpu_kernels": Table(
        "GPU time per step by kernel, from a profile (python launch/gpu_bench.py all)",
        (Column("step", "item"), Column("kernel", "kernel"),
         Column("ms/step", "ms_per_step", fixed(2)), Column("share", "share", percent(1)))),
    "long_context": Table(
        "The tiny ModernBERT's train step at batch 1 over long rows (python -m "
        "encoderx.tools.speed.long_context)",
        (Column("kernel", "kernel"), Column("ran", "kernels_run"),
         Column("length", "seq_length", thousands),
         Column("compile s", "compile_seconds", fixed(1)),
         Column("ms/step", "step_ms", fixed(0)),
         Column("tok/s", "tokens_per_second", thousands),
         Column("XLA temp MB", "temp_mb", fixed(0)),
         Column("[L, L] array", "square_array", lambda v: "yes" if v else "no"),
         Column("peak MB", "peak_mb", fixed(0)))),
}


def formatted(rows: list[dict], columns) -> list[dict[str, str]]:
  """Rows of numbers as rows of text: the columns whose key some row has (or that read
  the whole row), each value shown by its column ('-' for None)."""
  present = [c for c in columns if c.key is None or any(c.key in row for row in rows)]
  return [{c.title: c.show(row) if c.key is None else
           "-" if row.get(c.key) is None else c.show(row[c.key]) for c in present}
          for row in rows]


def format_table(rows: list[dict[str, str]]) -> str:
  """Rows of text as a plain-text table, the first column left-aligned."""
  columns = list(rows[0])
  cells = [columns] + [[row[c] for c in columns] for row in rows]
  widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
  lines = ["  ".join(cell.rjust(width) if i else cell.ljust(width)
                     for i, (cell, width) in enumerate(zip(line, widths)))
           for line in cells]
  lines.insert(1, "  ".join("-" * width for width in widths))
  return "\n".join(lines)


def table(kind: str, rows: list[dict]) -> str:
  """The printed table of `kind` for rows of numbers."""
  return format_table(formatted(rows, TABLES[kind].columns))


# --- what a record was measured on ------------------------------------------------------
def cpu_description() -> str:
  """The CPU's model name (lscpu's) with its family and model numbers (a virtual machine's
  bare "AMD EPYC" named two hosts of different generations, one with twice the other's
  matmul peak), its widest vector extension (AVX-512 or AVX2: XLA and PyTorch pick
  kernels by it) and the cores this process may use."""
  model, flags, numbers = "unknown CPU", set(), {}
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
      for line in cpuinfo:
        name, _, value = line.partition(":")
        if name.strip() == "model name" and model == "unknown CPU":
          model = value.strip()
        elif name.strip() in ("cpu family", "model"):
          numbers.setdefault(name.strip().replace("cpu ", ""), value.strip())
        elif name.strip() == "flags" and not flags:
          flags = set(value.split())
  except OSError:
    pass
  try:
    listed = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    model = re.search(r"^Model name:\s*(.+)$", listed, re.M).group(1).strip()
  except (OSError, subprocess.CalledProcessError, AttributeError):
    pass
  isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
  cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
           else os.cpu_count())
  if numbers:
    model += " (" + ", ".join(f"{name} {number}" for name, number in numbers.items()) + ")"
  return f"{model}, {isa}, {cores} cores"


def commit() -> str:
  """HEAD of the checkout encoderx runs from, '+dirty' when a tracked file differs from
  it; 'unknown' outside a git checkout."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  try:
    head = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    changed = subprocess.run(["git", "-C", root, "status", "--porcelain",
                              "--untracked-files=no"], capture_output=True, text=True,
                             check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return "unknown"
  return head + ("+dirty" if changed else "")


def command(module: str, argv: list[str]) -> str:
  return " ".join(["python -m", module] + [shlex.quote(arg) for arg in argv])


def record(kind: str, rows: list[dict], module: str, argv: list[str],
           device: str | None = None, peak_flops: float | None = None,
           tables: dict[str, list[dict]] | None = None) -> dict:
  """A run's JSON record (see the module doc); `device` None: this host's CPU."""
  return {"kind": kind,
          "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
          "commit": commit(), "device": device or cpu_description(),
          "malloc": host_allocator.name(), "command": command(module, argv),
          "peak_gflops": None if peak_flops is None else peak_flops / 1e9,
          "rows": rows, "tables": tables or {}}


def write_json(path: str, content: dict) -> None:
  directory = os.path.dirname(path)
  if directory:
    os.makedirs(directory, exist_ok=True)
  with open(path + ".partial", "w", encoding="utf-8") as f:
    json.dump(content, f, indent=1)
    f.write("\n")
  os.replace(path + ".partial", path)
  print(f"wrote {path}", flush=True)

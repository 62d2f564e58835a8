"""What a run shows of its progress: step metrics' means, tokens/s, the bar's fields."""
from __future__ import annotations

import time

import jax
import numpy as np


class Meter:
  """Means of the step metrics since the last flush, and tokens/s over those steps.

  The first interval of a phase is its first step alone, which includes compilation:
  it is reported (the baseline that learning is measured from) without a speed.
  """

  def __init__(self, tokens_per_step: int):
    self.tokens_per_step = tokens_per_step
    self.first = True
    self.pending = []
    self.since = time.perf_counter()

  def add(self, metrics: dict) -> None:
    self.pending.append(metrics)

  def flush(self) -> dict:
    values = jax.device_get(self.pending)
    means = {k: float(np.mean([v[k] for v in values])) for k in values[0]}
    now = time.perf_counter()
    if not self.first:
      means["tokens_per_second"] = self.tokens_per_step * len(values) / (now - self.since)
    self.first, self.pending, self.since = False, [], now
    return means


def postfix(metrics: dict) -> dict:
  """The progress bar's fields: the loss, every accuracy the method reports, tokens/s."""
  shown = {"loss": f"{metrics['loss']:.3f}"}
  for name, value in metrics.items():
    if name.endswith("accuracy"):
      shown[name.removesuffix("uracy")] = f"{value:.3f}"
  if "tokens_per_second" in metrics:
    shown["tok/s"] = f"{metrics['tokens_per_second']:,.0f}"
  return shown


def format_metrics(metrics: dict) -> str:
  return "  ".join(f"{k}={v:.4f}" for k, v in sorted(metrics.items()))

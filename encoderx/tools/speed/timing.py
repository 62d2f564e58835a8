"""How the bench times: steps after untimed warm-up steps, frameworks interleaved step by
step, and the machine's peak from a large matmul."""
from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Callable

import jax
import numpy as np

PEAK_MATMUL_SIZE = 2048  # the square f32 matmul whose speed is the machine's peak
# Untimed rounds after compilation (allocator, caches, thread pools). On the 2-core Zen 5
# host modernbert_tiny's jitted step took 267, 175 and 144 ms in its first three calls,
# then 90-100, and the PyTorch step beside its slow ones 30 ms more than its own steady
# 127-134: after two warm-up steps each, the first timed round was 164-174 / 160-173 ms
# (encoderx / PyTorch) in every run, one round of nine charged to both.
WARMUP_STEPS = 4


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


@dataclasses.dataclass
class Stepper:
  """A framework's train step ready to run: `run_step(index)` trains on batch `index`
  (modulo the batches) and returns when the step is done."""
  run_step: Callable[[int], None]
  num_params: int


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


def paired_ratios(times: list[float], other_times: list[float]) -> list[float]:
  """How many times faster the first is, for each pair of steps `time_interleaved` timed
  in the same round: other_times[i] / times[i]."""
  return [other / time_ for time_, other in zip(times, other_times)]


def paired_summary(ratios: list[float]) -> dict[str, float]:
  """The ratios of pairs of steps as a table row holds them (report.paired shows them):
  paired_median, paired_min, paired_max."""
  return {"paired_median": statistics.median(ratios), "paired_min": min(ratios),
          "paired_max": max(ratios)}


def time_steps(step: Callable[[int], None], warmup: int, steps: int) -> list[float]:
  """Runs `step(i)` warmup + steps times; returns the wall time of the timed ones."""
  return time_interleaved([step], warmup, steps)[0]


def time_interleaved(steps_of: list[Callable[[int], None]], warmup: int, steps: int
                     ) -> list[list[float]]:
  """The wall times of `steps` timed steps of each of `steps_of`, taken in turn: round i
  runs step i of each, one at a time, the order reversed every other round, so that the
  machine's changing speed reaches all alike. The first `warmup` rounds are untimed and
  run the same way, so the timed rounds start where each framework's steps are steady
  beside the other's (WARMUP_STEPS)."""
  times = [[] for _ in steps_of]
  for index in range(warmup + steps):
    order = range(len(steps_of)) if index % 2 == 0 else reversed(range(len(steps_of)))
    for which in order:
      start = time.perf_counter()
      steps_of[which](index)
      if index >= warmup:
        times[which].append(time.perf_counter() - start)
  return times


def describe_timing(name: str, timing: StepTiming, tokens_per_step: int) -> str:
  compile_part = (f"compile {timing.compile_seconds:.1f} s, "
                  if timing.compile_seconds is not None else "")
  return (f"  {name:<9} {timing.num_params / 1e6:6.2f}M params, {compile_part}"
          f"step {timing.mean * 1e3:.1f} ms (sd {timing.stdev * 1e3:.1f}, "
          f"min {min(timing.times) * 1e3:.1f}), "
          f"{timing.per_second(tokens_per_step):,.0f} tokens/s")

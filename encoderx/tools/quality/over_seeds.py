"""What the equal-budget comparisons share: the seeds of a --seeds flag, each figure's
median and range over them, printed and written as JSON."""
from __future__ import annotations

import json
import statistics


def parse(seeds: str) -> list[int]:
  """The seeds of a comma-separated flag ("0,1,2")."""
  return [int(seed) for seed in seeds.split(",") if seed.strip()]


def describe(values: list[float]) -> dict:
  return {"values": values, "median": statistics.median(values),
          "min": min(values), "max": max(values)}


def report(results: dict[str, list[float]], record: dict, output: str = "") -> dict:
  """`record` with each figure of `results` ({name: a value per seed}) described;
  prints each figure's median and range, and writes the record to `output` (JSON)."""
  summary = {**record, **{name: describe(values) for name, values in results.items()}}
  for name in results:
    print(f"{name}: median {summary[name]['median']:.4f} "
          f"({summary[name]['min']:.4f} .. {summary[name]['max']:.4f})")
  if output:
    with open(output, "w", encoding="utf-8") as f:
      json.dump(summary, f, indent=2)
  return summary

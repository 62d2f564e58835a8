"""GLUE's official metrics and the dev table: the median over seeds of each task's
metrics, the grid point whose medians score best, and the table as Markdown.

    runs = [{"task": "mrpc", "point": {...}, "seed": 0,
             "metrics": {"dev": {"accuracy": ..., "f1": ..., ...}}}, ...]
    table = glue.summarize(runs)          # per task: its point, medians, each seed's values
    print(glue.markdown(table))

The metrics are those of the GLUE benchmark (Wang et al. 2019) and of the papers' dev
tables: Matthews correlation for CoLA, Pearson and Spearman correlation for STS-B, F1
(of the positive class) and accuracy for MRPC and QQP, accuracy on the matched and the
mismatched dev sets for MNLI, accuracy for SST-2, QNLI and RTE; computed by the
fine-tuning methods with scikit-learn and scipy (encoderx/evaluation/scores.py) on the
whole dev set. Each metric's figure is its median over the seeds of a grid point, as
RoBERTa (5 seeds), ELECTRA and DeBERTa report them; with a grid, the point reported is
the one whose medians give the best task score (a task's score: the mean of its metrics,
as GLUE averages a task's metrics), as BERT picks its learning rate on dev. The average
is the mean of the task scores (GLUE's score, over the tasks run, without WNLI).
"""
from __future__ import annotations

import statistics
from typing import NamedTuple


class Metric(NamedTuple):
  """One column of the table: its name, the dev split and the method's metric."""
  name: str
  split: str
  key: str


OFFICIAL: dict[str, tuple[Metric, ...]] = {
    "cola": (Metric("MCC", "dev", "mcc"),),
    "sst2": (Metric("acc", "dev", "accuracy"),),
    "mrpc": (Metric("F1", "dev", "f1"), Metric("acc", "dev", "accuracy")),
    "stsb": (Metric("Pearson", "dev", "pearson"), Metric("Spearman", "dev", "spearman")),
    "qqp": (Metric("F1", "dev", "f1"), Metric("acc", "dev", "accuracy")),
    "mnli": (Metric("m acc", "dev_matched", "accuracy"),
             Metric("mm acc", "dev_mismatched", "accuracy")),
    "qnli": (Metric("acc", "dev", "accuracy"),),
    "rte": (Metric("acc", "dev", "accuracy"),),
}
TITLES = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "stsb": "STS-B", "qqp": "QQP",
          "mnli": "MNLI", "qnli": "QNLI", "rte": "RTE"}


def official(task: str, metrics: dict[str, dict[str, float]]) -> dict[str, float]:
  """{metric name: value} of `task`'s official metrics, from a run's evaluations of its
  dev splits ({split: the method's metrics})."""
  return {m.name: float(metrics[m.split][m.key]) for m in OFFICIAL[task]}


def point_name(point: dict) -> str:
  """A grid point as the table and the run directories name it."""
  return f"lr{point['learning_rate']:g}_bs{point['batch_size']}_ep{point['epochs']:g}"


def summarize(runs: list[dict]) -> dict:
  """The dev table of finished runs (see the module doc): {'tasks': {task: {'point',
  'score', 'metrics': {name: {'median', 'values' (by seed)}}, 'seeds', 'points': every
  point's medians and score}}, 'average': mean task score, 'tasks_averaged'}."""
  tasks = {}
  for task in dict.fromkeys(run["task"] for run in runs):
    by_point: dict[str, list[dict]] = {}
    for run in runs:
      if run["task"] == task:
        by_point.setdefault(point_name(run["point"]), []).append(run)
    points = []
    for name, point_runs in by_point.items():
      point_runs = sorted(point_runs, key=lambda run: run["seed"])
      values = {m.name: [official(task, run["metrics"])[m.name] for run in point_runs]
                for m in OFFICIAL[task]}
      medians = {metric: statistics.median(v) for metric, v in values.items()}
      points.append({"name": name, "point": point_runs[0]["point"],
                     "seeds": [run["seed"] for run in point_runs],
                     "score": statistics.fmean(medians.values()),
                     "metrics": {metric: {"median": medians[metric], "values": values[metric]}
                                 for metric in medians}})
    best = max(points, key=lambda p: p["score"])  # the first of equals, in grid order
    tasks[task] = {**best, "points": [{k: p[k] for k in ("name", "score", "metrics")}
                                      for p in points]}
  scores = [entry["score"] for entry in tasks.values()]
  return {"tasks": tasks, "average": statistics.fmean(scores) if scores else None,
          "tasks_averaged": list(tasks)}


def _percent(value: float) -> str:
  return f"{100 * value:.1f}"


def markdown(table: dict) -> str:
  """The table as Markdown: one row per task (metric medians, each seed's values, the
  grid point), then the papers' one-line summary; figures x 100."""
  lines = ["| task | metric | median | per seed | seeds | grid point |",
           "|---|---|---|---|---|---|"]
  for task, entry in table["tasks"].items():
    for metric, values in entry["metrics"].items():
      lines.append(f"| {TITLES[task]} | {metric} | {_percent(values['median'])} | "
                   f"{' '.join(_percent(v) for v in values['values'])} | "
                   f"{','.join(map(str, entry['seeds']))} | {entry['name']} |")
  heads, cells = [], []
  for task, entry in table["tasks"].items():
    heads.append(f"{TITLES[task]} {'/'.join(entry['metrics'])}")
    cells.append("/".join(_percent(v["median"]) for v in entry["metrics"].values()))
  if table["average"] is not None:
    heads.append("average")
    cells.append(_percent(table["average"]))
  lines += ["", "| " + " | ".join(heads) + " |", "|" + "---|" * len(heads),
            "| " + " | ".join(cells) + " |"]
  return "\n".join(lines) + "\n"

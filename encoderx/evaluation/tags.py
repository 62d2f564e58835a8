"""Tag sequences: IOB2 repair of predictions and entity-level metrics (seqeval).

A tagger predicts each word's tag on its own, so its output can break IOB2: an I-X that
follows O, or a tag of another type (O I-PER, B-ORG I-PER). `repair_iob2` turns such an
I-X into B-X, which is how conlleval and seqeval's default mode read it anyway: the
entity counts are the same before and after, and the tags written out are valid IOB2.
"""
from __future__ import annotations

from typing import Sequence


def is_iob(labels: Sequence[str]) -> bool:
  """Whether the tag set is IOB (every tag O, B-X or I-X): entity metrics apply."""
  return all(label == "O" or label[:2] in ("B-", "I-") for label in labels)


def repair_iob2(tags: Sequence[str]) -> list[str]:
  """IOB2 tags: an I-X that does not continue an entity of type X starts one (B-X)."""
  repaired, previous = [], "O"
  for tag in tags:
    if tag.startswith("I-") and previous[2:] != tag[2:]:
      tag = "B-" + tag[2:]
    repaired.append(tag)
    previous = tag
  return repaired


def entity_metrics(gold: list[list[str]], predicted: list[list[str]]) -> dict[str, float]:
  """Entity-level micro precision, recall and F1 (seqeval, IOB2 in its default mode,
  as conlleval) and per-type F1 (`f1_PER`, ...)."""
  from seqeval import metrics  # pylint: disable=g-import-not-at-top
  report = metrics.classification_report(gold, predicted, output_dict=True,
                                         zero_division=0)
  scores = {"precision": metrics.precision_score(gold, predicted, zero_division=0),
            "recall": metrics.recall_score(gold, predicted, zero_division=0),
            "f1": metrics.f1_score(gold, predicted, zero_division=0)}
  scores.update({f"f1_{kind}": values["f1-score"] for kind, values in report.items()
                 if "avg" not in kind})
  return {name: float(value) for name, value in scores.items()}

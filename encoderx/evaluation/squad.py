"""Extractive QA: answers from start / end logits (n-best decoding) and SQuAD's official
exact match and F1.

Decoding follows BERT's run_squad.py (write_predictions): in each window of a question,
the `n_best_size` highest start and end logits are paired; a pair is a candidate when
both tokens are context tokens, the start is in the window that gives it the most
context, end >= start and the answer is at most `max_answer_length` tokens; its score is
start logit + end logit, and its text is the context from the start token's first
character to the end token's last. SQuAD v2.0: the no-answer score is the lowest
[CLS] start + end logit over the question's windows, and the answer is "" when it
exceeds the best candidate's score by more than `null_score_threshold`.

The scores are the official evaluation scripts' (evaluate-v1.1.py, evaluate-v2.0.py):
answers are normalized (lower case, punctuation and the articles a / an / the removed,
whitespace collapsed), exact match and token F1 take the best over the gold answers, in
percent. v2.0 scores a question without an answer 100 when the prediction is "" and 0
otherwise, and reports the answerable and unanswerable questions apart.
"""
from __future__ import annotations

import collections
import re
import string

import numpy as np


def normalize_answer(text: str) -> str:
  """SQuAD's normalize_answer: lower case, no punctuation, no articles, single spaces."""
  text = "".join(c for c in text.lower() if c not in set(string.punctuation))
  text = re.sub(r"\b(a|an|the)\b", " ", text)
  return " ".join(text.split())


def f1_score(prediction: str, gold: str, version_2: bool) -> float:
  """Token F1 of the normalized texts. v2.0: 1.0 if both are empty, 0.0 if one is."""
  predicted, expected = normalize_answer(prediction).split(), normalize_answer(gold).split()
  if version_2 and (not predicted or not expected):
    return float(predicted == expected)
  same = sum((collections.Counter(predicted) & collections.Counter(expected)).values())
  if same == 0:
    return 0.0
  precision, recall = same / len(predicted), same / len(expected)
  return 2 * precision * recall / (precision + recall)


def exact_match(prediction: str, gold: str) -> float:
  return float(normalize_answer(prediction) == normalize_answer(gold))


def scores(predictions: dict[str, str], examples, version_2: bool) -> dict[str, float]:
  """Exact match and F1 in percent over `examples` (those with a prediction); v2.0 adds
  has_answer_* and no_answer_* over the answerable and unanswerable ones."""
  totals = collections.defaultdict(list)
  for example in examples:
    if example.id not in predictions:
      continue
    golds = [a.text for a in example.answers]
    if version_2:  # the v2.0 script drops golds that normalize to nothing
      golds = [g for g in golds if normalize_answer(g)] or [""]
    prediction = predictions[example.id]
    em = max(exact_match(prediction, g) for g in golds)
    f1 = max(f1_score(prediction, g, version_2) for g in golds)
    groups = [""] + ([("has_answer_" if example.answers else "no_answer_")]
                     if version_2 else [])
    for group in groups:
      totals[group + "exact_match"].append(em)
      totals[group + "f1"].append(f1)
  return {name: 100.0 * float(np.mean(values)) for name, values in totals.items()}


def best_answers(windows: list, start_logits: np.ndarray, end_logits: np.ndarray,
                 n_best_size: int, max_answer_length: int, version_2: bool = False,
                 null_score_threshold: float = 0.0) -> dict[str, str]:
  """{question id: answer text} from the windows' logits ([windows, length] each, row i
  for windows[i]); see the module docstring."""
  best = {}  # id -> (score, text) of the best candidate so far
  null = {}  # id -> the lowest no-answer score
  for window, starts, ends in zip(windows, start_logits, end_logits):
    example = window.example
    null[example.id] = min(null.get(example.id, np.inf), float(starts[0] + ends[0]))
    best.setdefault(example.id, (-np.inf, ""))
    length = len(window.input_ids)
    top_starts = np.argsort(-starts[:length], kind="stable")[:n_best_size]
    top_ends = np.argsort(-ends[:length], kind="stable")[:n_best_size]
    for start in top_starts:
      if window.spans[start] is None or not window.max_context[start]:
        continue
      for end in top_ends:
        if (window.spans[end] is None or end < start
            or end - start + 1 > max_answer_length):
          continue
        score = float(starts[start] + ends[end])
        if score > best[example.id][0]:
          text = example.context[window.spans[start][0]:window.spans[end][1]]
          best[example.id] = (score, text)
  answers = {}
  for question_id, (score, text) in best.items():
    if version_2 and null[question_id] - score > null_score_threshold:
      text = ""
    answers[question_id] = text
  return answers

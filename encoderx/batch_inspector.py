"""Print what a model is trained on: a decoded example with its masks, labels, segments.

    from encoderx import batch_inspector
    print(batch_inspector.describe(trainer.prepared_batch(batch, step=0), vocabulary))

Works for any objective: it shows the fields a batch has (segments A/B, packed
sequences, MLM targets and how each was corrupted, sentence labels).
"""
from __future__ import annotations

import numpy as np

SENTENCE_LABELS = {"nsp": {0: "B follows A", 1: "B is from another document"},
                   "sop": {0: "A and B in order", 1: "A and B swapped"}}


def _spans(values: np.ndarray, real: np.ndarray) -> list[tuple[int, int, int]]:
  """Runs of equal values over real tokens: [(value, first, last)]."""
  runs = []
  for position in np.flatnonzero(real):
    value = int(values[position])
    if runs and runs[-1][0] == value and runs[-1][2] == position - 1:
      runs[-1] = (value, runs[-1][1], position)
    else:
      runs.append((value, position, position))
  return runs


def describe(batch: dict, vocabulary, index: int = 0, width: int = 100,
             sentence_objective: str = "nsp") -> str:
  """A readable account of row `index` of a (prepared) batch of numpy arrays; the
  sentence label is read as `sentence_objective` ('nsp' or 'sop') defines it."""
  row = {name: np.asarray(value)[index] for name, value in batch.items()}
  real = row["segment_ids"] > 0
  ids = row["input_ids"]
  tokens = [vocabulary.id_to_token(int(i)) for i in ids[real]]
  lines = [f"example {index}: {int(real.sum())} tokens, {int((~real).sum())} padding"]

  text, line = [], ""
  for token in tokens:
    if len(line) + len(token) + 1 > width:
      text.append(line)
      line = ""
    line += (" " if line else "") + token
  text.append(line)
  lines.append("input     : " + "\n            ".join(text))

  documents = _spans(row["segment_ids"], real)
  if len(documents) > 1:
    lines.append("sequences : " + ", ".join(
        f"#{v} tokens {a}-{b}" for v, a, b in documents) + " (attention stays within each)")
  if "token_type_ids" in row and row["token_type_ids"][real].any():
    lines.append("segments  : " + ", ".join(
        f"{'AB'[v] if v < 2 else v} tokens {a}-{b}"
        for v, a, b in _spans(row["token_type_ids"], real)))
  if "sentence_label" in row:
    label = int(row["sentence_label"])
    lines.append(f"label     : {label} ({SENTENCE_LABELS[sentence_objective].get(label, '')})")
  if "masked_positions" in row:
    weights = row["masked_weights"] > 0
    described = []
    for position, original in zip(row["masked_positions"][weights],
                                  row["masked_ids"][weights]):
      now = int(ids[position])
      word = vocabulary.id_to_token(int(original))
      if now == original:
        how = "kept"
      elif now == vocabulary.mask_id:
        how = "[MASK]"
      else:
        how = f"random '{vocabulary.id_to_token(now)}'"
      described.append(f"{position}:'{word}'->{how}")
    kinds = [d.split("->")[1].split(" ")[0] for d in described]
    lines.append(f"predict   : {len(described)} tokens ({kinds.count('[MASK]')} [MASK], "
                 f"{kinds.count('random')} random, {kinds.count('kept')} kept)")
    lines.extend("            " + "  ".join(described[i:i + 5])
                 for i in range(0, len(described), 5))
  return "\n".join(lines)

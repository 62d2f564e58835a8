"""Print what a model is trained on: a decoded example with its masks, labels, segments.

    from encoderx.tools.data import batch_inspector
    print(batch_inspector.describe(trainer.prepared_batch(batch, step=0), vocabulary))

Works for any objective: it shows the fields a batch has (segments A/B, packed
sequences, MLM targets and how each was corrupted, sentence labels). Masked units of
more than one token (whole words, n-grams, spans) are shown a unit a line, with the
boundary tokens that SBO predicts them from:

    span 12-15 'in the same room' -> [MASK]x4 (boundaries 11, 16)
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
    lines.extend(_describe_predictions(row, vocabulary))
  return "\n".join(lines)


def _how(now: int, original: int, vocabulary) -> str:
  if now == original:
    return "kept"
  if now == vocabulary.mask_id:
    return "[MASK]"
  return f"random '{vocabulary.id_to_token(now)}'"


def _describe_predictions(row: dict, vocabulary) -> list[str]:
  weights = row["masked_weights"] > 0
  positions, originals = row["masked_positions"][weights], row["masked_ids"][weights]
  nows = row["input_ids"][positions]
  hows = [_how(int(n), int(o), vocabulary) for n, o in zip(nows, originals)]
  kinds = [how.split(" ")[0] for how in hows]
  counts = (f"{kinds.count('[MASK]')} [MASK], {kinds.count('random')} random, "
            f"{kinds.count('kept')} kept")
  # A unit is the predictions that share boundaries (for unit 'token', each token).
  units = {}
  if "masked_unit_left" in row:
    bounds = zip(row["masked_unit_left"][weights], row["masked_unit_right"][weights])
    for index, bound in enumerate(bounds):
      units.setdefault(tuple(map(int, bound)), []).append(index)
  if not units or all(len(members) == 1 for members in units.values()):
    described = [f"{p}:'{vocabulary.id_to_token(int(o))}'->{how}"
                 for p, o, how in zip(positions, originals, hows)]
    return ([f"predict   : {len(described)} tokens ({counts})"]
            + ["            " + "  ".join(described[i:i + 5])
               for i in range(0, len(described), 5)])
  lines = [f"predict   : {len(positions)} tokens in {len(units)} units ({counts})"]
  for (left, right), members in units.items():
    words = " ".join(vocabulary.id_to_token(int(originals[i])) for i in members)
    unit_kinds = {kinds[i] for i in members}
    if unit_kinds == {"[MASK]"}:
      how = f"[MASK]x{len(members)}"
    elif unit_kinds == {"kept"}:
      how = "kept"
    else:  # a random token may equal the original by chance
      how = "random '" + " ".join(vocabulary.id_to_token(int(nows[i])) for i in members) + "'"
    lines.append(f"            span {positions[members[0]]}-{positions[members[-1]]} "
                 f"'{words}' -> {how} (boundaries {left}, {right})")
  return lines

"""The mine command's files: (anchor, positive) pairs and a corpus in (TSV, CSV or JSON
lines, read by encoderx/data/labelled.py), the rows with negatives out, written whole or
not at all (files.write_atomically), never over an existing file unless asked."""
from __future__ import annotations

import csv
import io
import json

from encoderx import files as files_lib
from encoderx.data import labelled
from encoderx.mine import miner


def read_pairs(path: str, anchor_column: str = "anchor",
               positive_column: str = "positive") -> list[tuple[str, str]]:
  """[(anchor, positive)] of the file's rows; a missing column or an empty value names
  its line."""
  pairs = []
  for number, row in labelled.read_rows(path, [anchor_column, positive_column]):
    for column in (anchor_column, positive_column):
      if not row[column].strip():
        raise miner.MiningError(f"'{path}' line {number}: {column} is empty; every row "
                                "needs an anchor and a positive.")
    pairs.append((row[anchor_column], row[positive_column]))
  return pairs


def read_corpus(path: str, column: str = "text") -> list[str]:
  """The texts of the corpus file's `column`, empty ones left out."""
  return [row[column] for _, row in labelled.read_rows(path, [column])
          if row[column].strip()]


def output_format(path: str) -> str:
  """The output's file format from its extension; checked before anything is mined."""
  try:
    return labelled.file_format(path)
  except labelled.LabelledDataError:
    raise miner.MiningError(f"cannot tell the format of '{path}' from its extension; "
                            "name it .tsv, .csv or .jsonl.", argument="output") from None


def check_output(path: str, overwrite: bool, options: miner.MiningOptions) -> None:
  """The output can be written: a known format, lists only in JSON lines, and no existing
  file unless `overwrite`."""
  kind = output_format(path)
  if options.output_format == "labeled-list" and kind != "jsonl":
    raise miner.MiningError("labeled-list rows hold lists: write them to a .jsonl file, "
                            f"not '{path}'.", argument="output")
  if files_lib.path(path).exists() and not overwrite:
    raise miner.MiningError(f"'{path}' exists; choose another output or overwrite it.",
                            argument="output", remedy="overwrite")


def write_rows(path: str, mined: miner.Mined) -> None:
  """The rows in the format of the file's extension, whole or not at all."""
  kind = output_format(path)
  if kind == "jsonl":
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in mined.rows)
  elif kind == "csv":
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, mined.columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(mined.rows)
    text = buffer.getvalue()
  else:  # TSV is read without quoting: a tab or line break in a text would split it
    lines = ["\t".join(mined.columns)]
    for row in mined.rows:
      cells = [str(row[column]) for column in mined.columns]
      if any(c in cell for cell in cells for c in "\t\r\n"):
        raise miner.MiningError(f"a text holds a tab or a line break, which TSV cannot "
                                f"hold; write '{path}' as .jsonl instead.", argument="output")
      lines.append("\t".join(cells))
    text = "\n".join(lines) + "\n"
  files_lib.write_atomically(path, text)

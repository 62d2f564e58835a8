"""Labelled examples in files: TSV, CSV or JSON lines, columns named by the config.

TSV and CSV files start with a header naming their columns; TSV is read with quoting
off (texts may hold quotes, as STS-B's do), CSV with standard quoting. JSON-lines files
have one object per line. Every problem (a missing file or column, a line with the wrong
number of fields, bytes that are not UTF-8, a label outside the label list) stops with
an error naming the file and the line.
"""
from __future__ import annotations

import csv
import json
import os

from encoderx import errors
from encoderx import files as files_lib

FORMATS = ("tsv", "csv", "jsonl")


class LabelledDataError(errors.UserError, ValueError):
  """A labelled data file that cannot be used; the message names the file and line."""


def file_format(path: str, format_name: str = "") -> str:
  """The file's format: `format_name`, or its extension (.tsv, .csv, .jsonl / .json)."""
  if format_name:
    return format_name
  extension = os.path.splitext(path)[1].lower().lstrip(".")
  extension = {"json": "jsonl", "txt": "tsv"}.get(extension, extension)
  if extension not in FORMATS:
    raise LabelledDataError(
        f"'{path}': cannot tell the format from the extension '.{extension}'; use .tsv, "
        ".csv or .jsonl, or set finetune.format.")
  return extension


def numbered_lines(path: str):
  """(line number, text) of each line of a UTF-8 file; an unreadable file or a line that
  is not UTF-8 is a LabelledDataError naming it."""
  try:
    handle = files_lib.path(path).open("rb")
  except OSError as error:
    raise LabelledDataError(f"cannot open '{path}': {error.strerror}.") from None
  with handle:
    for number, raw in enumerate(handle, start=1):
      try:
        yield number, raw.decode("utf-8").rstrip("\r\n")
      except UnicodeDecodeError as error:
        raise LabelledDataError(f"'{path}' line {number} is not UTF-8 (byte "
                                f"{error.start + 1}).") from None


def column_names(path: str, format_name: str = "") -> list[str]:
  """The file's columns: its header's (TSV, CSV), or the keys of its first object
  (JSON lines)."""
  kind = file_format(path, format_name)
  for number, line in numbered_lines(path):
    if not line.strip():
      continue
    if kind == "jsonl":
      try:
        return list(json.loads(line))
      except (ValueError, TypeError):
        raise LabelledDataError(f"'{path}' line {number}: not a JSON object.") from None
    return line.split("\t") if kind == "tsv" else next(csv.reader([line]))
  raise LabelledDataError(f"'{path}' holds no examples.")


def read_rows(path: str, columns: list[str], format_name: str = "",
              optional: tuple[str, ...] = ()) -> list[tuple[int, dict[str, str]]]:
  """[(line number, {column: value})] of the file's examples, for the given columns;
  those in `optional` read as "" where the file lacks them."""
  kind = file_format(path, format_name)
  rows, header = [], None
  for number, line in numbered_lines(path):
    if not line.strip():
      continue
    if kind == "jsonl":
      try:
        record = json.loads(line)
      except ValueError as error:
        raise LabelledDataError(f"'{path}' line {number}: not JSON ({error}).") from None
      if not isinstance(record, dict):
        raise LabelledDataError(f"'{path}' line {number}: not a JSON object.")
      missing = [c for c in columns if c not in record and c not in optional]
      if missing:
        raise LabelledDataError(f"'{path}' line {number} lacks {', '.join(missing)} "
                                f"(it has {', '.join(record)}).")
      rows.append((number, {c: str(record.get(c, "")) for c in columns}))
      continue
    if kind == "tsv":
      fields = line.split("\t")
    else:
      fields = next(csv.reader([line]))
    if header is None:
      header = fields
      missing = [c for c in columns if c not in header and c not in optional]
      if missing:
        raise LabelledDataError(
            f"'{path}': the header (line {number}) has no column "
            f"{', '.join(repr(c) for c in missing)}; its columns are "
            f"{', '.join(repr(h) for h in header)}. Name the columns in finetune.*_column.")
      continue
    if len(fields) != len(header):
      raise LabelledDataError(f"'{path}' line {number} has {len(fields)} fields; the "
                              f"header has {len(header)}.")
    record = dict(zip(header, fields))
    rows.append((number, {c: record.get(c, "") for c in columns}))
  if not rows:
    raise LabelledDataError(f"'{path}' holds no examples.")
  return rows


def label_ids(rows, label_column: str, labels: tuple[str, ...], path: str) -> list[int]:
  """The id of each row's label in `labels`; an unknown label names its line."""
  index = {label: i for i, label in enumerate(labels)}
  ids = []
  for number, row in rows:
    if row[label_column] not in index:
      raise LabelledDataError(
          f"'{path}' line {number}: label {row[label_column]!r} is not one of "
          f"{', '.join(map(repr, labels))} (finetune.labels).")
    ids.append(index[row[label_column]])
  return ids


def label_scores(rows, label_column: str, path: str) -> list[float]:
  """Each row's label read as a number (regression targets); a non-number names its
  line."""
  scores = []
  for number, row in rows:
    try:
      scores.append(float(row[label_column]))
    except ValueError:
      raise LabelledDataError(f"'{path}' line {number}: {label_column} "
                              f"{row[label_column]!r} is not a number.") from None
  return scores

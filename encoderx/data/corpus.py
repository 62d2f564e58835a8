"""Text files -> documents.

A document is a list of text blocks, joined by newlines in the `text` feature. Each block
is a paragraph (wrapped lines joined with spaces) that a sentence breaker splits later,
or, with `sentence_per_line`, a line that is already one sentence (BERT's own format).

Documents are separated by blank lines, or, when `document_marker` is set, by lines
matching that regex (the marker line itself, e.g. "Chapter 3", is dropped); then blank
lines separate paragraphs inside a document. With `document_per_line` each non-blank line
is a whole document of one block (the format of many dumps, e.g. Wikipedia extractions).
"""
from __future__ import annotations

import dataclasses
import re
from typing import Iterator

from encoderx import errors
from encoderx import files as files_lib


class CorpusError(errors.UserError, ValueError):
  """A corpus that cannot be read as documents; the message says which file and why."""


@dataclasses.dataclass(frozen=True)
class CorpusFormat:
  document_marker: str = ""
  sentence_per_line: bool = False
  invalid_utf8: str = "error"  # or "replace"
  document_per_line: bool = False


def _decoded_lines(path: str, invalid_utf8: str) -> Iterator[str]:
  try:
    handle = files_lib.path(path).open("rb")
  except OSError as error:
    raise CorpusError(f"cannot open corpus file '{path}': {error.strerror}.") from None
  with handle:
    for number, raw in enumerate(handle, start=1):
      try:
        yield raw.decode("utf-8")
      except UnicodeDecodeError as error:
        if invalid_utf8 == "replace":
          yield raw.decode("utf-8", errors="replace")
          continue
        raise CorpusError(
            f"corpus file '{path}' is not UTF-8: line {number}, byte {error.start + 1} "
            f"of the line is {raw[error.start:error.start + 1]!r}. Convert the file "
            "(e.g. `iconv -f latin1 -t utf-8`), or set data.invalid_utf8='replace' to "
            "read undecodable bytes as U+FFFD.") from None


def documents_of_file(path: str, corpus_format: CorpusFormat) -> Iterator[list[str]]:
  """Yields every document of one file, in order, as a list of text blocks."""
  if corpus_format.document_per_line:
    for line in _decoded_lines(path, corpus_format.invalid_utf8):
      line = " ".join(line.split())
      if line:
        yield [line]
    return
  marker = re.compile(corpus_format.document_marker) if corpus_format.document_marker else None
  document, block = [], []

  def close_block():
    if block:
      if corpus_format.sentence_per_line:
        document.extend(block)
      else:
        document.append(" ".join(block))
      block.clear()

  for line in _decoded_lines(path, corpus_format.invalid_utf8):
    if marker is not None and marker.search(line):
      close_block()
      if document:
        yield list(document)
      document.clear()
      continue
    line = " ".join(line.split())
    if line:
      block.append(line)
    elif marker is None:  # a blank line ends the document
      close_block()
      if document:
        yield list(document)
      document.clear()
    else:  # a blank line ends the paragraph
      close_block()
  close_block()
  if document:
    yield document


def read_documents(files: list[str], corpus_format: CorpusFormat) -> Iterator[list[str]]:
  """Yields every document of `files` in order, as a list of text blocks."""
  found = False
  for path in files:
    for document in documents_of_file(path, corpus_format):
      found = True
      yield document
  if not found:
    raise CorpusError(
        f"the corpus {files} holds no text (the files are empty or only whitespace"
        + (", or every line matches data.document_marker" if corpus_format.document_marker
           else "") + ").")


def is_held_out(document_index: int, eval_every_nth_document: int) -> bool:
  """Every n-th document is the evaluation split; the others train."""
  return document_index % eval_every_nth_document == eval_every_nth_document - 1

"""Character offsets of tokens in the original text, through the text's normalization.

Vocabularies prepare text before splitting it (lower-casing, accent stripping, dropped
control characters, `` -> "), so a tokenizer's offsets point into the prepared text.
`Normalized` keeps, for each character of the prepared text, the span of original
characters it came from, and maps offsets back: a token's span in the original text is
from the start of its first character's origin to the end of its last one's. Extractive
QA cuts answers out of the original context with these spans.
"""
from __future__ import annotations

import dataclasses
import unicodedata
from typing import Callable, Sequence


@dataclasses.dataclass
class Normalized:
  """`text` normalized, and for each of its characters the original span [start, end)."""
  original: str
  text: str
  starts: list[int]
  ends: list[int]

  @classmethod
  def of(cls, original: str, char_fn: Callable[[str], str],
         replacements: Sequence[tuple[str, str]] = ()) -> "Normalized":
    """Normalizes `original` a character at a time by `char_fn`, after the multi-char
    `replacements` ((old, new) pairs, matched left to right)."""
    pieces, starts, ends, index = [], [], [], 0
    while index < len(original):
      for old, new in replacements:
        if original.startswith(old, index):
          produced, width = new, len(old)
          break
      else:
        produced, width = char_fn(original[index]), 1
      pieces.append(produced)
      starts += [index] * len(produced)
      ends += [index + width] * len(produced)
      index += width
    return cls(original, "".join(pieces), starts, ends)

  def char_offsets_of_bytes(self, byte_spans) -> list[tuple[int, int]]:
    """Original-text spans of [start, end) byte spans of `text` (UTF-8)."""
    char_of_byte = []
    for position, char in enumerate(self.text):
      char_of_byte += [position] * len(char.encode("utf-8"))
    char_of_byte.append(len(self.text))
    return [self.original_span(char_of_byte[start], char_of_byte[end - 1] + 1)
            if end > start else self.original_span(char_of_byte[start], char_of_byte[start])
            for start, end in byte_spans]

  def original_span(self, start: int, end: int) -> tuple[int, int]:
    """The original span of `text[start:end]` (an empty span stays empty)."""
    if end <= start:
      at = self.starts[start] if start < len(self.starts) else len(self.original)
      return at, at
    return self.starts[start], self.ends[end - 1]


def strip_whitespace(text: str, spans) -> list[tuple[int, int]]:
  """Spans without the whitespace at their edges (byte-level BPE and SentencePiece
  tokens carry the space before a word)."""
  stripped = []
  for start, end in spans:
    while start < end and text[start].isspace():
      start += 1
    while end > start and text[end - 1].isspace():
      end -= 1
    stripped.append((start, end))
  return stripped


def drop_marks(char: str, form: str, marks: str) -> str:
  """The character decomposed (`form`: NFD or NFKD) without the marks whose Unicode
  category starts with `marks` ('Mn': BERT's accent stripping; 'M': ALBERT's)."""
  return "".join(c for c in unicodedata.normalize(form, char)
                 if not unicodedata.category(c).startswith(marks))

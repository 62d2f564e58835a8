"""Files shipped inside the package, named `bundled:<name>` in configs."""
from __future__ import annotations

import os

import importlib_resources

from encoderx import files as files_lib

# The names configs give the shipped files.
BUNDLED_CORPUS = "bundled:austen"
BUNDLED_WORDPIECE_VOCAB = "bundled:austen-wordpiece"
BUNDLED_BPE_VOCAB = "bundled:austen-bpe"
BUNDLED_MODERNBERT_BPE_VOCAB = "bundled:austen-modernbert-bpe"
BUNDLED_EUROBERT_BPE_VOCAB = "bundled:austen-eurobert-bpe"
BUNDLED_SENTENCEPIECE_VOCAB = "bundled:austen-sentencepiece"
BUNDLED_DEBERTA_SENTENCEPIECE_VOCAB = "bundled:austen-deberta-sentencepiece"

_BUNDLED = {
    # Three public-domain Jane Austen novels, verbatim (see resources/README.md).
    "austen": "austen/*.txt",
    # WordPiece vocabulary (8,000 tokens, uncased) trained on the Austen sample.
    "austen-wordpiece": "austen-wordpiece-vocab.txt",
    # Byte-level BPE vocabulary (8,000 tokens, RoBERTa's special tokens) trained on it:
    # a directory with vocab.json and merges.txt.
    "austen-bpe": "austen-bpe",
    # The same with ModernBERT's special tokens ([UNK] [CLS] [SEP] [PAD] [MASK] = 0-4;
    # data.vocab.layout 'bert') and with EuroBERT's (<|begin_of_text|> <|end_of_text|>
    # <|mask|> <|pad|> = 0-3; layout 'eurobert').
    "austen-modernbert-bpe": "austen-modernbert-bpe",
    "austen-eurobert-bpe": "austen-eurobert-bpe",
    # SentencePiece unigram model (8,000 pieces, ALBERT's layout, lower-cased) trained on
    # the Austen sample; the .vocab next to it lists its pieces.
    "austen-sentencepiece": "austen-sentencepiece.model",
    # The same with DeBERTa's layout ([PAD] [CLS] [SEP] [UNK] = 0-3, [MASK] = 8000), cased.
    "austen-deberta-sentencepiece": "austen-deberta-sentencepiece.model",
}


def _root() -> str:
  return str(importlib_resources.files("encoderx.data") / "resources")


def resolve(name: str) -> str:
  """'bundled:<name>' -> the shipped file (a glob for corpora); other names as
  files_lib.path makes them (file:// URLs local, ~ expanded, remote URLs unchanged)."""
  if not name.startswith("bundled:"):
    return str(files_lib.path(name))
  key = name.removeprefix("bundled:")
  if key not in _BUNDLED:
    raise ValueError(f"no bundled resource '{key}'; bundled: {', '.join(sorted(_BUNDLED))}")
  return os.path.join(_root(), _BUNDLED[key])


def bundled_corpus_files() -> list[str]:
  return files_lib.glob(resolve("bundled:austen"))

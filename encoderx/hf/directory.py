"""Reading a Hugging Face model directory: its config, vocabulary files and weights.

A directory as `save_pretrained` writes it (or as released checkpoints ship):
config.json (`model_type` names the family), the weights as model.safetensors or
pytorch_model.bin, and the tokenizer's files (vocab.txt for BERT and ELECTRA, vocab.json +
merges.txt for RoBERTa, spiece.model for ALBERT, spm.model for DeBERTa v2/v3,
tokenizer.json for ModernBERT and EuroBERT) with tokenizer_config.json. The weights may
be of any class of the family (BertModel, BertForPreTraining,
BertForSequenceClassification, ...): the class is recognized by its weights
(encoderx/hf/engine.py import_state_dict).
The conversion itself is the engine's, the same as export's.
"""
from __future__ import annotations

import contextlib
import json
import os
import zipfile

import numpy as np

from encoderx import errors
from encoderx import files as files_lib
from encoderx.data import bpe_vocabulary
from encoderx.hf import base, engine, families
from encoderx.models import model_config

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


class HfDirectoryError(errors.UserError, ValueError):
  """A directory that cannot be read as a Hugging Face model of a known family."""


def _read_json(path: str) -> dict:
  try:
    return json.loads(files_lib.read_text(path))
  except (OSError, ValueError) as error:
    raise HfDirectoryError(f"cannot read '{path}': {error}") from None


def read_config(directory: str) -> tuple[str, dict]:
  """(family, encoderx model fields) of the directory's config.json."""
  path = os.path.join(directory, "config.json")
  if not os.path.isfile(path):
    raise HfDirectoryError(f"'{directory}' has no config.json; is it a Hugging Face model "
                           "directory (as save_pretrained writes one)?")
  try:
    return engine.model_fields(_read_json(path))
  except base.ConversionError as error:
    raise HfDirectoryError(f"{path}: {error}") from None


def vocab_fields(directory: str, family: str) -> dict:
  """The `config.data.vocab` fields that read the directory's tokenizer files."""
  tokenizer_config_path = os.path.join(directory, "tokenizer_config.json")
  tokenizer = (_read_json(tokenizer_config_path)
               if os.path.isfile(tokenizer_config_path) else {})
  fam = families.family_named(family)
  kind = fam.vocab_kind
  # DebertaV2Tokenizer keeps case by default; the others lower-case.
  lower_case = bool(tokenizer.get("do_lower_case", fam.vocab_layout != "deberta"))
  if kind == "wordpiece":
    path, fields = "vocab.txt", dict(kind="wordpiece", lower_case=lower_case)
    strip_accents = tokenizer.get("strip_accents")  # None: as lower_case (BertTokenizer)
    fields["strip_accents"] = lower_case if strip_accents is None else bool(strip_accents)
  elif kind == "byte_bpe":  # vocab.json + merges.txt, or tokenizer.json
    try:
      bpe_vocabulary.vocabulary_files(directory)
    except bpe_vocabulary.VocabularyError as error:
      raise HfDirectoryError(f"'{directory}' has no {family} tokenizer: {error}") from None
    path, fields = "", dict(kind="byte_bpe", layout=fam.vocab_layout)
  elif fam.vocab_layout == "deberta":
    if tokenizer.get("split_by_punct"):
      raise HfDirectoryError(f"'{directory}': DebertaV2Tokenizer's split_by_punct is not "
                             "supported.")
    path, fields = "spm.model", dict(kind="sentencepiece", layout="deberta",
                                     lower_case=lower_case, strip_accents=False)
  else:  # sentencepiece, ALBERT's layout
    path, fields = "spiece.model", dict(
        kind="sentencepiece", lower_case=lower_case,
        strip_accents=not tokenizer.get("keep_accents", False))
  fields["path"] = os.path.join(directory, path) if path else directory
  if path and not os.path.isfile(fields["path"]):
    raise HfDirectoryError(f"'{directory}' has no {path}, the {family} tokenizer's file.")
  return fields


def weights_file(directory: str) -> str:
  """The path of the directory's weights (safetensors preferred)."""
  for name in WEIGHT_FILES:
    path = os.path.join(directory, name)
    if os.path.isfile(path):
      return path
  raise HfDirectoryError(f"'{directory}' has none of {', '.join(WEIGHT_FILES)}.")


@contextlib.contextmanager
def _reading(path: str):
  """Any error reading the weights file `path` as a one-line HfDirectoryError."""
  try:
    yield
  except ImportError:
    raise
  except Exception as error:  # pylint: disable=broad-except
    # safetensors' SafetensorError; torch's RuntimeError, EOFError, OSError or
    # UnpicklingError; zipfile's BadZipFile: a file cut short or otherwise damaged.
    reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
    raise HfDirectoryError(f"'{path}' cannot be read ({reason}): it is cut short (an "
                           "interrupted download?) or damaged; download it again.") from None


def check_weights(directory: str) -> None:
  """Raises HfDirectoryError where the weights file is cut short, reading only its index
  (safetensors' header, which must cover the whole file; the end of a zip, as
  torch.save writes pytorch_model.bin), so that a run stops before it builds anything."""
  path = weights_file(directory)
  with _reading(path):
    if path.endswith(".safetensors"):
      from safetensors import safe_open  # pylint: disable=g-import-not-at-top
      with safe_open(path, "numpy"):
        pass
    else:
      with open(path, "rb") as f:
        zipped = f.read(4) == b"PK\x03\x04"  # else torch's legacy format: read in full
      if zipped:
        zipfile.ZipFile(path).close()


def read_state_dict(directory: str) -> dict[str, np.ndarray]:
  """The directory's weights (safetensors preferred) as float32 numpy arrays."""
  path = weights_file(directory)
  with _reading(path):
    if path.endswith(".safetensors"):
      from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
      tensors = load_file(path)
    else:
      import torch  # pylint: disable=g-import-not-at-top
      tensors = {k: v.float().numpy()
                 for k, v in torch.load(path, map_location="cpu", weights_only=True).items()}
  return {k: np.asarray(v, np.float32) for k, v in tensors.items()}


def architecture(directory: str) -> str | None:
  """The class config.json names first under `architectures` (None when absent)."""
  classes = _read_json(os.path.join(directory, "config.json")).get("architectures") or []
  return classes[0] if classes else None


def convert(state_dict, config: model_config.ModelConfig, family: str,
            hf_class: str | None = None) -> tuple[dict, list[str]]:
  """(encoderx params, the names of head weights that have no encoderx equivalent).

  The weights are read as the family's class they fit best (`hf_class`, from
  config.json, breaks ties). Every weight of the encoder must convert: one left over
  is an error naming it; head weights of a class with no rules here are returned.
  """
  head = engine.head_of_class(family, hf_class) if hf_class else None
  try:
    params, _, unused = engine.import_state_dict(state_dict, config, family,
                                                 unused_heads=True, prefer=head)
  except base.ConversionError as error:
    raise HfDirectoryError(str(error)) from None
  return params, unused

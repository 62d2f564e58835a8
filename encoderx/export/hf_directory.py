"""Reading a Hugging Face model directory: its config, vocabulary files and weights.

A directory as `save_pretrained` writes it (or as released checkpoints ship):
config.json (`model_type` names the family), the weights as model.safetensors or
pytorch_model.bin, and the tokenizer's files (vocab.txt for BERT and ELECTRA, vocab.json +
merges.txt for RoBERTa, spiece.model for ALBERT, spm.model for DeBERTa v2/v3) with
tokenizer_config.json. The weights may be of
any class of the family (BertModel, BertForPreTraining, BertForSequenceClassification,
...): the encoder is found by its embeddings, under whatever prefix the class puts it.
"""
from __future__ import annotations

import json
import os

import numpy as np

from encoderx.export import hf
from encoderx.models import common

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
# Buffers some classes save beside their weights; they are not parameters.
BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")
_WORD_EMBEDDINGS = "embeddings.word_embeddings.weight"


class HfDirectoryError(ValueError):
  """A directory that cannot be read as a Hugging Face model of a known family."""


def _read_json(path: str) -> dict:
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except (OSError, ValueError) as error:
    raise HfDirectoryError(f"cannot read '{path}': {error}") from None


def read_config(directory: str) -> tuple[str, dict]:
  """(family, encoderx model fields) of the directory's config.json."""
  path = os.path.join(directory, "config.json")
  if not os.path.isfile(path):
    raise HfDirectoryError(f"'{directory}' has no config.json; is it a Hugging Face model "
                           "directory (as save_pretrained writes one)?")
  try:
    return hf.model_fields(_read_json(path))
  except ValueError as error:
    raise HfDirectoryError(f"{path}: {error}") from None


def vocab_fields(directory: str, family: str) -> dict:
  """The `config.data.vocab` fields that read the directory's tokenizer files."""
  tokenizer_config_path = os.path.join(directory, "tokenizer_config.json")
  tokenizer = (_read_json(tokenizer_config_path)
               if os.path.isfile(tokenizer_config_path) else {})
  # DebertaV2Tokenizer keeps case by default; the others lower-case.
  lower_case = bool(tokenizer.get("do_lower_case", family != "deberta-v2"))
  if family in ("bert", "electra"):
    path, fields = "vocab.txt", dict(kind="wordpiece", lower_case=lower_case)
    strip_accents = tokenizer.get("strip_accents")  # None: as lower_case (BertTokenizer)
    fields["strip_accents"] = lower_case if strip_accents is None else bool(strip_accents)
  elif family == "roberta":
    path, fields = "", dict(kind="byte_bpe")
  elif family == "deberta-v2":
    if tokenizer.get("split_by_punct"):
      raise HfDirectoryError(f"'{directory}': DebertaV2Tokenizer's split_by_punct is not "
                             "supported.")
    path, fields = "spm.model", dict(kind="sentencepiece", layout="deberta",
                                     lower_case=lower_case, strip_accents=False)
  else:  # albert
    path, fields = "spiece.model", dict(
        kind="sentencepiece", lower_case=lower_case,
        strip_accents=not tokenizer.get("keep_accents", False))
  fields["path"] = os.path.join(directory, path) if path else directory
  if path and not os.path.isfile(fields["path"]):
    raise HfDirectoryError(f"'{directory}' has no {path}, the {family} tokenizer's file.")
  return fields


def read_state_dict(directory: str) -> dict[str, np.ndarray]:
  """The directory's weights (safetensors preferred) as float32 numpy arrays."""
  for name in WEIGHT_FILES:
    path = os.path.join(directory, name)
    if os.path.isfile(path):
      break
  else:
    raise HfDirectoryError(f"'{directory}' has none of {', '.join(WEIGHT_FILES)}.")
  if name.endswith(".safetensors"):
    from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
    tensors = load_file(path)
  else:
    import torch  # pylint: disable=g-import-not-at-top
    tensors = {k: v.float().numpy()
               for k, v in torch.load(path, map_location="cpu", weights_only=True).items()}
  return {k: np.asarray(v, np.float32) for k, v in tensors.items()}


def encoder_prefix(state_dict) -> str:
  """'bert.' for BertForPreTraining's names, '' for BertModel's, ..."""
  for name in state_dict:
    if name.endswith(_WORD_EMBEDDINGS):
      return name[:-len(_WORD_EMBEDDINGS)]
  raise HfDirectoryError(f"no {_WORD_EMBEDDINGS} among the weights: not an encoder of a "
                         "known family.")


def convert(state_dict, config: common.ModelConfig, family: str) -> tuple[dict, list[str]]:
  """(encoderx params, the names of head weights that have no encoderx equivalent).

  Every weight of the encoder must convert: one left over is an error naming it.
  """
  prefix = encoder_prefix(state_dict)
  rules = hf.RULES[family](config, prefix=prefix.rstrip("."))
  if config.position_embedding != "absolute" and not config.enhanced_mask_decoder:
    # DeBERTa's checkpoints keep a position table their encoder does not read
    # (position_biased_input=False; Hugging Face ignores it too).
    rules = [r for r in rules if not r[0].endswith("embeddings.position_embeddings.weight")]
  used = {hf_name for hf_name, _, _ in rules}
  tied = {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias",
          "lm_head.decoder.weight", "lm_head.decoder.bias", "predictions.decoder.weight",
          "predictions.decoder.bias", "generator_lm_head.weight"}
  left = [name for name in state_dict
          if name not in used | tied and name.removeprefix(prefix) not in BUFFERS]
  encoder_left = [n for n in left if (n.startswith(prefix + "embeddings.")
                                      or n.startswith(prefix + "encoder."))
                  and n != prefix + "embeddings.position_embeddings.weight"]
  if encoder_left:
    raise HfDirectoryError(f"encoder weights with no {family} conversion rule: "
                           f"{', '.join(sorted(encoder_left))}.")
  return hf.from_hf(state_dict, config, rules=rules), sorted(left)

"""The tokenizer files of a run's vocabulary, as Hugging Face tokenizers read them.

The vocabulary's own files are copied (vocab.txt; vocab.json + merges.txt; spiece.model,
or spm.model for SentencePiece models of DeBERTa's layout)
and described by tokenizer_config.json (the family's tokenizer class and the text
preparation: lower-casing, accents) and special_tokens_map.json, so that
`AutoTokenizer.from_pretrained(DIR)` gives encoderx's ids (tests/test_export.py checks
it on the bundled corpus). The special tokens are the ones encoderx's vocabularies
require (encoderx/data/vocabulary.py, bpe_vocabulary.py, sentencepiece_vocabulary.py).
"""
from __future__ import annotations

import json
import os

from encoderx import files as files_lib
from encoderx.data import bpe_vocabulary, resources

# Vocabulary kind -> (its files, special tokens as Hugging Face names them).
SPECIAL_TOKENS = {
    "wordpiece": dict(unk_token="[UNK]", sep_token="[SEP]", pad_token="[PAD]",
                      cls_token="[CLS]", mask_token="[MASK]"),
    "byte_bpe": dict(bos_token="<s>", eos_token="</s>", unk_token="<unk>", sep_token="</s>",
                     pad_token="<pad>", cls_token="<s>", mask_token="<mask>"),
    "sentencepiece": dict(bos_token="[CLS]", eos_token="[SEP]", unk_token="<unk>",
                          sep_token="[SEP]", pad_token="<pad>", cls_token="[CLS]",
                          mask_token="[MASK]"),
    # DeBERTa's layout (encoderx/data/sentencepiece_vocabulary.py LAYOUTS['deberta']):
    # DebertaV2Tokenizer adds [MASK] after the pieces, as the vocabulary does.
    "sentencepiece:deberta": dict(bos_token="[CLS]", eos_token="[SEP]", unk_token="[UNK]",
                                  sep_token="[SEP]", pad_token="[PAD]", cls_token="[CLS]",
                                  mask_token="[MASK]"),
}


def _deberta_layout(vocab) -> bool:
  return vocab["kind"] == "sentencepiece" and vocab.get("layout") == "deberta"


def _copy_files(vocab, directory: str) -> None:
  path = resources.resolve(vocab["path"])
  if vocab["kind"] == "wordpiece":
    files_lib.copy(path, os.path.join(directory, "vocab.txt"))
  elif vocab["kind"] == "byte_bpe":
    for name in bpe_vocabulary.FILES:
      files_lib.copy(os.path.join(path, name), os.path.join(directory, name))
  else:
    name = "spm.model" if _deberta_layout(vocab) else "spiece.model"
    files_lib.copy(path, os.path.join(directory, name))


def _text_options(vocab) -> dict:
  """The tokenizer's text preparation, as encoderx's vocabulary does it."""
  if vocab["kind"] == "wordpiece":
    return dict(do_lower_case=vocab["lower_case"], strip_accents=vocab["strip_accents"],
                tokenize_chinese_chars=True)
  if vocab["kind"] == "byte_bpe":
    return dict(add_prefix_space=False, trim_offsets=True)
  if _deberta_layout(vocab):  # DebertaV2Tokenizer: no accent or space options
    return dict(do_lower_case=vocab["lower_case"], split_by_punct=False)
  return dict(do_lower_case=vocab["lower_case"], keep_accents=not vocab["strip_accents"],
              remove_space=True)


def write(vocab, tokenizer_class: str, directory: str, model_max_length: int) -> list[str]:
  """Writes the files of `vocab` (config.data.vocab's fields) into `directory`; returns
  their names."""
  before = set(os.listdir(directory))
  _copy_files(vocab, directory)
  special = SPECIAL_TOKENS["sentencepiece:deberta" if _deberta_layout(vocab)
                           else vocab["kind"]]
  if vocab["kind"] == "byte_bpe":  # RoBERTa's <mask> takes the space before it
    special = {**special, "mask_token": {"content": "<mask>", "lstrip": True,
                                         "rstrip": False, "normalized": False,
                                         "single_word": False, "special": True}}
  config = dict(tokenizer_class=tokenizer_class, model_max_length=model_max_length,
                **_text_options(vocab), **special)
  for name, content in (("tokenizer_config.json", config),
                        ("special_tokens_map.json", special)):
    with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
      json.dump(content, f, indent=2, ensure_ascii=False)
      f.write("\n")
  return sorted(set(os.listdir(directory)) - before)

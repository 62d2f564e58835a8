"""The tokenizer files of a run's vocabulary, as Hugging Face tokenizers read them.

The vocabulary's own files are copied (vocab.txt; vocab.json + merges.txt; spiece.model,
or spm.model for SentencePiece models of DeBERTa's layout)
and described by tokenizer_config.json (the family's tokenizer class and the text
preparation: lower-casing, accents) and special_tokens_map.json, so that
`AutoTokenizer.from_pretrained(DIR)` gives encoderx's ids (tests/test_export.py checks
it on the bundled corpus). The special tokens are the ones encoderx's vocabularies
require (encoderx/data/vocabulary.py, bpe_vocabulary.py, sentencepiece_vocabulary.py).

Byte-level BPE vocabularies of ModernBERT's and EuroBERT's layouts are written as their
released tokenizers are, a fast tokenizer's tokenizer.json (built with `tokenizers`: the
vocabulary's BPE model, ByteLevel pre-tokenizer and decoder, its special tokens, and the
layout's TemplateProcessing: `[CLS] A [SEP] B [SEP]`, `<|begin_of_text|> A
<|end_of_text|> ...`) with tokenizer_config.json (PreTrainedTokenizerFast) and
special_tokens_map.json: what `save_pretrained` of such a tokenizer writes.
"""
from __future__ import annotations

import json
import os

import tokenizers
from tokenizers import processors

from encoderx import files as files_lib
from encoderx.data import bpe_vocabulary, resources
from encoderx.data import fields as data_fields

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


# Byte-level BPE layouts written as tokenizer.json (a fast tokenizer), with the Hugging
# Face name of each role's token: ModernBERT's (answerdotai/ModernBERT-base's
# special_tokens_map.json) and EuroBERT's (EuroBERT/EuroBERT-210m's: bos, eos, mask, pad).
# Their [MASK] / <|mask|> takes the space before it (lstrip), as released.
TOKENIZER_JSON_LAYOUTS = {
    "bert": dict(cls="cls_token", sep="sep_token", pad="pad_token", mask="mask_token",
                 unk="unk_token"),
    "eurobert": dict(cls="bos_token", sep="eos_token", pad="pad_token", mask="mask_token"),
}


def _special_token(token: str, role: str):
  if role != "mask":
    return token
  return {"content": token, "lstrip": True, "rstrip": False, "normalized": False,
          "single_word": False, "special": True}


def fast_tokenizer(vocabulary: bpe_vocabulary.ByteLevelBpeVocabulary) -> tokenizers.Tokenizer:
  """The vocabulary's `tokenizers` pipeline with its special tokens (added, special, in
  id order) and its layout's template: `cls A sep` and `cls A sep B sep` (RoBERTa's
  layout: two separators between A and B), B of type 1."""
  tokenizer = vocabulary.tokenizer()
  roles = sorted(((vocabulary.token_to_id(t), role, t) for role, t in vocabulary.ROLES.items()))
  added = {}
  for _, role, token in roles:  # a token of two roles (EuroBERT's end and pad) once
    added.setdefault(token, tokenizers.AddedToken(
        token, lstrip=role == "mask", rstrip=False, normalized=False, single_word=False,
        special=True))
  tokenizer.add_special_tokens(list(added.values()))
  cls, sep = vocabulary.ROLES["cls"], vocabulary.ROLES["sep"]
  separators = " ".join([sep] * vocabulary.pair_separators)
  tokenizer.post_processor = processors.TemplateProcessing(
      single=f"{cls} $A {sep}", pair=f"{cls} $A {separators} $B:1 {sep}:1",
      special_tokens=[(cls, vocabulary.cls_id), (sep, vocabulary.sep_id)])
  return tokenizer


def _write_tokenizer_json(vocab, tokenizer_class: str, directory: str,
                          model_max_length: int) -> tuple[dict, dict]:
  """tokenizer.json; returns (tokenizer_config.json, special_tokens_map.json)."""
  vocabulary = bpe_vocabulary.ByteLevelBpeVocabulary(vocab["path"],
                                                     data_fields.vocab_layout(vocab))
  fast_tokenizer(vocabulary).save(os.path.join(directory, bpe_vocabulary.TOKENIZER_FILE))
  names = TOKENIZER_JSON_LAYOUTS[vocabulary.layout]
  special = {names[role]: _special_token(token, role)
             for role, token in vocabulary.ROLES.items() if role in names}
  config = dict(tokenizer_class=tokenizer_class, model_max_length=model_max_length,
                clean_up_tokenization_spaces=True,
                model_input_names=["input_ids", "attention_mask"], **special)
  return config, special


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
  if vocab["kind"] == "byte_bpe" and data_fields.vocab_layout(vocab) in TOKENIZER_JSON_LAYOUTS:
    config, special = _write_tokenizer_json(vocab, tokenizer_class, directory,
                                            model_max_length)
    _write_json(directory, config, special)
    return sorted(set(os.listdir(directory)) - before)
  _copy_files(vocab, directory)
  special = SPECIAL_TOKENS["sentencepiece:deberta" if _deberta_layout(vocab)
                           else vocab["kind"]]
  if vocab["kind"] == "byte_bpe":  # RoBERTa's <mask> takes the space before it
    special = {**special, "mask_token": {"content": "<mask>", "lstrip": True,
                                         "rstrip": False, "normalized": False,
                                         "single_word": False, "special": True}}
  config = dict(tokenizer_class=tokenizer_class, model_max_length=model_max_length,
                **_text_options(vocab), **special)
  _write_json(directory, config, special)
  return sorted(set(os.listdir(directory)) - before)


def _write_json(directory: str, config: dict, special: dict) -> None:
  for name, content in (("tokenizer_config.json", config),
                        ("special_tokens_map.json", special)):
    with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
      json.dump(content, f, indent=2, ensure_ascii=False)
      f.write("\n")

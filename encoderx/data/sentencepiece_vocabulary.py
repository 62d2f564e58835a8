"""SentencePiece vocabulary (ALBERT, DeBERTa) as a `seqio.Vocabulary`, and training one.

`SentencePieceVocabulary` is seqio's (the model file, tensorflow-text's tokenizer inside
tf.data) with the interface encoderx's data path and objectives use: the ids of the
special tokens, `special_ids`, and `tokenize_words_tf` (pieces grouped by word; a word
starts at a piece that begins with '▁').

Text is prepared as Hugging Face `AlbertTokenizer` (and google-research/albert) do
before the model sees it: `` and '' become ", accents are stripped (NFKD, marks
dropped) unless `strip_accents=False`, and text is lower-cased unless
`lower_case=False`; then the model's own normalizer runs (nmt_nfkc_cf for the models
trained here). The ids equal Hugging Face `AlbertTokenizer`'s (tested on Austen text).
google-research/albert's tokenizer also re-splits pieces that end in a digit and a comma
('▁7,'); transformers 5 no longer does, and models trained here have no such pieces
(SentencePiece keeps digits apart from other characters).

Two layouts of the special pieces (`layout`, config `data.vocab.layout`; LAYOUTS):
'albert': <pad>=0, <unk>=1, [CLS]=2, [SEP]=3, [MASK]=4 (control symbols: never produced
from text), no BOS/EOS. 'deberta' (DeBERTa v2/v3's spm.model, Hugging Face
`DebertaV2Tokenizer`): [PAD]=0, [CLS]=1, [SEP]=2, [UNK]=3 and [MASK] not a piece but the
id after the last one (128000 in deberta-v3's 128,000 pieces), as DeBERTa's
SPMTokenizer and DebertaV2Tokenizer add it; its text is prepared without ALBERT's quote
rewriting (lower-casing and accent stripping stay options; DeBERTa uses neither). The
model's own normalizer then runs, as in DeBERTa's SPMTokenizer (sentencepiece itself).
transformers 5's DebertaV2Tokenizer skips that normalizer (it applies NFC only), so its
ids differ on the characters NFKC changes (ligatures, full-width forms, circled
digits); elsewhere they are equal (tested on Austen text).

Train one: `python -m encoderx.data.sentencepiece_vocabulary --files 'corpus/*.txt'
--size 30000 --output spiece [--layout deberta]` (writes spiece.model and spiece.vocab).
"""
from __future__ import annotations

import dataclasses
import io
import os

import numpy as np
import seqio
import sentencepiece
import tensorflow as tf
import tensorflow_text as tf_text
from google.protobuf import message

from encoderx import files as files_lib
from encoderx.data import alignment, resources
from encoderx.data.vocabulary import VocabularyError, check_training_files, training_cli

# AlbertTokenizer's quote replacements, before anything else (layouts with albert_quotes).
QUOTE_REPLACEMENTS = (("``", '"'), ("''", '"'))
WORD_START = "▁"


@dataclasses.dataclass(frozen=True)
class Layout:
  """Where a family's special pieces are and how its tokenizer prepares text."""
  pad: str
  unk: str
  mask_after_pieces: bool  # [MASK] is no piece: its id is the piece count (DeBERTa)
  albert_quotes: bool  # `` and '' become " before tokenizing (AlbertTokenizer)
  trainer_flags: dict  # SentencePieceTrainer's flags that give the layout


LAYOUTS = {
    "albert": Layout("<pad>", "<unk>", mask_after_pieces=False, albert_quotes=True,
                     trainer_flags=dict(pad_id=0, unk_id=1, bos_id=-1, eos_id=-1,
                                        control_symbols=["[CLS]", "[SEP]", "[MASK]"])),
    # microsoft/DeBERTa DeBERTa/deberta/spm_tokenizer.py: [CLS] and [SEP] are the
    # model's BOS and EOS pieces; [MASK] is added after the pieces.
    "deberta": Layout("[PAD]", "[UNK]", mask_after_pieces=True, albert_quotes=False,
                      trainer_flags=dict(pad_id=0, pad_piece="[PAD]", bos_id=1,
                                         bos_piece="[CLS]", eos_id=2, eos_piece="[SEP]",
                                         unk_id=3, unk_piece="[UNK]")),
}


@dataclasses.dataclass
class _LoadedModel:
  """What seqio keeps in `_model` (tokenizer, sp_model), plus the word-start table.

  seqio drops `_model` when pickling and comparing vocabularies, so derived data kept
  here never makes two equal vocabularies differ.
  """
  tokenizer: sentencepiece.SentencePieceProcessor
  sp_model: bytes  # the serialized ModelProto
  starts_word: np.ndarray  # [pieces] bool: the piece begins with '▁'


class SentencePieceVocabulary(seqio.SentencePieceVocabulary):
  """A SentencePiece model file with ALBERT's or DeBERTa's special pieces (see the
  module docstring)."""

  def __init__(self, path: str, lower_case: bool = True, strip_accents: bool = True,
               layout: str = "albert"):
    self.path = resources.resolve(path)
    self.lower_case = lower_case
    self.strip_accents = strip_accents
    self.layout = layout
    super().__init__(self.path)
    try:
      tokenizer = self.tokenizer  # loads now, so that a bad file fails here
    except (OSError, RuntimeError, message.DecodeError, tf.errors.OpError) as error:
      raise VocabularyError(f"cannot read SentencePiece model '{path}': {error}") from None
    # SentencePiece itself requires an unknown piece; encoderx needs the others.
    spec = LAYOUTS[layout]
    needed = [spec.pad, "[CLS]", "[SEP]"] + ([] if spec.mask_after_pieces else ["[MASK]"])
    missing = [piece for piece in needed[1:] if not self._has_piece(piece)]
    missing += [spec.pad] if tokenizer.pad_id() < 0 else []
    if missing:
      raise VocabularyError(
          f"SentencePiece model '{path}' lacks the special pieces {missing} of the "
          f"{layout!r} layout ({', '.join(needed)}, as data.vocab.layout says). Train "
          "one with `python -m encoderx.data.sentencepiece_vocabulary --help`.")

  def _model_context(self) -> _LoadedModel:
    if self._model is None:
      loaded = super()._model_context()  # seqio reads the file (gfile paths too)
      tokenizer = loaded.tokenizer
      starts_word = np.array([tokenizer.id_to_piece(i).startswith(WORD_START)
                              for i in range(tokenizer.get_piece_size())], bool)
      self._model = _LoadedModel(tokenizer, loaded.sp_model, starts_word)
    return self._model

  def _has_piece(self, piece: str) -> bool:
    return self.tokenizer.id_to_piece(self.tokenizer.piece_to_id(piece)) == piece

  @property
  def _appended_mask(self) -> bool:
    """[MASK] follows the pieces (DeBERTa's layout, a model without a [MASK] piece)."""
    return LAYOUTS[self.layout].mask_after_pieces and not self._has_piece("[MASK]")

  @property
  def _base_vocab_size(self) -> int:
    return self.tokenizer.get_piece_size() + int(self._appended_mask)

  @property
  def vocab_size(self) -> int:
    return self._base_vocab_size

  # --- ids of the special tokens -----------------------------------------------------
  def token_to_id(self, token: str) -> int:
    if token == "[MASK]" and self._appended_mask:
      return self.tokenizer.get_piece_size()
    if not self._has_piece(token):
      raise KeyError(token)
    return self.tokenizer.piece_to_id(token)

  def id_to_token(self, token_id: int) -> str:
    if 0 <= token_id < self.tokenizer.get_piece_size():
      return self.tokenizer.id_to_piece(token_id)
    if self._appended_mask and token_id == self.mask_id:
      return "[MASK]"
    return self.tokenizer.id_to_piece(self.unk_id)

  @property
  def pad_id(self) -> int:
    return self.tokenizer.pad_id()

  @property
  def cls_id(self) -> int:
    return self.token_to_id("[CLS]")

  @property
  def sep_id(self) -> int:
    return self.token_to_id("[SEP]")

  @property
  def mask_id(self) -> int:
    return self.token_to_id("[MASK]")

  @property
  def eos_id(self) -> None:
    # seqio's base reads the model's EOS (-1 in ALBERT's models) and cuts decoding at
    # it; encoders mark ends with [SEP], which encode never adds.
    return None

  @property
  def bos_id(self) -> None:
    return None

  @property
  def special_ids(self) -> tuple[int, ...]:
    """Ids that masking never chooses and never samples as a random replacement:
    control pieces (padding, [CLS], [SEP], [MASK]), the unknown piece, unused pieces and
    an appended [MASK]."""
    tokenizer = self.tokenizer
    return tuple(i for i in range(tokenizer.get_piece_size())
                 if tokenizer.is_control(i) or tokenizer.is_unknown(i)
                 or tokenizer.is_unused(i)) + ((self.mask_id,) if self._appended_mask else ())

  # --- TensorFlow ----------------------------------------------------------------------
  def _prepare_tf(self, text: tf.Tensor) -> tf.Tensor:
    """The layout's tokenizer's steps before the model's normalizer (module docstring)."""
    if LAYOUTS[self.layout].albert_quotes:
      text = tf.strings.regex_replace(
          text, "|".join(old for old, _ in QUOTE_REPLACEMENTS), '"')
    if self.strip_accents:
      text = tf_text.normalize_utf8(text, "NFKD")
      text = tf.strings.regex_replace(text, r"\p{M}", "")
    if self.lower_case:
      text = tf.strings.lower(text, encoding="utf-8")
    return text

  def _group_words(self, pieces: tf.RaggedTensor) -> tf.RaggedTensor:
    """[..., pieces] -> [..., words, pieces]: a word starts at a '▁' piece (or a row's
    first piece)."""
    if pieces.ragged_rank > 1:
      return pieces.with_values(self._group_words(pieces.values))
    ids, rows = pieces.values, pieces.value_rowids()
    first_in_row = tf.range(tf.size(ids, out_type=tf.int64)) == tf.gather(
        pieces.row_starts(), rows)
    starts = tf.gather(tf.constant(self._model_context().starts_word), ids) | first_in_row
    words = tf.RaggedTensor.from_row_starts(ids, tf.where(starts)[:, 0])
    words_per_row = tf.math.unsorted_segment_sum(tf.cast(starts, tf.int64), rows,
                                                 pieces.nrows())
    return tf.RaggedTensor.from_row_lengths(words, words_per_row)

  def tokenize_words_tf(self, text: tf.Tensor) -> tf.RaggedTensor:
    """Pieces grouped by word: text [...] -> int32 [..., words, pieces]."""
    text = tf.convert_to_tensor(text, tf.string)
    if text.shape.rank == 0:
      return self.tokenize_words_tf(tf.expand_dims(text, 0))[0]
    pieces = self.tf_tokenizer.tokenize(self._prepare_tf(text))
    return self._group_words(tf.cast(pieces, tf.int32))

  def _encode_tf(self, s: tf.Tensor) -> tf.Tensor:
    return self.tokenize_words_tf(s).merge_dims(-2, -1)

  # --- Python --------------------------------------------------------------------------
  def _encode(self, s: str) -> list[int]:
    return self._encode_tf(tf.constant(s)).numpy().tolist()

  def _prepare_char(self, char: str) -> str:
    """_prepare_tf's accent stripping and lower-casing of one character (in Python)."""
    if self.strip_accents:
      char = alignment.drop_marks(char, "NFKD", "M")
    return char.lower() if self.lower_case else char

  def encode_with_offsets(self, texts: list[str]) -> list[tuple[list[int], list]]:
    """[(ids, [(start, end) of each piece in the text])] of each text: SentencePiece's
    byte offsets into the prepared text (it maps its own normalization back), mapped
    back through the preparation (encoderx/data/alignment.py), without the space a
    piece carries before its word."""
    results = []
    for text in texts:
      prepared = alignment.Normalized.of(text, self._prepare_char, QUOTE_REPLACEMENTS
                                         if LAYOUTS[self.layout].albert_quotes else ())
      pieces = self.tokenizer.EncodeAsProto(prepared.text).pieces
      spans = prepared.char_offsets_of_bytes([(p.begin, p.end) for p in pieces])
      results.append(([p.id for p in pieces], alignment.strip_whitespace(text, spans)))
    return results

  def __hash__(self):
    return hash((self.path, self.lower_case, self.strip_accents, self.layout))


def _has_text(path: str) -> bool:
  with files_lib.open_text(path, errors="replace") as f:
    return any(line.strip() for line in f)  # stops at the first line with text


def train_sentencepiece(files: list[str], output_prefix: str, vocab_size: int = 30000,
                        lower_case: bool = True, character_coverage: float = 0.99995,
                        input_sentence_size: int = 10_000_000,
                        layout: str = "albert") -> SentencePieceVocabulary:
  """Trains a unigram model like ALBERT's; writes <output_prefix>.model and .vocab.

  ALBERT's flags (google-research/albert README): unigram, <pad>=0, <unk>=1, no BOS/EOS,
  [CLS] [SEP] [MASK] as control symbols, character coverage 0.99995, at most 10M
  sampled lines. The normalization is nmt_nfkc_cf (lower-cases, as albert-base-v2) or,
  with `lower_case=False`, nmt_nfkc. ALBERT's user-defined symbols (punctuation) are
  left out: Hugging Face's converted tokenizer does not split them first, so ids
  would differ from `AlbertTokenizer`'s. `layout='deberta'` gives DeBERTa's special
  pieces instead ([PAD]=0, [CLS]=1, [SEP]=2, [UNK]=3; [MASK] after the pieces).
  `vocab_size` counts the pieces.
  """
  check_training_files(files)
  if not any(_has_text(f) for f in files):
    raise VocabularyError(f"no text to train a vocabulary from in {files}")
  model = io.BytesIO()
  try:
    sentencepiece.SentencePieceTrainer.train(
        input=[files_lib.local_copy(f) for f in files], model_writer=model,
        vocab_size=vocab_size, model_type="unigram",
        normalization_rule_name="nmt_nfkc_cf" if lower_case else "nmt_nfkc",
        **LAYOUTS[layout].trainer_flags, character_coverage=character_coverage,
        input_sentence_size=input_sentence_size,
        shuffle_input_sentence=True, num_threads=os.cpu_count() or 1, minloglevel=2)
  except RuntimeError as error:  # e.g. a vocab_size the corpus cannot fill
    raise VocabularyError(f"cannot train a SentencePiece model on {files}: "
                          f"{str(error).strip()}") from None
  tokenizer = sentencepiece.SentencePieceProcessor(model_proto=model.getvalue())
  listing = "".join(f"{tokenizer.id_to_piece(i)}\t{tokenizer.get_score(i):g}\n"
                    for i in range(tokenizer.get_piece_size()))
  files_lib.write_atomically(output_prefix + ".vocab", listing)  # for people
  files_lib.write_atomically(output_prefix + ".model", model.getvalue())
  return SentencePieceVocabulary(output_prefix + ".model", lower_case=lower_case,
                                 strip_accents=layout == "albert", layout=layout)


def main(argv=None):
  training_cli(argv, "Train an ALBERT (or DeBERTa) SentencePiece model.",
               "output prefix: writes PREFIX.model and PREFIX.vocab", 30000,
               lambda files, output, size, lower_case, layout: train_sentencepiece(
                   files, output, vocab_size=size, lower_case=lower_case, layout=layout),
               cased_help="keep case (nmt_nfkc)",
               options={"--layout": dict(choices=tuple(LAYOUTS), default="albert",
                                         help="the special pieces: ALBERT's or DeBERTa's")})


if __name__ == "__main__":
  main()

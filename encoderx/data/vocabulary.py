"""WordPiece vocabulary (BERT) as a `seqio.Vocabulary`, and training one from text.

Tokenization follows BERT's rules (google-research/bert tokenization.py, and Hugging Face
`BertTokenizer`): invalid and control characters are dropped, text is optionally
lower-cased and stripped of accents, split on whitespace and punctuation with every CJK
character its own word, then split into the longest-match-first word pieces of the
vocabulary. The splitting and word-piece steps are tensorflow-text's, so that the same
code runs inside tf.data (seqio) and eagerly.

seqio ships a `BertWordPieceVocabulary`, but its `encode_tf` pads the word dimension with
id 0 (inserting [PAD] ids inside sentences when words split into different numbers of
pieces), it hard-codes [CLS]=101 and [SEP]=102, and it cannot strip accents without
lower-casing; hence this class.

Train one: `python -m encoderx.data.vocabulary --files 'corpus/*.txt' --size 30522
--output vocab.txt`.
"""
from __future__ import annotations

import argparse
import collections
import functools
import logging
import os
import random
import tempfile
import unicodedata

import seqio
import tensorflow as tf
import tensorflow_text as tf_text
from tensorflow_text.python.ops import bert_tokenizer

from encoderx import errors
from encoderx import files as files_lib
from encoderx.data import alignment, resources

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# A trained vocabulary whose [UNK] rate on a sample of its corpus is above this is
# reported as a warning.
UNKNOWN_RATE_WARNING = 0.01

logger = logging.getLogger("encoderx")


class VocabularyError(errors.UserError, ValueError):
  """A vocabulary file that cannot be used."""


class _BasicTokenizer(bert_tokenizer.BasicTokenizer):
  """tensorflow-text's BERT basic tokenizer with lower-casing and accent stripping as
  independent options, both done the way Python's str.lower() and Hugging Face do
  (tensorflow-text folds case fully, turning 'ß' into 'ss')."""

  def __init__(self, lower_case: bool, strip_accents: bool):
    super().__init__(lower_case=False)
    self._lower = lower_case
    self._strip = strip_accents

  def tokenize_with_offsets(self, text_input):
    # Hugging Face drops U+0000, U+FFFD and control characters (all of category C but
    # tab and newlines) before anything else; tensorflow-text only blanks Cc and Cf.
    text_input = tf.strings.regex_replace(text_input, r"[\x{0}\x{FFFD}]|[^\PC\t\n\r]", "")
    if self._lower:
      text_input = tf.strings.lower(text_input, encoding="utf-8")
    if self._strip:
      text_input = tf_text.normalize_utf8(text_input, "NFD")
      text_input = tf.strings.regex_replace(text_input, r"\p{Mn}", "")
    return super().tokenize_with_offsets(text_input)


class TokenListVocabulary(seqio.Vocabulary):
  """A vocabulary that is a list of tokens (the index is the id), with the special tokens
  encoderx needs named by role in ROLES: pad, unk, cls (sequence start), sep
  (separator/end) and mask. Looked up by name, so their ids may be anything; two roles
  may share a token (EuroBERT pads with its end token), and unk may be absent (a
  byte-level vocabulary has a token for every byte)."""
  ROLES: dict[str, str] = {}

  def __init__(self, tokens: list[str]):
    self.tokens = tokens
    self._ids = {token: i for i, token in enumerate(tokens)}
    super().__init__(extra_ids=0)

  def token_to_id(self, token: str) -> int:
    return self._ids[token]

  def id_to_token(self, token_id: int) -> str:
    if 0 <= token_id < len(self.tokens):
      return self.tokens[token_id]
    return self.ROLES.get("unk", "")

  @property
  def pad_id(self) -> int:
    return self._ids[self.ROLES["pad"]]

  @property
  def unk_id(self) -> int | None:
    return self._ids[self.ROLES["unk"]] if "unk" in self.ROLES else None

  @property
  def cls_id(self) -> int:
    return self._ids[self.ROLES["cls"]]

  @property
  def sep_id(self) -> int:
    return self._ids[self.ROLES["sep"]]

  @property
  def mask_id(self) -> int:
    return self._ids[self.ROLES["mask"]]

  @property
  def eos_id(self) -> None:
    return None  # encoders mark ends with a separator, which encode never adds.

  @property
  def special_ids(self) -> tuple[int, ...]:
    """Ids that masking never chooses and never samples as a random replacement."""
    return tuple(sorted({self._ids[token] for token in self.ROLES.values()}))

  @property
  def _base_vocab_size(self) -> int:
    return len(self.tokens)


class WordPieceVocabulary(TokenListVocabulary):
  """A BERT `vocab.txt` (one token per line, the line number is the id)."""
  ROLES = dict(zip(("pad", "unk", "cls", "sep", "mask"), SPECIAL_TOKENS))

  def __init__(self, path: str, lower_case: bool = True, strip_accents: bool | None = None):
    self.path = resources.resolve(path)
    try:
      tokens = [line.rstrip("\r") for line in files_lib.read_text(self.path).split("\n")]
    except (OSError, UnicodeDecodeError) as error:
      raise VocabularyError(f"cannot read WordPiece vocabulary '{path}': {error}") from None
    while tokens and not tokens[-1]:
      tokens.pop()
    missing = [t for t in SPECIAL_TOKENS if t not in tokens]
    if missing:
      raise VocabularyError(
          f"WordPiece vocabulary '{path}' lacks the special tokens {missing}; a BERT "
          "vocab.txt has one token per line including [PAD] [UNK] [CLS] [SEP] [MASK].")
    self.lower_case = lower_case
    self.strip_accents = lower_case if strip_accents is None else strip_accents
    super().__init__(tokens)

  @property
  def special_ids(self) -> tuple[int, ...]:
    """The special tokens and BERT's reserved [unusedN] slots."""
    return tuple(i for i, t in enumerate(self.tokens)
                 if t in SPECIAL_TOKENS or (t.startswith("[unused") and t.endswith("]")))

  # --- TensorFlow ----------------------------------------------------------------------
  @functools.cached_property
  def _tf_tokenizer(self) -> tf_text.BertTokenizer:
    # The lookup table is created eagerly even when first used inside a tf.data
    # function, so that every later graph can use it.
    with tf.init_scope():
      table = tf.lookup.StaticHashTable(
          tf.lookup.KeyValueTensorInitializer(
              tf.constant(self.tokens), tf.range(len(self.tokens), dtype=tf.int64)),
          default_value=self.unk_id)
      return tf_text.BertTokenizer(
          table, suffix_indicator="##", max_bytes_per_word=100, token_out_type=tf.int32,
          unknown_token="[UNK]",
          basic_tokenizer_class=lambda *_: _BasicTokenizer(self.lower_case,
                                                           self.strip_accents))

  def _normalize_char(self, char: str) -> str:
    """_BasicTokenizer's preparation of one character (in Python)."""
    if char in "\x00\ufffd" or (unicodedata.category(char).startswith("C")
                                and char not in "\t\n\r"):
      return ""
    if self.lower_case:
      char = char.lower()
    return alignment.drop_marks(char, "NFD", "Mn") if self.strip_accents else char

  def encode_with_offsets(self, texts: list[str]) -> list[tuple[list[int], list]]:
    """[(ids, [(start, end) of each piece in the text])] of each text: the pieces of
    tensorflow-text's tokenizer, run on the text prepared in Python (so that its byte
    offsets map back through the preparation, encoderx/data/alignment.py)."""
    prepared = [alignment.Normalized.of(text, self._normalize_char) for text in texts]
    if not prepared:
      return []
    ids, starts, ends = self._tf_tokenizer.tokenize_with_offsets(
        tf.constant([p.text for p in prepared]))
    flat = lambda x: x.merge_dims(1, 2).to_list()  # pylint: disable=unnecessary-lambda-assignment
    return [(row, text.char_offsets_of_bytes(zip(first, last)))
            for text, row, first, last in zip(prepared, flat(ids), flat(starts), flat(ends))]

  def tokenize_words_tf(self, text: tf.Tensor) -> tf.RaggedTensor:
    """Word pieces grouped by word: text [...] -> int32 [..., words, pieces]."""
    text = tf.convert_to_tensor(text, tf.string)
    if text.shape.rank == 0:  # tensorflow-text gives scalars a batch dimension
      return self._tf_tokenizer.tokenize(tf.expand_dims(text, 0))[0]
    return self._tf_tokenizer.tokenize(text)

  def _encode_tf(self, s: tf.Tensor) -> tf.Tensor:
    return self.tokenize_words_tf(s).merge_dims(-2, -1)

  def _decode_tf(self, ids: tf.Tensor) -> tf.Tensor:
    words = self._tf_tokenizer.detokenize(tf.expand_dims(ids, 0))[0]
    return tf.strings.reduce_join(words, separator=" ")

  # --- Python --------------------------------------------------------------------------
  def _encode(self, s: str) -> list[int]:
    return self._encode_tf(tf.constant(s)).numpy().tolist()

  def _decode(self, ids) -> str:
    """Tokens joined as BERT prints them: word pieces merged, special tokens kept."""
    text = " ".join(self.id_to_token(int(i)) for i in ids)
    return text.replace(" ##", "")

  def __eq__(self, other):
    return (isinstance(other, WordPieceVocabulary) and self.tokens == other.tokens
            and self.lower_case == other.lower_case
            and self.strip_accents == other.strip_accents)

  def __hash__(self):
    return hash((len(self.tokens), self.lower_case, self.strip_accents))


def check_training_files(paths: list[str]) -> None:
  missing = [f for f in paths if not files_lib.path(f).is_file()]
  if missing:
    raise VocabularyError(f"cannot train a vocabulary: no such file(s) {missing}")


def save_model_files(tokenizer, outputs: dict[str, str]) -> None:
  """Writes a trained `tokenizers` model: {file name it saves -> where it goes}.

  The files are saved to a scratch directory, then each written atomically (local,
  file:// or gs://), so that a reader never sees a half-written file.
  """
  with tempfile.TemporaryDirectory() as scratch:
    tokenizer.save_model(scratch)
    for name, path in outputs.items():
      files_lib.write_atomically(path, files_lib.read_bytes(os.path.join(scratch, name)))


def _alphabet_and_sample(files: list[str], normalize, sample_lines: int, seed: int = 0
                         ) -> tuple[collections.Counter, list[str]]:
  """Character counts of the corpus as the tokenizer normalizes it (whitespace left
  out), and a uniform sample of its non-blank lines (reservoir sampling, seeded)."""
  counts, sample, seen = collections.Counter(), [], 0
  rng = random.Random(seed)
  for path in files:
    with files_lib.open_text(path, errors="replace") as f:
      for line in f:
        if not line.strip():
          continue
        counts.update(normalize(line))
        seen += 1
        if len(sample) < sample_lines:
          sample.append(line)
        elif (index := rng.randrange(seen)) < sample_lines:
          sample[index] = line
  for space in [c for c in counts if c.isspace()]:
    del counts[space]
  return counts, sample


def unknown_rate(tokenizer, lines: list[str]) -> float:
  """The fraction of the tokens of `lines` that are [UNK] (a `tokenizers` tokenizer)."""
  unknown = tokenizer.token_to_id("[UNK]")
  encodings = tokenizer.encode_batch(lines, add_special_tokens=False)
  total = sum(len(e.ids) for e in encodings)
  return sum(e.ids.count(unknown) for e in encodings) / max(total, 1)


def train_wordpiece(files: list[str], output: str, vocab_size: int = 30522,
                    lower_case: bool = True, strip_accents: bool | None = None,
                    min_frequency: int = 2, sample_lines: int = 5000
                    ) -> WordPieceVocabulary:
  """Trains a WordPiece vocabulary with Hugging Face `tokenizers` and writes vocab.txt.

  The alphabet (the single characters, which every word falls back to) is sized from
  the corpus: every character seen at least `min_frequency` times, as many as the
  vocabulary holds. The trainer's default keeps only the 1,000 most frequent, which on
  Chinese text (each CJK character a word of its own) leaves most characters [UNK].
  The [UNK] rate of the result on a sample of `sample_lines` corpus lines is logged, as
  a warning above UNKNOWN_RATE_WARNING.
  """
  from tokenizers import BertWordPieceTokenizer  # pylint: disable=g-import-not-at-top

  check_training_files(files)
  tokenizer = BertWordPieceTokenizer(
      lowercase=lower_case,
      strip_accents=lower_case if strip_accents is None else strip_accents,
      clean_text=True, handle_chinese_chars=True)
  counts, sample = _alphabet_and_sample(files, tokenizer.normalizer.normalize_str,
                                        sample_lines)
  frequent = sum(1 for count in counts.values() if count >= min_frequency)
  alphabet = max(1, min(frequent, vocab_size - len(SPECIAL_TOKENS)))
  tokenizer.train([files_lib.local_copy(f) for f in files], vocab_size=vocab_size,
                  min_frequency=min_frequency, limit_alphabet=alphabet,
                  special_tokens=list(SPECIAL_TOKENS),
                  show_progress=False, wordpieces_prefix="##")
  if tokenizer.get_vocab_size() <= len(SPECIAL_TOKENS):
    raise VocabularyError(f"no text to train a vocabulary from in {files}")
  save_model_files(tokenizer, {"vocab.txt": output})
  rate = unknown_rate(tokenizer, sample)
  report = (f"{output}: {tokenizer.get_vocab_size()} pieces, alphabet of {alphabet} "
            f"characters ({len(counts)} distinct in the corpus); [UNK] is {rate:.2%} of the "
            f"tokens of {len(sample)} sampled lines")
  if rate > UNKNOWN_RATE_WARNING:
    logger.warning("%s, above %.0f%%: the vocabulary misses characters or words of this "
                   "corpus; use a larger --size.", report, 100 * UNKNOWN_RATE_WARNING)
  else:
    logger.info("%s.", report)
  return WordPieceVocabulary(output, lower_case=lower_case, strip_accents=strip_accents)


def training_cli(argv, description: str, output_help: str, default_size: int, train,
                 cased_help: str | None = None, options: dict | None = None) -> None:
  """The command line of a vocabulary trainer: --files --output --size [--cased] and
  the trainer's own `options` ({flag: argparse keywords}).

  `train(files, output, vocab_size, lower_case, *option values)` trains and returns the
  vocabulary. Bad files or sizes end with a one-line error, not a traceback.
  """
  parser = argparse.ArgumentParser(description=description)
  parser.add_argument("--files", required=True, help="comma-separated text files or globs")
  parser.add_argument("--output", required=True, help=output_help)
  parser.add_argument("--size", type=int, default=default_size)
  if cased_help:
    parser.add_argument("--cased", action="store_true", help=cased_help)
  for flag, keywords in (options or {}).items():
    parser.add_argument(flag, **keywords)
  args = parser.parse_args(argv)
  values = [getattr(args, flag.lstrip("-").replace("-", "_")) for flag in options or {}]
  logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
  try:
    files = files_lib.resolve_patterns(args.files, "--files")
    vocabulary = train(files, args.output, args.size, not getattr(args, "cased", False),
                       *values)
  except (errors.ConfigError, VocabularyError) as error:
    parser.error(str(error))
  print(f"wrote {args.output}: {vocabulary.vocab_size} tokens")


def main(argv=None):
  training_cli(argv, "Train a BERT WordPiece vocab.txt.", "where to write vocab.txt", 30522,
               lambda files, output, size, lower_case: train_wordpiece(
                   files, output, vocab_size=size, lower_case=lower_case),
               cased_help="keep case and accents")


if __name__ == "__main__":
  main()

"""Byte-level BPE vocabulary (GPT-2, RoBERTa) as a `seqio.Vocabulary`, and training one.

A vocabulary is a directory holding `vocab.json` (token -> id) and `merges.txt` (the
merge rules, most frequent first): the files of Hugging Face's `roberta-base` and of
`ByteLevelBPETokenizer.save_model`. Tokenization is Hugging Face `tokenizers`' byte-level
BPE, built as `transformers.RobertaTokenizer` builds it (GPT-2's pre-tokenizing regex, no
prefix space, no unknown token: every byte has a token), so its ids are that tokenizer's
(tested). Special tokens are looked up by name, so roberta-base's ids (<s>=0, <pad>=1,
</s>=2, <unk>=3, <mask>=50264) and those of a vocabulary trained here (<s> <pad> </s>
<unk> <mask> = 0..4, Hugging Face's recipe for a new RoBERTa) both work. Text is never
parsed for special tokens: '<mask>' in a corpus is four ordinary tokens, as '[MASK]' is
for the WordPiece vocabulary.

Tokens carry the space before a word ('Ġword'), so a sentence encoded alone differs from
the same sentence inside running text ('word'); `tokens_carry_leading_space` tells the
preprocessor to hand over sentences with the whitespace that precedes them.

There is no byte-level BPE in TensorFlow (tensorflow-text has WordPiece and
SentencePiece), so inside tf.data the tokenizer runs through `tf.numpy_function`, one
call per tensor of texts (a document's sentences), which `tokenizers` encodes in
parallel outside the GIL. BPE has no randomness here (no dropout): the ids are a pure
function of the text.

Train one: `python -m encoderx.data.bpe_vocabulary --files 'corpus/*.txt' --size 50265
--output vocab_dir/`.
"""
from __future__ import annotations

import itertools
import json
import os

import numpy as np
import tensorflow as tf
import tokenizers
from tokenizers import decoders, models, pre_tokenizers

from encoderx import files as files_lib
from encoderx.data import alignment, resources
from encoderx.data.vocabulary import (TokenListVocabulary, VocabularyError,
                                      check_training_files, save_model_files,
                                      training_cli)

# RoBERTa's special tokens, in the order of fairseq's dictionary (<s> <pad> </s> <unk>);
# a trained vocabulary puts <mask> right after them.
SPECIAL_TOKENS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")
FILES = ("vocab.json", "merges.txt")


def _read_files(path: str, directory: str) -> tuple[dict[str, int], list[tuple[str, str]]]:
  """vocab.json and merges.txt, checked: tokenizers panics on merges outside the vocab."""
  given = files_lib.path(directory)
  missing = [name for name in FILES if not (given / name).is_file()]
  if missing:
    problem = ("it does not exist" if not given.is_dir()
               else f"it lacks {' and '.join(missing)}")
    raise VocabularyError(f"byte-level BPE vocabulary '{path}' must be a directory holding "
                          f"vocab.json and merges.txt; {problem}.")
  try:
    local = files_lib.local_copy(directory)  # tokenizers reads local files only
    vocab, merges = models.BPE.read_file(*(os.path.join(local, n) for n in FILES))
  except Exception as error:  # pylint: disable=broad-except  (tokenizers raises Exception)
    raise VocabularyError(f"cannot read byte-level BPE vocabulary '{path}': {error}") from None
  if sorted(vocab.values()) != list(range(len(vocab))):
    raise VocabularyError(f"byte-level BPE vocabulary '{path}': the ids of vocab.json must "
                          f"be 0..{len(vocab) - 1}, each once.")
  missing = [t for t in SPECIAL_TOKENS if t not in vocab]
  missing += [f"byte symbol {symbol!r}" for symbol in pre_tokenizers.ByteLevel.alphabet()
              if symbol not in vocab]
  if missing:
    raise VocabularyError(
        f"byte-level BPE vocabulary '{path}' lacks {missing[:8]}"
        f"{f' and {len(missing) - 8} more' if len(missing) > 8 else ''}; a RoBERTa/GPT-2 "
        "vocab.json has the 256 byte symbols and <s> <pad> </s> <unk> <mask>.")
  unknown = next(((a, b) for a, b in merges
                  if a not in vocab or b not in vocab or a + b not in vocab), None)
  if unknown:
    raise VocabularyError(f"byte-level BPE vocabulary '{path}': merges.txt merges "
                          f"{unknown} into tokens that vocab.json lacks; the two files do "
                          "not belong together.")
  return vocab, merges


class ByteLevelBpeVocabulary(TokenListVocabulary):
  """A directory with `vocab.json` and `merges.txt` (`bundled:<name>` for shipped ones)."""
  ROLES = dict(pad="<pad>", unk="<unk>", cls="<s>", sep="</s>", mask="<mask>")

  # Tokens include the space before a word: sentences that continue running text are
  # tokenized with the whitespace that precedes them (see preprocessors.tokenize_documents).
  tokens_carry_leading_space = True
  # RoBERTa separates the texts of a pair with two: <s> A </s></s> B </s>.
  pair_separators = 2

  def __init__(self, path: str):
    self.path = resources.resolve(path)
    ids, merges = _read_files(path, self.path)
    # What transformers.RobertaTokenizer builds from the same two files.
    self._tokenizer = tokenizers.Tokenizer(models.BPE(
        vocab=ids, merges=merges, dropout=None, continuing_subword_prefix="",
        end_of_word_suffix="", fuse_unk=False))
    self._tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    self._tokenizer.decoder = decoders.ByteLevel()
    super().__init__(sorted(ids, key=ids.get))

  # --- TensorFlow ----------------------------------------------------------------------
  def _tokenize_words(self, texts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Flat byte strings -> (ids, words per text, pieces per word), one batched call."""
    # Invalid UTF-8 (possible in TFDS text) becomes U+FFFD, as data.invalid_utf8='replace'.
    encodings = self._tokenizer.encode_batch(
        [text.decode("utf-8", errors="replace") for text in texts], add_special_tokens=False)
    pieces = [encoding.ids for encoding in encodings]
    lengths = np.fromiter(map(len, pieces), np.int64, len(pieces))
    ids = np.fromiter(itertools.chain.from_iterable(pieces), np.int32, lengths.sum())
    # The pre-token (word) of each piece; a word starts where it changes or a text starts.
    word_ids = np.fromiter(itertools.chain.from_iterable(e.word_ids for e in encodings),
                           np.int64, len(ids))
    word_start = np.diff(word_ids, prepend=-1) != 0
    word_start[np.cumsum(lengths)[:-1][lengths[1:] > 0]] = True
    starts = np.flatnonzero(word_start)
    words_per_text = np.bincount(np.repeat(np.arange(len(texts)), lengths)[starts],
                                 minlength=len(texts))
    return ids, words_per_text.astype(np.int64), np.diff(starts, append=len(ids))

  def tokenize_words_tf(self, text: tf.Tensor) -> tf.RaggedTensor:
    """Pieces grouped by word (a word: the pieces of one pre-token, e.g. ' Darcy' or
    "'s"): text [...] -> int32 [..., words, pieces]."""
    text = tf.convert_to_tensor(text, tf.string)
    ids, words_per_text, pieces_per_word = tf.numpy_function(
        self._tokenize_words, [tf.reshape(text, [-1])], [tf.int32, tf.int64, tf.int64],
        stateful=False)
    ids.set_shape([None])
    words = tf.RaggedTensor.from_row_lengths(ids, tf.ensure_shape(pieces_per_word, [None]))
    texts = tf.RaggedTensor.from_row_lengths(words, tf.ensure_shape(words_per_text, [None]))
    if text.shape.rank == 0:
      return texts[0]
    for size in reversed(tf.unstack(tf.shape(text, out_type=tf.int64)[1:])):
      texts = tf.RaggedTensor.from_uniform_row_length(texts, size)
    return texts

  def _encode_tf(self, s: tf.Tensor) -> tf.Tensor:
    return self.tokenize_words_tf(s).merge_dims(-2, -1)

  def _decode_tf(self, ids: tf.Tensor) -> tf.Tensor:
    """int ids [..., length] -> strings [...]."""
    ids = tf.convert_to_tensor(ids)
    rows = tf.reshape(ids, [-1, tf.shape(ids)[-1]])
    texts = tf.numpy_function(
        lambda rows: np.asarray([self._decode(row) for row in rows], object),
        [rows], tf.string, stateful=False)
    return tf.reshape(texts, tf.shape(ids)[:-1])

  # --- Python --------------------------------------------------------------------------
  def _encode(self, s: str) -> list[int]:
    return self._tokenizer.encode(s, add_special_tokens=False).ids

  def encode_with_offsets(self, texts: list[str]) -> list[tuple[list[int], list]]:
    """[(ids, [(start, end) of each token in the text])] of each text: `tokenizers`'
    character offsets, without the space a token carries before its word (a character
    split over several byte tokens is the span of each)."""
    encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
    return [(encoding.ids, alignment.strip_whitespace(text, encoding.offsets))
            for text, encoding in zip(texts, encodings)]

  def _decode(self, ids) -> str:
    """The text the ids stand for (bytes joined back, special tokens kept)."""
    return self._tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

  def __eq__(self, other):
    return isinstance(other, ByteLevelBpeVocabulary) and self.path == other.path

  def __hash__(self):
    return hash(self.path)


def train_byte_bpe(files: list[str], output: str, vocab_size: int = 50265,
                   min_frequency: int = 2) -> ByteLevelBpeVocabulary:
  """Trains a byte-level BPE with Hugging Face `tokenizers`; writes vocab.json and
  merges.txt into the directory `output`. Special tokens get ids 0-4 (SPECIAL_TOKENS)."""
  check_training_files(files)
  tokenizer = tokenizers.ByteLevelBPETokenizer(add_prefix_space=False)
  tokenizer.train([files_lib.local_copy(f) for f in files], vocab_size=vocab_size,
                  min_frequency=min_frequency,
                  special_tokens=list(SPECIAL_TOKENS), show_progress=False)
  if tokenizer.get_vocab_size() <= len(SPECIAL_TOKENS) + 256:
    raise VocabularyError(f"no text to train a vocabulary from in {files} (not a single "
                          "merge was learned)")
  save_model_files(tokenizer, {name: os.path.join(output, name) for name in FILES})
  return ByteLevelBpeVocabulary(output)


def main(argv=None):
  training_cli(argv, "Train a byte-level BPE vocabulary (vocab.json + merges.txt, RoBERTa).",
               "directory to write vocab.json and merges.txt into", 50265,
               lambda files, output, size, _: train_byte_bpe(files, output, vocab_size=size))


if __name__ == "__main__":
  main()

"""Byte-level BPE vocabulary (GPT-2, RoBERTa, ModernBERT, EuroBERT) as a
`seqio.Vocabulary`, and training one.

A vocabulary is a directory holding either `vocab.json` (token -> id) and `merges.txt`
(the merge rules, most frequent first), the files of Hugging Face's `roberta-base` and of
`ByteLevelBPETokenizer.save_model`, or a `tokenizer.json` as `save_pretrained` of a fast
tokenizer writes it (ModernBERT's, EuroBERT's). Tokenization is Hugging Face `tokenizers`'
byte-level BPE. From vocab.json and merges.txt it is built as `transformers.
RobertaTokenizer` builds it (GPT-2's pre-tokenizing regex, no prefix space, no unknown
token: every byte has a token); from a tokenizer.json it is that file's own pipeline
(normalizer, pre-tokenizer, BPE model, decoder) without its added tokens and
post-processor. Either way its ids are the Hugging Face tokenizer's (tested).

Special tokens are looked up by name, as the vocabulary's layout (`layout`, config
`data.vocab.layout`; LAYOUTS) names them: RoBERTa's <s> <pad> </s> <unk> <mask>;
ModernBERT's BERT-style [CLS] [SEP] [MASK] [PAD] [UNK]; EuroBERT's Llama-3-style
<|begin_of_text|> <|end_of_text|> <|mask|> (padding with <|pad|>, or with
<|end_of_text|> as the released EuroBERT tokenizers do; no unknown token). So roberta-base's
ids (<s>=0, <pad>=1, </s>=2, <unk>=3, <mask>=50264), ModernBERT's ([CLS]=50281 ...) and
those of a vocabulary trained here (the layout's tokens first: ids 0, 1, ...) all work.
Text is never parsed for special tokens: '<mask>' in a corpus is four ordinary tokens, as
'[MASK]' is for the WordPiece vocabulary.

Tokens carry the space before a word ('Ġword'), so a sentence encoded alone differs from
the same sentence inside running text ('word'); `tokens_carry_leading_space` tells the
preprocessor to hand over sentences with the whitespace that precedes them.

There is no byte-level BPE in TensorFlow (tensorflow-text has WordPiece and
SentencePiece), so inside tf.data the tokenizer runs through `tf.numpy_function`, one
call per tensor of texts (a document's sentences), which `tokenizers` encodes in
parallel outside the GIL. BPE has no randomness here (no dropout): the ids are a pure
function of the text.

Train one: `python -m encoderx.data.bpe_vocabulary --files 'corpus/*.txt' --size 50265
--output vocab_dir/ [--layout bert]`.
"""
from __future__ import annotations

import dataclasses
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

FILES = ("vocab.json", "merges.txt")
TOKENIZER_FILE = "tokenizer.json"


@dataclasses.dataclass(frozen=True)
class Layout:
  """A family's special tokens: those a vocabulary trained here gets first (ids 0, 1,
  ...), the token of each role (pad, unk, cls, sep, mask; the first candidate the
  vocabulary has; unk may be absent), and how the texts of a pair are separated."""
  special_tokens: tuple[str, ...]
  roles: dict[str, tuple[str, ...]]
  pair_separators: int  # separators between the texts of a pair: 2 is <s> A </s></s> B </s>


LAYOUTS = {
    # RoBERTa: fairseq's dictionary order (<s> <pad> </s> <unk>), <mask> after them
    # (Hugging Face's recipe for a new RoBERTa); <s> A </s></s> B </s>.
    "roberta": Layout(("<s>", "<pad>", "</s>", "<unk>", "<mask>"), dict(
        pad=("<pad>",), unk=("<unk>",), cls=("<s>",), sep=("</s>",), mask=("<mask>",)), 2),
    # ModernBERT (answerdotai/ModernBERT-base's tokenizer: [UNK]=50280, [CLS], [SEP],
    # [PAD], [MASK]=50284, in that order; its template [CLS] A [SEP] B [SEP]).
    "bert": Layout(("[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"), dict(
        pad=("[PAD]",), unk=("[UNK]",), cls=("[CLS]",), sep=("[SEP]",), mask=("[MASK]",)),
        1),
    # EuroBERT (Llama-3's special tokens: <|begin_of_text|>=128000, <|end_of_text|>,
    # <|mask|>=128002, EuroBERT/EuroBERT-210m's special_tokens_map.json and config.json);
    # a sequence is <|begin_of_text|> A <|end_of_text|>. The released tokenizers pad with
    # <|end_of_text|>; those transformers' tests build, and the ones trained here, have
    # a <|pad|> of their own.
    "eurobert": Layout(("<|begin_of_text|>", "<|end_of_text|>", "<|mask|>", "<|pad|>"), dict(
        pad=("<|pad|>", "<|end_of_text|>"), cls=("<|begin_of_text|>",),
        sep=("<|end_of_text|>",), mask=("<|mask|>",)), 1),
}
# RoBERTa's special tokens, the default layout's (ids 0-4 of a vocabulary trained here).
SPECIAL_TOKENS = LAYOUTS["roberta"].special_tokens


def vocabulary_files(directory: str) -> list[str]:
  """The files of the vocabulary in `directory`: vocab.json and merges.txt where both
  are, else tokenizer.json (raises VocabularyError where neither is)."""
  given = files_lib.path(directory)
  if all((given / name).is_file() for name in FILES):
    return [str(given / name) for name in FILES]
  if (given / TOKENIZER_FILE).is_file():
    return [str(given / TOKENIZER_FILE)]
  lacking = [name for name in FILES if not (given / name).is_file()]
  problem = ("it does not exist" if not given.is_dir() else
             f"it lacks {' and '.join(lacking)} and has no {TOKENIZER_FILE}")
  raise VocabularyError(f"byte-level BPE vocabulary '{directory}' must be a directory holding "
                        f"vocab.json and merges.txt, or tokenizer.json; {problem}.")


def _check_merges(path: str, vocab: dict, merges) -> None:
  """tokenizers panics on merges outside the vocabulary: refused first."""
  unknown = next(((a, b) for a, b in merges
                  if a not in vocab or b not in vocab or a + b not in vocab), None)
  if unknown:
    raise VocabularyError(f"byte-level BPE vocabulary '{path}': its merges merge "
                          f"{unknown} into tokens that its vocabulary lacks; the files do "
                          "not belong together.")


def _gpt2_tokenizer(vocab: dict, merges) -> tokenizers.Tokenizer:
  """What transformers.RobertaTokenizer builds from vocab.json and merges.txt."""
  tokenizer = tokenizers.Tokenizer(models.BPE(
      vocab=vocab, merges=merges, dropout=None, continuing_subword_prefix="",
      end_of_word_suffix="", fuse_unk=False))
  tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tokenizer.decoder = decoders.ByteLevel()
  return tokenizer


def _from_tokenizer_json(path: str, local: str) -> tuple[dict, tokenizers.Tokenizer]:
  """({token: id} with the added tokens, the file's pipeline without added tokens,
  post-processor, padding or truncation) of a tokenizer.json."""
  try:
    spec = json.loads(files_lib.read_text(local))
    model = spec["model"]
  except (OSError, ValueError, KeyError, TypeError) as error:
    raise VocabularyError(f"cannot read '{path}/{TOKENIZER_FILE}': {error}") from None
  if model.get("type") != "BPE" or "ByteLevel" not in json.dumps(spec.get("pre_tokenizer")):
    raise VocabularyError(f"'{path}/{TOKENIZER_FILE}' is not a byte-level BPE (its model is "
                          f"{model.get('type')!r}, its pre-tokenizer "
                          f"{(spec.get('pre_tokenizer') or {}).get('type')!r}).")
  merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m)
            for m in model.get("merges", [])]
  _check_merges(path, model["vocab"], merges)
  vocab = dict(model["vocab"])
  for token in spec.get("added_tokens") or []:
    if vocab.setdefault(token["content"], token["id"]) != token["id"]:
      raise VocabularyError(f"'{path}/{TOKENIZER_FILE}': added token {token['content']!r} "
                            f"has id {token['id']}, its vocabulary {vocab[token['content']]}.")
  spec.update(added_tokens=[], post_processor=None, padding=None, truncation=None)
  return vocab, tokenizers.Tokenizer.from_str(json.dumps(spec))


def _read(path: str, directory: str, layout: str) -> tuple[dict, tokenizers.Tokenizer]:
  """The vocabulary's {token: id} and tokenizer, checked: ids 0..n-1, every byte symbol,
  the layout's special tokens."""
  found = vocabulary_files(directory)
  local = [files_lib.local_copy(f) for f in found]  # tokenizers reads local files only
  if len(found) == 1:
    ids, tokenizer = _from_tokenizer_json(path, local[0])
  else:
    try:
      ids, merges = models.BPE.read_file(*local)
    except Exception as error:  # pylint: disable=broad-except  (tokenizers raises Exception)
      raise VocabularyError(f"cannot read byte-level BPE vocabulary '{path}': "
                            f"{error}") from None
    _check_merges(path, ids, merges)
    tokenizer = _gpt2_tokenizer(ids, merges)
  if sorted(ids.values()) != list(range(len(ids))):
    raise VocabularyError(f"byte-level BPE vocabulary '{path}': the ids of its tokens must "
                          f"be 0..{len(ids) - 1}, each once.")
  spec = LAYOUTS[layout]
  missing = [" or ".join(tokens) for role, tokens in spec.roles.items()
             if not any(t in ids for t in tokens)]
  missing += [f"byte symbol {symbol!r}" for symbol in pre_tokenizers.ByteLevel.alphabet()
              if symbol not in ids]
  if missing:
    raise VocabularyError(
        f"byte-level BPE vocabulary '{path}' lacks {missing[:8]}"
        f"{f' and {len(missing) - 8} more' if len(missing) > 8 else ''}; a vocabulary of "
        f"the {layout!r} layout (data.vocab.layout) has the 256 byte symbols and "
        f"{' '.join(spec.special_tokens)}.")
  return ids, tokenizer


class ByteLevelBpeVocabulary(TokenListVocabulary):
  """A directory with `vocab.json` and `merges.txt`, or `tokenizer.json` (`bundled:<name>`
  for shipped ones), whose special tokens are of `layout` (LAYOUTS)."""

  # Tokens include the space before a word: sentences that continue running text are
  # tokenized with the whitespace that precedes them (see example_builders.tokenize_documents).
  tokens_carry_leading_space = True

  def __init__(self, path: str, layout: str = "roberta"):
    if layout not in LAYOUTS:
      raise VocabularyError(f"byte-level BPE layout {layout!r} is not one of "
                            f"{', '.join(LAYOUTS)}.")
    self.path = resources.resolve(path)
    self.layout = layout
    ids, self._tokenizer = _read(path, self.path, layout)
    spec = LAYOUTS[layout]
    # The layout's token of each role that this vocabulary has (its first candidate).
    self.ROLES = {role: next(t for t in tokens if t in ids)  # pylint: disable=invalid-name
                  for role, tokens in spec.roles.items() if any(t in ids for t in tokens)}
    self.pair_separators = spec.pair_separators  # RoBERTa's <s> A </s></s> B </s>: 2
    super().__init__(sorted(ids, key=ids.get))

  def tokenizer(self) -> tokenizers.Tokenizer:
    """A copy of the `tokenizers` pipeline that encodes text here (no special tokens, no
    post-processor): what a Hugging Face tokenizer.json of this vocabulary builds on."""
    return tokenizers.Tokenizer.from_str(self._tokenizer.to_str())

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
    return (isinstance(other, ByteLevelBpeVocabulary) and self.path == other.path
            and self.layout == other.layout)

  def __hash__(self):
    return hash((self.path, self.layout))


def train_byte_bpe(files: list[str], output: str, vocab_size: int = 50265,
                   min_frequency: int = 2, layout: str = "roberta") -> ByteLevelBpeVocabulary:
  """Trains a byte-level BPE with Hugging Face `tokenizers`' BPE trainer (GPT-2's
  pre-tokenization, no prefix space); writes vocab.json and merges.txt into the directory
  `output`. The special tokens of `layout` get the first ids (0, 1, ...)."""
  check_training_files(files)
  special = LAYOUTS[layout].special_tokens
  tokenizer = tokenizers.ByteLevelBPETokenizer(add_prefix_space=False)
  tokenizer.train([files_lib.local_copy(f) for f in files], vocab_size=vocab_size,
                  min_frequency=min_frequency,
                  special_tokens=list(special), show_progress=False)
  if tokenizer.get_vocab_size() <= len(special) + 256:
    raise VocabularyError(f"no text to train a vocabulary from in {files} (not a single "
                          "merge was learned)")
  save_model_files(tokenizer, {name: os.path.join(output, name) for name in FILES})
  return ByteLevelBpeVocabulary(output, layout=layout)


def main(argv=None):
  training_cli(argv, "Train a byte-level BPE vocabulary (vocab.json + merges.txt).",
               "directory to write vocab.json and merges.txt into", 50265,
               lambda files, output, size, _, layout: train_byte_bpe(
                   files, output, vocab_size=size, layout=layout),
               options={"--layout": dict(
                   choices=tuple(LAYOUTS), default="roberta",
                   help="the special tokens: RoBERTa's, ModernBERT's (bert) or EuroBERT's")})


if __name__ == "__main__":
  main()

"""Byte-level BPE: Hugging Face RoBERTa parity, words, running text, training, bad files."""
import json
import re

import numpy as np
import pytest
import seqio
import tensorflow as tf

from encoderx import errors
from encoderx import config as config_lib
from encoderx import configs
from encoderx.data import bpe_vocabulary, corpus, example_builders, tasks
from encoderx.data.vocabulary import VocabularyError
from encoderx.data import resources


@pytest.fixture(scope="module")
def bpe():
  return bpe_vocabulary.ByteLevelBpeVocabulary("bundled:austen-bpe")


@pytest.fixture(scope="module")
def hf_tokenizer(bpe):
  import transformers  # pylint: disable=g-import-not-at-top
  # transformers 5: constructors given vocab_file= silently fall back to a 5-token
  # vocabulary; from_pretrained(directory) reads vocab.json and merges.txt.
  tokenizer = transformers.RobertaTokenizer.from_pretrained(bpe.path)
  assert len(tokenizer) == bpe.vocab_size == 8000  # it really uses our files
  assert tokenizer.convert_tokens_to_ids("ĠDarcy") == bpe.token_to_id("ĠDarcy")
  return tokenizer


def test_token_ids_equal_hugging_face_roberta_on_austen(austen_lines, bpe, hf_tokenizer):
  lines = austen_lines(3000)
  lines += [" " + line for line in lines[:100]]  # a leading space: 'Ġ' first tokens
  ours = bpe.encode_tf(tf.constant(lines)).to_list()
  theirs = [hf_tokenizer.encode(line, add_special_tokens=False) for line in lines]
  mismatches = [(line, a, b) for line, a, b in zip(lines, ours, theirs) if a != b]
  assert not mismatches, mismatches[:3]
  assert sum(map(len, ours)) > 30_000
  assert ours == [bpe.encode(line) for line in lines]  # Python and TensorFlow agree


@pytest.mark.parametrize("text", [
    "Héllo WÖRLD, naïve café!",                # accents and case kept, as bytes
    "中文字符 and 日本 🙂",                         # multi-byte characters
    "don't  stop--now!!  I'll 1,234.5 x" + "y" * 120,  # contractions, numbers, spaces
    "tabs\tand\nnewlines \r\n end  ",           # whitespace runs are tokens
    "zero\u200bwidth \x00nul \ufffdrepl",        # nothing is dropped
])
def test_unicode_and_whitespace_match_hugging_face(text, bpe, hf_tokenizer):
  ids = bpe.encode(text)
  assert ids == hf_tokenizer.encode(text, add_special_tokens=False)
  assert bpe.decode(ids) == text  # byte-level BPE is lossless


def test_special_tokens_and_ids(bpe):
  assert [bpe.cls_id, bpe.pad_id, bpe.sep_id, bpe.unk_id, bpe.mask_id] == [0, 1, 2, 3, 4]
  assert bpe.token_to_id("<mask>") == bpe.mask_id and bpe.id_to_token(0) == "<s>"
  assert bpe.special_ids == (0, 1, 2, 3, 4) and bpe.eos_id is None
  # Text is never parsed for special tokens (a corpus cannot inject a <mask>).
  assert not set(bpe.encode("<s> a <mask> b </s><pad>")) & set(bpe.special_ids)
  assert bpe.decode([bpe.cls_id] + bpe.encode("Anne") + [bpe.sep_id]) == "<s>Anne</s>"


def test_words_are_pre_tokens(bpe):
  words = bpe.tokenize_words_tf(tf.constant("Mr. Darcy's  Zanzibar")).to_list()
  assert ["".join(bpe.id_to_token(i) for i in word) for word in words] == [
      "Mr", ".", "ĠDarcy", "'s", "Ġ", "ĠZanzibar"]
  assert max(map(len, words)) > 1  # a rare word is several pieces of one word
  batched = bpe.tokenize_words_tf(tf.constant([["Anne Elliot", ""], ["a", "b c"]]))
  assert batched.shape.rank == 4 and batched.to_list()[1][1] == [[bpe.encode("b")[0]],
                                                                 bpe.encode(" c")]
  assert batched.to_list()[0][1] == []


def test_decode_round_trips(austen_lines, bpe):
  lines = austen_lines(200)
  ids = [bpe.encode(line) for line in lines]
  assert [bpe.decode(i) for i in ids] == lines
  assert bpe.decode_tf(tf.constant(ids[0])).numpy().decode() == lines[0]
  pair = tf.constant([ids[0][:4], ids[1][:4]])
  assert [t.decode() for t in bpe.decode_tf(pair).numpy()] == [bpe.decode(ids[0][:4]),
                                                              bpe.decode(ids[1][:4])]


def test_encoding_in_parallel_tf_data_is_deterministic(austen_lines, bpe):
  lines = austen_lines(400)
  dataset = tf.data.Dataset.from_tensor_slices(lines).batch(8).map(
      lambda text: bpe.encode_tf(text).merge_dims(0, 1), num_parallel_calls=4,
      deterministic=True)
  first = [ids.tolist() for ids in dataset.as_numpy_iterator()]
  second = [ids.tolist() for ids in dataset.as_numpy_iterator()]
  assert first == second
  assert sum(first, []) == sum((bpe.encode(line) for line in lines), [])


def _tokenized_documents(vocabulary, documents):
  dataset = tf.data.Dataset.from_tensor_slices({
      "text": ["\n".join(paragraphs) for paragraphs in documents],
      "document_id": tf.range(len(documents), dtype=tf.int64)})
  features = {"input_ids": seqio.Feature(vocabulary, add_eos=False)}
  return list(example_builders.tokenize_documents(dataset, features, sentence_per_line=False)
              .as_numpy_iterator())


def test_sentences_are_tokenized_as_running_text(austen_files, bpe, hf_tokenizer):
  """A document's ids are RobertaTokenizer's of its paragraphs: the sentences the
  breaker cut them into keep the space before them ('Ġword'). Left out: paragraphs where
  the breaker cuts inside a run of punctuation ('etc.,' '."' '.--'), which GPT-2's
  regex keeps as one pre-token."""
  corpus_format = corpus.CorpusFormat(configs.get("bert:tiny").data.document_marker, False,
                                      "error")
  documents = [[p for p in document if ". " in p and not re.search(r"[.!?]\S", p)]
               for document in corpus.read_documents(austen_files, corpus_format)]
  documents = [d for d in documents if d]
  paragraphs = sum(map(len, documents))
  assert paragraphs > 1000
  expected = [sum((hf_tokenizer.encode(p, add_special_tokens=False) for p in d), [])
              for d in documents]
  tokenized = _tokenized_documents(bpe, documents)
  assert [t["token_ids"].tolist() for t in tokenized] == expected
  assert sum(len(t["sentence_lengths"]) for t in tokenized) > 3 * paragraphs
  # Word starts: the first piece of every pre-token.
  words = bpe.tokenize_words_tf(tf.constant(documents[0][0])).to_list()
  starts = sum(([1] + [0] * (len(w) - 1) for w in words), [])
  np.testing.assert_array_equal(tokenized[0]["word_starts"][:len(starts)], starts)

  class SentencesAlone(bpe_vocabulary.ByteLevelBpeVocabulary):
    tokens_carry_leading_space = False
  alone = _tokenized_documents(SentencesAlone("bundled:austen-bpe"), documents)
  assert all(a["token_ids"].tolist() != e for a, e in zip(alone, expected))


def test_trains_a_vocabulary_from_the_command_line(tmp_path, austen_files, capsys):
  output = tmp_path / "bpe"
  bpe_vocabulary.main(["--files", austen_files[0], "--size", "1000", "--output",
                       str(output)])
  assert "1000 tokens" in capsys.readouterr().out
  assert sorted(p.name for p in output.iterdir()) == ["merges.txt", "vocab.json"]
  trained = bpe_vocabulary.ByteLevelBpeVocabulary(str(output))
  assert trained.vocab_size == 1000
  assert trained.tokens[:5] == list(bpe_vocabulary.SPECIAL_TOKENS)
  text = "Anne Elliot walked to Uppercross."
  assert trained.decode(trained.encode(text)) == text
  assert len(trained.encode(text)) > 6  # a small vocabulary: more pieces


def test_config_selects_the_byte_level_vocabulary(tmp_path):
  config = configs.get("bert:tiny")
  config.data.vocab.kind = "byte_bpe"
  config.data.vocab.path = resources.BUNDLED_BPE_VOCAB
  vocabulary = tasks.build_vocabulary(config.data.vocab)
  assert isinstance(vocabulary, bpe_vocabulary.ByteLevelBpeVocabulary)
  assert vocabulary.vocab_size == 8000
  config.data.vocab.path = str(tmp_path / "nowhere")
  with pytest.raises(errors.ConfigError, match=r"data\.vocab\.path.*bpe_vocabulary"):
    config_lib.validate(config)
  config.data.vocab.kind = "bpe"
  with pytest.raises(errors.ConfigError, match=r"data\.vocab\.kind.*'byte_bpe'"):
    config_lib.validate(config)


def _vocabulary_dir(tmp_path, name, vocab=None, merges=None):
  directory = tmp_path / name
  directory.mkdir()
  if vocab is not None:
    (directory / "vocab.json").write_text(vocab if isinstance(vocab, str) else json.dumps(vocab))
  if merges is not None:
    (directory / "merges.txt").write_text(merges)
  return str(directory)


def test_bad_vocabulary_files_fail_clearly(tmp_path, bpe):
  vocab = {token: i for i, token in enumerate(bpe.tokens)}
  with open(f"{bpe.path}/merges.txt", encoding="utf-8") as f:
    merges = f.read()
  with pytest.raises(VocabularyError, match="does not exist"):
    bpe_vocabulary.ByteLevelBpeVocabulary(str(tmp_path / "missing"))
  with pytest.raises(VocabularyError, match="lacks merges.txt"):
    bpe_vocabulary.ByteLevelBpeVocabulary(_vocabulary_dir(tmp_path, "no_merges", vocab))
  with pytest.raises(VocabularyError, match="cannot read.*vocab.*merges"):
    bpe_vocabulary.ByteLevelBpeVocabulary(_vocabulary_dir(tmp_path, "bad_json", "{oops",
                                                          merges))
  with pytest.raises(VocabularyError, match="Merges text file invalid"):
    bpe_vocabulary.ByteLevelBpeVocabulary(
        _vocabulary_dir(tmp_path, "bad_merges", vocab, "#version: 0.2\nonly_one\n"))
  lacking = {t: i for t, i in vocab.items() if t != "<mask>"}
  with pytest.raises(VocabularyError, match="ids of its tokens must be 0..7998"):
    bpe_vocabulary.ByteLevelBpeVocabulary(_vocabulary_dir(tmp_path, "gap", lacking, merges))
  lacking = {t: i for i, t in enumerate(t for t in bpe.tokens if t != "<mask>")}
  with pytest.raises(VocabularyError, match=r"lacks \['<mask>'\]"):
    bpe_vocabulary.ByteLevelBpeVocabulary(_vocabulary_dir(tmp_path, "no_mask", lacking,
                                                          merges))
  wordpiece = {t: i for i, t in enumerate(list(bpe_vocabulary.SPECIAL_TOKENS) + ["the"])}
  with pytest.raises(VocabularyError, match="lacks.*byte symbol.*and 248 more"):
    bpe_vocabulary.ByteLevelBpeVocabulary(_vocabulary_dir(tmp_path, "not_bytes", wordpiece,
                                                          "#version: 0.2\n"))
  # merges.txt of another vocabulary (tokenizers itself would panic on it).
  other = {t: i for i, t in enumerate(bpe.tokens[:300])}
  with pytest.raises(VocabularyError, match="do not belong together"):
    bpe_vocabulary.ByteLevelBpeVocabulary(_vocabulary_dir(tmp_path, "mismatch", other,
                                                          merges))
  empty = tmp_path / "empty.txt"
  empty.write_text("")
  with pytest.raises(VocabularyError, match="no text"):
    bpe_vocabulary.train_byte_bpe([str(empty)], str(tmp_path / "out"), vocab_size=500)
  with pytest.raises(VocabularyError, match="no such file"):
    bpe_vocabulary.train_byte_bpe([str(tmp_path / "none.txt")], str(tmp_path / "out"))

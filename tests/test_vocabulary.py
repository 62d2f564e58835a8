"""WordPiece: BERT's tokenization rules, Hugging Face parity, training, bad files."""
import pytest
import tensorflow as tf

from encoderx.data import vocabulary as vocabulary_lib


@pytest.fixture(scope="module")
def hf_tokenizer(tmp_path_factory, vocabulary):
  import transformers  # pylint: disable=g-import-not-at-top
  directory = tmp_path_factory.mktemp("hf_vocab")
  (directory / "vocab.txt").write_text("\n".join(vocabulary.tokens) + "\n")
  # transformers 5: BertTokenizerFast(vocab_file=...) ignores the file; load the dir.
  return transformers.BertTokenizer.from_pretrained(str(directory), do_lower_case=True)


def test_token_ids_equal_hugging_face_on_austen(austen_lines, vocabulary, hf_tokenizer):
  lines = austen_lines(3000)
  assert len(lines) == 3000
  ours = vocabulary.encode_tf(tf.constant(lines)).to_list()
  theirs = [hf_tokenizer.encode(line, add_special_tokens=False) for line in lines]
  mismatches = [(line, a, b) for line, a, b in zip(lines, ours, theirs) if a != b]
  assert not mismatches, mismatches[:3]
  assert sum(map(len, ours)) > 30_000


@pytest.mark.parametrize("text", [
    "Héllo WÖRLD, naïve café!",           # accents stripped, lower-cased
    "中文字符 and 日本",                      # every CJK character its own token
    "ß İstanbul ǅ",                        # lower-casing like Python, not case folding
    "zero\u200bwidth \x00nul \ufffdrepl",   # dropped control/format characters
    "don't  stop--now!!  x" + "y" * 120,   # punctuation split; over-long word -> [UNK]
])
def test_unicode_rules_match_hugging_face(text, vocabulary, hf_tokenizer):
  assert vocabulary.encode(text) == hf_tokenizer.encode(text, add_special_tokens=False)


def test_rules_split_punctuation_and_cjk(vocabulary):
  pieces = vocabulary.tokenize_words_tf(tf.constant("Mr. Darcy's 中文")).to_list()
  words = [vocabulary.decode(word) for word in pieces]
  assert words == ["mr", ".", "darcy", "'", "s", vocabulary.decode(pieces[5]),
                   vocabulary.decode(pieces[6])]
  assert len(pieces) == 7  # 中 and 文 are words of their own


def test_case_and_accent_options_are_independent(tmp_path, vocabulary):
  path = tmp_path / "vocab.txt"
  path.write_text("\n".join(vocabulary.tokens + ["Émile", "emile", "Emile"]) + "\n")
  n = len(vocabulary.tokens)
  cased = vocabulary_lib.WordPieceVocabulary(str(path), lower_case=False, strip_accents=False)
  assert cased.encode("Émile") == [n]
  strip_only = vocabulary_lib.WordPieceVocabulary(str(path), lower_case=False,
                                                  strip_accents=True)
  assert strip_only.encode("Émile") == [n + 2]
  uncased = vocabulary_lib.WordPieceVocabulary(str(path), lower_case=True)
  assert uncased.encode("Émile") == [n + 1]


def test_special_ids_and_decode(vocabulary):
  assert vocabulary.token_to_id("[CLS]") == vocabulary.cls_id
  assert {vocabulary.pad_id, vocabulary.cls_id, vocabulary.sep_id, vocabulary.mask_id,
          vocabulary.unk_id} <= set(vocabulary.special_ids)
  ids = vocabulary.encode("It is a truth universally acknowledged")
  assert vocabulary.decode(ids) == "it is a truth universally acknowledged"
  assert vocabulary.decode_tf(tf.constant(ids)).numpy().decode() == (
      "it is a truth universally acknowledged")


def test_trains_a_vocabulary_that_round_trips(tmp_path, austen_files):
  output = tmp_path / "vocab.txt"
  trained = vocabulary_lib.train_wordpiece(austen_files[:1], str(output), vocab_size=2000)
  assert output.exists() and trained.vocab_size == 2000
  assert trained.tokens[:5] == list(vocabulary_lib.SPECIAL_TOKENS)
  text = "Anne Elliot walked to Uppercross."
  assert trained.decode(trained.encode(text)) == "anne elliot walked to uppercross ."


def test_bad_vocabulary_files_fail_clearly(tmp_path):
  with pytest.raises(vocabulary_lib.VocabularyError, match="cannot read"):
    vocabulary_lib.WordPieceVocabulary(str(tmp_path / "missing.txt"))
  lacking = tmp_path / "lacking.txt"
  lacking.write_text("[PAD]\n[UNK]\nthe\n")
  with pytest.raises(vocabulary_lib.VocabularyError, match=r"\[CLS\]"):
    vocabulary_lib.WordPieceVocabulary(str(lacking))
  binary = tmp_path / "binary.txt"
  binary.write_bytes(b"\xff\xfe\x00junk")
  with pytest.raises(vocabulary_lib.VocabularyError, match="cannot read"):
    vocabulary_lib.WordPieceVocabulary(str(binary))
  empty = tmp_path / "empty.txt"
  empty.write_text("")
  with pytest.raises(vocabulary_lib.VocabularyError, match="no text"):
    vocabulary_lib.train_wordpiece([str(empty)], str(tmp_path / "out.txt"), vocab_size=100)

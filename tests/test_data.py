"""Data: documents from text files and TFDS, NSP segment pairs, the seqio Task, bad input."""
import collections
import concurrent.futures
import re

import numpy as np
import pytest
import seqio
import tensorflow_datasets as tfds

from encoderx import config as config_lib
from encoderx import preprocess
from encoderx.data import corpus, pipeline, segment_pairs, tasks

SPECIAL = segment_pairs.SpecialIds(pad=0, cls=2, sep=3)


def _document(document_id, lengths, first_token):
  """A document whose token ids identify it: ids first_token, first_token + 1, ..."""
  sentences, starts, token = [], [], first_token
  for length in lengths:
    sentences.append(np.arange(token, token + length, dtype=np.int32))
    starts.append(np.ones(length, np.int32))
    token += length
  return segment_pairs.Document(document_id, sentences, starts)


def _check_pair_structure(example, seq_length):
  ids = example["input_ids"]
  n = int(example["segment_ids"].sum())
  assert 5 <= n <= seq_length
  seps = np.flatnonzero(ids[:n] == SPECIAL.sep)
  assert ids[0] == SPECIAL.cls and len(seps) == 2 and seps[1] == n - 1
  assert (ids[n:] == SPECIAL.pad).all() and (example["segment_ids"][n:] == 0).all()
  types = example["token_type_ids"]
  assert (types[:seps[0] + 1] == 0).all() and (types[seps[0] + 1:n] == 1).all()
  assert (example["positions"][:n] == np.arange(n)).all()
  assert seps[0] >= 2 and seps[1] - seps[0] >= 2, "both segments are non-empty"
  return ids[1:seps[0]], ids[seps[0] + 1:seps[1]]


def test_pairs_follow_bert_rules_and_balance_labels():
  documents = [_document(d, [7, 9, 5, 12, 8, 6, 10, 4] * 3, first_token=1000 * (d + 1))
               for d in range(100)]
  builder = segment_pairs.SentencePairBuilder(64, short_seq_prob=0.1, special=SPECIAL)
  examples = list(builder(documents, np.random.default_rng(0)))
  labels = np.array([e["sentence_label"] for e in examples])
  assert len(examples) > 400
  assert abs(labels.mean() - 0.5) < 0.07  # 3 standard deviations
  for example in examples:
    a, b = _check_pair_structure(example, 64)
    a_doc, b_doc = set(a // 1000), set(b // 1000)
    assert len(a_doc) == 1 and len(b_doc) == 1
    if example["sentence_label"] == segment_pairs.IS_NEXT:
      assert a_doc == b_doc and b[0] > a[-1], "B continues A in the same document"
    else:
      assert a_doc != b_doc, "a random next segment never comes from the same document"


def test_short_sequence_probability_is_the_share_of_short_pairs():
  # Long documents (like book chapters), where a short target drawn once per document,
  # as BERT's script does, makes 18-32% of the pairs short instead of about 10%.
  documents = [_document(d, [10] * 400, 10000 * (d + 1)) for d in range(50)]

  def share_short(prob):
    builder = segment_pairs.SentencePairBuilder(128, short_seq_prob=prob, special=SPECIAL)
    examples = list(builder(documents, np.random.default_rng(1)))
    return np.mean([e["segment_ids"].sum() < 100 for e in examples])

  assert share_short(0.0) < 0.03  # the last pair of each document
  # 10% of the targets are short, uniform in [2, 125]: about 80% of those fall below 100.
  assert 0.05 < share_short(0.1) < 0.13
  assert share_short(1.0) > 0.7


def test_one_sentence_documents_and_overlong_sentences_are_handled():
  one_sentence = [_document(d, [9], 1000 * (d + 1)) for d in range(40)]
  builder = segment_pairs.SentencePairBuilder(32, short_seq_prob=0.0, special=SPECIAL)
  examples = list(builder(one_sentence, np.random.default_rng(2)))
  labels = np.array([e["sentence_label"] for e in examples])
  assert len(examples) == 40 and abs(labels.mean() - 0.5) < 0.2
  for example in examples:
    a, b = _check_pair_structure(example, 32)
    if example["sentence_label"] == segment_pairs.IS_NEXT:
      assert b[0] == a[-1] + 1, "a one-sentence document splits into A and B"

  long_line = [_document(0, [300], 1000), _document(1, [5, 6], 5000)]
  examples = list(builder(long_line, np.random.default_rng(3)))
  covered = set()
  for example in examples:
    a, b = _check_pair_structure(example, 32)
    covered |= {t for t in np.concatenate([a, b]) if 1000 <= t < 1300}
  assert len(covered) > 250, "a line longer than the max length is cut, not dropped"


def test_documents_from_blank_lines_markers_and_sentence_lines(tmp_path):
  path = tmp_path / "text.txt"
  path.write_text("Title line\n\nChapter 1\n\nFirst para line one\nline two.\n\n"
                  "Second para.\nChapter 2\nOnly para.\n\n\n")
  by_blank = list(corpus.read_documents([str(path)], corpus.CorpusFormat()))
  assert by_blank == [["Title line"], ["Chapter 1"], ["First para line one line two."],
                      ["Second para. Chapter 2 Only para."]]
  by_marker = list(corpus.read_documents(
      [str(path)], corpus.CorpusFormat(document_marker=r"^Chapter \d+")))
  assert by_marker == [["Title line"], ["First para line one line two.", "Second para."],
                       ["Only para."]]
  per_line = list(corpus.read_documents(
      [str(path)], corpus.CorpusFormat(document_marker=r"^Chapter \d+",
                                       sentence_per_line=True)))
  assert per_line[1] == ["First para line one", "line two.", "Second para."]


def test_bad_corpora_get_clear_errors(tmp_path, tiny_config):
  empty = tmp_path / "empty.txt"
  empty.write_text("\n   \n\n")
  with pytest.raises(corpus.CorpusError, match="holds no text"):
    list(corpus.read_documents([str(empty)], corpus.CorpusFormat()))

  latin1 = tmp_path / "latin1.txt"
  latin1.write_bytes("Good line.\n\nCaf\xe9 au lait.\n".encode("latin-1"))
  with pytest.raises(corpus.CorpusError, match=r"latin1\.txt' is not UTF-8: line 3, byte 4"):
    list(corpus.read_documents([str(latin1)], corpus.CorpusFormat()))
  replaced = list(corpus.read_documents([str(latin1)], corpus.CorpusFormat(
      invalid_utf8="replace")))
  assert replaced[1] == ["Caf\ufffd au lait."]

  config = tiny_config()
  config.data.files = str(tmp_path / "missing*.txt")
  with pytest.raises(Exception, match=r"data\.files.*matches no file"):
    tasks.check_text_corpus(config)
  single = tmp_path / "single.txt"
  single.write_text("One document. It has two sentences.\n")
  config.data.files = str(single)
  with pytest.raises(corpus.CorpusError, match="need at least 2"):
    tasks.check_text_corpus(config)


def _task_examples(config, split="train", seed=0, batches=3, batch_size=8):
  task = tasks.register_pretraining_task(config)
  return pipeline.take_batches(task, split, config.data.seq_length, batch_size, batches, seed)


def test_task_on_the_bundled_corpus_is_registered_deterministic_and_balanced(
    tiny_config, vocabulary):
  config = tiny_config()
  named = tasks.register_pretraining_task(config, name="encoderx_bert_austen")
  assert seqio.TaskRegistry.get("encoderx_bert_austen") is named
  config.data.seq_length = 128
  first = _task_examples(config, batches=30, batch_size=16)
  again = _task_examples(config, batches=2, batch_size=16)
  other = _task_examples(config, seed=1, batches=2, batch_size=16)
  for name in first[0]:
    np.testing.assert_array_equal(first[0][name], again[0][name])
  assert not np.array_equal(first[0]["input_ids"], other[0]["input_ids"])

  labels = np.concatenate([b["sentence_label"] for b in first])
  assert abs(labels.mean() - 0.5) < 0.07, labels.mean()
  special = SPECIAL.__class__(vocabulary.pad_id, vocabulary.cls_id, vocabulary.sep_id)
  for batch in first[:3]:
    for row in range(16):
      example = {k: v[row] for k, v in batch.items()}
      n = int(example["segment_ids"].sum())
      ids = example["input_ids"]
      assert ids[0] == special.cls and ids[n - 1] == special.sep
      assert (example["word_starts"][:n] <= 1).all()
      pieces = [vocabulary.id_to_token(int(i)) for i in ids[:n]]
      starts = example["word_starts"][:n].astype(bool)
      assert all(p.startswith("##") for p, s in zip(pieces[1:], starts[1:]) if not s)


def test_datasets_built_at_once_equal_those_built_one_by_one(tiny_config):
  # The next epoch opens on a background thread while other datasets are built (eval,
  # another run): seqio's seed counter is global, so concurrent builds must not mix seeds.
  config = tiny_config()
  seeds = range(4)

  def first_batch(seed):
    return _task_examples(config, seed=seed, batches=1)[0]["input_ids"]

  one_by_one = [first_batch(seed) for seed in seeds]
  with concurrent.futures.ThreadPoolExecutor(len(seeds)) as executor:
    at_once = list(executor.map(first_batch, seeds))
  for seed, expected, actual in zip(seeds, one_by_one, at_once):
    np.testing.assert_array_equal(actual, expected, err_msg=f"seed {seed}")


def test_validation_split_is_held_out_documents(tiny_config, tmp_path, write_corpus):
  documents = [[f"Document {d} sentence {s} word{d}x{s}." for s in range(30)]
               for d in range(20)]
  path = write_corpus(documents)
  config = tiny_config()
  config.data.files = str(path)
  config.data.document_marker = ""  # blank lines separate documents
  config.data.sentence_per_line = True
  config.data.eval_every_nth_document = 5
  assert tasks.check_text_corpus(config) == {"train": 16, "validation": 4}
  vocabulary = tasks.build_vocabulary(config.data.vocab)

  def documents_seen(split):
    seen = collections.Counter()
    for batch in _task_examples(config, split=split, batches=1, batch_size=8):
      for ids in batch["input_ids"]:
        # Whole words only: truncation may cut a pair inside one ("word1" of "word14x3").
        seen.update(re.findall(r"\b(word\d+)x\d+\b", vocabulary.decode(ids)))
    return set(seen)

  held_out = {f"word{d}" for d in (4, 9, 14, 19)}
  assert documents_seen("validation") <= held_out
  assert not documents_seen("train") & held_out


class AustenChapters(tfds.core.GeneratorBasedBuilder):
  """A local TFDS text dataset: the bundled Austen chapters, one example each."""
  VERSION = tfds.core.Version("1.0.0")

  def _info(self):
    return tfds.core.DatasetInfo(builder=self,
                                 features=tfds.features.FeaturesDict({"body": tfds.features.Text()}))

  def _split_generators(self, dl_manager):
    from encoderx.data import resources
    files = resources.bundled_corpus_files()
    return {"train": self._generate_examples(files[1:]),
            "test": self._generate_examples(files[:1])}

  def _generate_examples(self, files):
    documents = corpus.read_documents(files, corpus.CorpusFormat(
        document_marker=r"^\s*(CHAPTER|Chapter)\s+[0-9IVXLC]+"))
    for index, blocks in enumerate(documents):
      yield index, {"body": "\n".join(blocks)}


def test_tfds_datasets_are_selectable_by_name(tiny_config, tmp_path):
  builder = AustenChapters(data_dir=str(tmp_path))
  builder.download_and_prepare()
  config = tiny_config()
  config.data.tfds_name = "austen_chapters"
  with pytest.raises(Exception, match=r"data\.tfds_name.*lacks a version"):
    config_lib.validate(config)
  config.data.tfds_name = "austen_chapters:1.0.0"
  config.data.tfds_data_dir = str(tmp_path)
  config.data.tfds_text_key = "body"
  config.data.tfds_eval_split = "test"  # this dataset has no validation split
  batches = _task_examples(config, batches=2, batch_size=8)
  held_out = _task_examples(config, split="validation", batches=1, batch_size=8)
  assert batches[0]["input_ids"].shape == held_out[0]["input_ids"].shape == (8, 64)
  vocabulary = tasks.build_vocabulary(config.data.vocab)
  text = " ".join(vocabulary.decode(ids) for ids in batches[0]["input_ids"])
  assert text.count("[SEP]") == 16 and " the " in text
  # Streamed a file of the dataset at a time, with a position that resumes exactly.
  task = tasks.register_pretraining_task(config)
  assert pipeline.is_streamed(task)
  straight = pipeline.batch_iterator(task, "train", 64, 8, seed=2)
  next(straight)
  position, following = straight.position.to_dict(), next(straight)
  straight.close()
  resumed = pipeline.batch_iterator(task, "train", 64, 8, seed=2, position=position)
  try:
    np.testing.assert_array_equal(next(resumed)["input_ids"], following["input_ids"])
  finally:
    resumed.close()
  # Preprocessed a file of the dataset at a time, into the examples its stream builds.
  preprocess.run(config, str(tmp_path / "examples"), workers=1, show_progress=False)
  config.data.tfds_name, config.data.preprocessed = "", str(tmp_path / "examples")
  (ready,) = _task_examples(config, batches=1, seed=config.train.seed)
  np.testing.assert_array_equal(ready["input_ids"], batches[0]["input_ids"])


def test_close_can_wait_for_the_next_epoch_opening_in_the_background(tiny_config):
  # The benchmark closes with wait=True so that no epoch is still being opened (and its
  # shuffle buffer filled) while it times the train step.
  config = tiny_config()
  task = tasks.register_pretraining_task(config)
  iterator = pipeline.BatchIterator(task, "train", 64, 4, seed=0)
  for _ in range(iterator._prepare_after):
    next(iterator)
  assert iterator._next_epoch is not None
  iterator.close(wait=True)
  assert iterator._next_epoch.done()


def test_resumed_iterator_continues_with_the_next_batch(tiny_config):
  config = tiny_config()
  task = tasks.register_pretraining_task(config)
  straight = pipeline.BatchIterator(task, "train", 64, 16, seed=3)
  batches = [next(straight) for _ in range(5)]
  position = straight.position
  following = next(straight)
  straight.close()
  resumed = pipeline.BatchIterator(task, "train", 64, 16, seed=3,
                                   position=pipeline.DataPosition.from_dict(position.to_dict()))
  try:
    np.testing.assert_array_equal(next(resumed)["input_ids"], following["input_ids"])
  finally:
    resumed.close()
  assert len({b["input_ids"].tobytes() for b in batches}) == 5

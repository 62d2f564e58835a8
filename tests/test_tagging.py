"""Token classification: CoNLL and TFDS input, first-piece labels for the three
vocabularies, IOB2 repair, seqeval metrics, a run with predictions in CoNLL columns."""
import jax
import numpy as np
import pytest
import tensorflow_datasets as tfds

from encoderx import train
from encoderx.data import labelled, pipeline, tagging, tasks
from encoderx.evaluation import tags as tags_lib
from encoderx.methods import tag as tag_method

from conftest import VOCABULARY_CONFIGS, vocab_config  # pylint: disable=g-bad-import-order
from finetune_cases import CONLL, LABELS, conll_subset, tag_config  # pylint: disable=g-bad-import-order

ONE_DEVICE = jax.devices()[:1]
SENTENCE = tagging.Sentence(1, ["Elizabeth", "Bennet", "visited", "Pemberley",
                                "unaccountably", "1996-08-22"],
                            ["B-PER", "I-PER", "O", "B-LOC", "O", "B-MISC"])


def _vocabulary(kind):
  return tasks.build_vocabulary(vocab_config(kind))


def _examples(kind, sentences, seq_length=32):
  vocabulary = _vocabulary(kind)
  task = tagging.register_task({"train": lambda: sentences}, LABELS,
                               {"train": f"test-{len(sentences)}"}, vocabulary,
                               vocab_config(kind), shuffle_buffer=10)
  (batch,) = pipeline.whole_split(task, "train", seq_length, len(sentences))
  return batch, vocabulary


@pytest.mark.parametrize("kind", sorted(VOCABULARY_CONFIGS))
def test_the_first_piece_of_each_word_carries_its_tag(kind):
  batch, vocabulary = _examples(kind, [SENTENCE])
  # By hand: each word's pieces as the vocabulary splits it (byte-level BPE words after
  # the first with their space, as in running text); the tag on the first only.
  spaced = getattr(vocabulary, "tokens_carry_leading_space", False)
  ids, tags, word_ids = [vocabulary.cls_id], [-1], [-1]
  for index, (word, tag) in enumerate(zip(SENTENCE.words, SENTENCE.tags)):
    pieces = vocabulary.encode((" " if spaced and index else "") + word)
    ids += pieces
    tags += [LABELS.index(tag)] + [-1] * (len(pieces) - 1)
    word_ids += [index] + [-1] * (len(pieces) - 1)
  ids.append(vocabulary.sep_id)
  assert len(ids) > len(SENTENCE.words) + 2  # some word has several pieces
  length = len(ids)
  np.testing.assert_array_equal(batch["input_ids"][0, :length], ids)
  np.testing.assert_array_equal(batch["tags"][0, :length - 1], tags)
  np.testing.assert_array_equal(batch["word_ids"][0, :length - 1], word_ids)
  assert (batch["tags"][0, length - 1:] == -1).all() and (batch["input_ids"][0, length:] == 0).all()
  np.testing.assert_array_equal(batch["segment_ids"][0], np.arange(32) < length)
  # Joined, the ids are the whole sentence's (so the model sees running text).
  assert ids[1:-1] == vocabulary.encode(" ".join(SENTENCE.words))


def test_words_cut_off_by_the_length_are_predicted_o(tmp_path):
  batch, _ = _examples("wordpiece", [SENTENCE], seq_length=8)
  seen = batch["word_ids"][0][batch["word_ids"][0] >= 0]
  assert 0 < len(seen) < len(SENTENCE.words)
  method = _method(tmp_path)
  predictions = np.full(8, method.labels.index("B-PER"))
  tags = method.word_tags(predictions, batch["word_ids"][0], len(SENTENCE.words))
  assert tags[:len(seen)] == ["B-PER"] * len(seen)  # repaired would be B- anyway
  assert tags[len(seen):] == ["O"] * (len(SENTENCE.words) - len(seen))


def test_windows_of_whole_words_by_hand():
  sentence = tagging.Sentence(10, list("abcd"), ["O", "B-PER", "I-PER", "O"])
  parts, places = tagging.windows([sentence], [np.array([2, 3, 1, 4])], max_pieces=5)
  # a window after the first holds a piece less (its first word has no space before it)
  assert [p.words for p in parts] == [["a", "b"], ["c"], ["d"]]
  assert [p.tags for p in parts] == [["O", "B-PER"], ["I-PER"], ["O"]]
  assert [p.line for p in parts] == [10, 12, 13]
  assert places == [tagging.Window(0, 0), tagging.Window(0, 2), tagging.Window(0, 3)]


def test_evaluation_predicts_every_word_of_sentences_longer_than_the_length(tmp_path):
  """A dev sentence past data.seq_length is evaluated in windows of whole words: an
  oracle of its labelled pieces finds every entity (cut at the length, the entities of
  its last words were scored as missed)."""
  path = tmp_path / "dev.txt"
  path.write_text("".join(f"{w}\t{t}\n" for w, t in zip(SENTENCE.words, SENTENCE.tags)))
  config = tag_config(str(path), str(path))
  config.data.seq_length = 8
  method = tag_method.Tagging(config)
  outputs = [{"predictions": np.maximum(b["tags"], 0), "word_ids": b["word_ids"],
              "example_index": b["example_index"], "loss_sum": np.zeros(len(b["tags"])),
              "labelled": np.ones(len(b["tags"])), "weights": b["example_weight"]}
             for b in pipeline.whole_split(method.task(), "validation", 8, 4)]
  metrics = method.summarize_evaluation(outputs)
  assert metrics["accuracy"] == 1.0 and metrics["f1"] == 1.0


def test_iob2_repair_and_entity_metrics_by_hand():
  assert tags_lib.repair_iob2(["O", "I-PER", "I-PER", "B-ORG", "I-PER", "I-LOC", "O"]) == [
      "O", "B-PER", "I-PER", "B-ORG", "B-PER", "B-LOC", "O"]
  assert tags_lib.repair_iob2(["B-PER", "I-PER"]) == ["B-PER", "I-PER"]
  gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
  predicted = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "B-LOC"]]
  # Entities: gold PER(0-1) LOC(3) ORG(0); predicted PER(0-1) ORG(3) ORG(0) LOC(1).
  # Right: PER, ORG(0) -> precision 2/4, recall 2/3, F1 4/7.
  metrics = tags_lib.entity_metrics(gold, predicted)
  assert metrics["precision"] == pytest.approx(0.5)
  assert metrics["recall"] == pytest.approx(2 / 3)
  assert metrics["f1"] == pytest.approx(4 / 7)
  assert metrics["f1_PER"] == pytest.approx(1.0) and metrics["f1_LOC"] == 0.0
  assert tags_lib.is_iob(LABELS) and not tags_lib.is_iob(("NN", "VB"))


def test_conll_files_with_errors_name_file_and_line(tmp_path):
  bad = tmp_path / "bad.txt"
  bad.write_text("-DOCSTART- -X- O O\n\nEU NNP B-ORG\nrejects VBZ O\n\nGerman B-MISC\n")
  with pytest.raises(labelled.LabelledDataError,
                     match=r"bad.txt' line 6 has 2 columns; line 3 has 3"):
    tagging.read_conll(str(bad))
  one = tmp_path / "one.txt"
  one.write_text("EU\nrejects\n")
  with pytest.raises(labelled.LabelledDataError, match=r"one.txt' line 1 has one column"):
    tagging.read_conll(str(one))
  assert [s.words for s in tagging.read_conll(str(one), with_tags=False)] == [["EU", "rejects"]]
  good = tmp_path / "good.txt"
  good.write_text("EU\tB-ORG\nrejects\tO\n\n\nLamb\tB-FOOD\n")
  sentences = tagging.read_conll(str(good))
  assert [(s.line, s.words, s.tags) for s in sentences] == [
      (1, ["EU", "rejects"], ["B-ORG", "O"]), (5, ["Lamb"], ["B-FOOD"])]
  with pytest.raises(labelled.LabelledDataError,
                     match=r"good.txt' line 5: tag 'B-FOOD' is not one of 'O', 'B-ORG'"):
    tagging.columns(sentences, ("O", "B-ORG"), str(good))
  # A 4-column CoNLL-2003 file: the tag is the last column unless told otherwise.
  four = tmp_path / "four.txt"
  four.write_text("EU NNP B-NP B-ORG\n")
  assert tagging.read_conll(str(four))[0].tags == ["B-ORG"]
  assert tagging.read_conll(str(four), tag_column=1)[0].tags == ["NNP"]


# --- a run ----------------------------------------------------------------------------------
def _method(tmp_path):
  path = tmp_path / "labels.txt"
  path.write_text("".join(f"w{i}\t{tag}\n" for i, tag in enumerate(LABELS)))
  return tag_method.Tagging(tag_config(str(path), str(path)))


def test_tagger_trains_evaluates_and_writes_conll_predictions(tmp_path):
  if not (CONLL / "train.txt").exists():
    pytest.skip(f"the conll2003 corpus is not at {CONLL}")
  config = tag_config(conll_subset(tmp_path, "train.txt", 200),
                       conll_subset(tmp_path, "dev.txt", 40))
  run = tmp_path / "run"
  result = train.run(config, str(run), show_progress=False, devices=ONE_DEVICE)
  assert {"f1", "precision", "recall", "accuracy", "loss", "f1_PER"} <= set(result["eval"])
  count, output = train.predict(config, str(run), config.finetune.dev_file,
                                devices=ONE_DEVICE)
  assert count == 40 and output.endswith("predictions.conll")
  predicted = tagging.read_conll(output, tag_column=2)
  gold = tagging.read_conll(config.finetune.dev_file)
  assert [s.words for s in predicted] == [s.words for s in gold]
  assert [s.tags for s in tagging.read_conll(output, tag_column=1)] == [s.tags for s in gold]
  for sentence in predicted:  # valid IOB2
    assert tags_lib.repair_iob2(sentence.tags) == sentence.tags
  # The file is the best checkpoint's predictions: its F1, recomputed from them.
  from encoderx import checkpoint  # pylint: disable=g-import-not-at-top
  best = checkpoint.BestCheckpoint(str(run / "best"), "f1")
  try:
    metrics = best.restore(best.best_step(), _abstract(config))[2]
  finally:
    best.close()
  assert tags_lib.entity_metrics([s.tags for s in gold], [s.tags for s in predicted])[
      "f1"] == pytest.approx(metrics["f1"])


def _abstract(config):
  from encoderx.train import trainer as trainer_lib  # pylint: disable=g-import-not-at-top
  return trainer_lib.Trainer(config, devices=ONE_DEVICE).abstract_state_with_shardings()


# --- TFDS -----------------------------------------------------------------------------------
class TinyNer(tfds.core.GeneratorBasedBuilder):
  """A local TFDS dataset shaped like conll2003 (tokens, ner) of hand-made sentences."""
  VERSION = tfds.core.Version("1.0.0")
  NAMES = ("O", "B-PER", "I-PER", "B-LOC")

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
        "tokens": tfds.features.Sequence(tfds.features.Text()),
        "ner": tfds.features.Sequence(tfds.features.ClassLabel(names=self.NAMES))}))

  def _split_generators(self, dl_manager):
    return {"train": self._generate_examples(12), "validation": self._generate_examples(4)}

  def _generate_examples(self, count):
    for i in range(count):
      yield i, {"tokens": ["Anne", "Elliot", "went", "to", "Bath", str(i)],
                "ner": ["B-PER", "I-PER", "O", "O", "B-LOC", "O"]}


def test_a_tfds_dataset_of_tokens_and_tags_trains_a_tagger(tmp_path):
  TinyNer(data_dir=str(tmp_path)).download_and_prepare()
  config = tag_config("", "")
  config.data.tfds_name, config.data.tfds_data_dir = "tiny_ner:1.0.0", str(tmp_path)
  config.train.steps = 2
  config.eval.every_steps = 0
  method = tag_method.Tagging(config)
  assert method.labels == TinyNer.NAMES  # the ClassLabel's names, in id order
  assert method.sentences("validation")[0].tags == ["B-PER", "I-PER", "O", "O", "B-LOC", "O"]
  result = train.run(config, str(tmp_path / "run"), show_progress=False, devices=ONE_DEVICE)
  assert 0.0 <= result["eval"]["f1"] <= 1.0

"""Extractive QA: exact character offsets for the three vocabularies, document-stride
windows, n-best decoding with the maximum answer length and the v2.0 no-answer threshold,
SQuAD's official scores, SQuAD JSON errors, and runs from SQuAD JSON and from TFDS."""
import json
import re

import jax
import numpy as np
import pytest
import tensorflow_datasets as tfds

from encoderx import train
from encoderx.data import squad, tasks
from encoderx.evaluation import squad as squad_eval
from encoderx.methods import qa as qa_method

from conftest import VOCABULARY_CONFIGS, vocab_config  # pylint: disable=g-bad-import-order
from finetune_cases import QUESTIONS, qa_config, squad_json  # pylint: disable=g-bad-import-order

ONE_DEVICE = jax.devices()[:1]
# Accents, capitals, punctuation against words, LaTeX quotes, several spaces, a tab.
CONTEXT = ("Mr. Darcy's estate, Pemberley,  lay in Derbyshire; the Café Élysée\twas "
           "``far'' from Longbourn (1813).")
# Answers as a reader would mark them by hand: (text, character offset).
ANSWERS = [("Pemberley", 20), ("Darcy's", 4), ("Café Élysée", 55), ("Derbyshire", 39),
           ("``far''", 71), ("1813", 95), ("Mr.", 0)]


def _vocabulary(kind):
  return tasks.build_vocabulary(vocab_config(kind))


def test_hand_marked_answers_are_where_they_say():
  for text, start in ANSWERS:
    assert CONTEXT[start:start + len(text)] == text


@pytest.mark.parametrize("kind", sorted(VOCABULARY_CONFIGS))
def test_token_offsets_cover_the_original_text_exactly(kind):
  vocabulary = _vocabulary(kind)
  ((ids, spans),) = vocabulary.encode_with_offsets([CONTEXT])
  assert ids == vocabulary.encode(CONTEXT)  # the ids training sees
  # Every non-space character is in a token's span, in order; spans never start or end
  # on a space. Only a character of several UTF-8 bytes may be in several (byte-level
  # BPE splits é into two tokens, each spanning the é).
  covered = [i for start, end in spans for i in range(start, end)]
  assert covered == sorted(covered)
  assert sorted(set(covered)) == [i for i, c in enumerate(CONTEXT) if not c.isspace()]
  assert all(len(CONTEXT[i].encode()) > 1 for i in set(covered) if covered.count(i) > 1)
  # Hand-marked words are whole tokens: a token starts at each word's first character
  # and one ends at its last.
  starts, ends = {s for s, _ in spans}, {e for _, e in spans}
  for text, start in ANSWERS:
    assert start in starts and start + len(text) in ends, text


@pytest.mark.parametrize("kind", sorted(VOCABULARY_CONFIGS))
def test_an_answer_decoded_from_its_tokens_is_the_original_text(kind):
  vocabulary = _vocabulary(kind)
  examples = [squad.Example(f"q{i}", "Where did he live?", CONTEXT,
                            [squad.Answer(text, start)])
              for i, (text, start) in enumerate(ANSWERS)]
  windows = squad.windows(examples, vocabulary, 64, 16, 10, token_types=True)
  assert len(windows) == len(ANSWERS)  # one window holds the whole context
  start_logits = np.zeros([len(windows), 64])
  end_logits = np.zeros([len(windows), 64])
  for row, window in enumerate(windows):
    assert window.start_position > 0 and window.end_position >= window.start_position
    start_logits[row, window.start_position] = end_logits[row, window.end_position] = 5.0
  answers = squad_eval.best_answers(windows, start_logits, end_logits, 20, 30)
  assert answers == {f"q{i}": text for i, (text, _) in enumerate(ANSWERS)}


def test_window_starts_and_max_context_follow_run_squad():
  # 10 tokens, windows of 4, stride 3: 0-3, 3-6, 6-9 (the last reaches the end).
  assert squad.window_starts(10, 4, 3) == [(0, 4), (3, 4), (6, 4)]
  assert squad.window_starts(4, 4, 3) == [(0, 4)]
  assert squad.window_starts(11, 4, 2) == [(0, 4), (2, 4), (4, 4), (6, 4), (8, 3)]
  spans = [(0, 4), (3, 4), (6, 4)]
  # Token 4: window 1 sees 1 left and 2 right (score 1.04), window 0 does not see it.
  assert squad._max_context(spans, 1, 4)
  # Token 3: window 0 has 3 left, 0 right (0.04); window 1 has 0 left, 3 right (0.04):
  # a tie goes to the first, as in _check_is_max_context.
  assert squad._max_context(spans, 0, 3) and not squad._max_context(spans, 1, 3)
  # Token 6: window 1 has min(3, 0) = 0; window 2 has min(0, 3) = 0: the first again.
  assert squad._max_context(spans, 1, 6) and not squad._max_context(spans, 2, 6)


def test_long_contexts_are_read_in_windows_with_their_answer_targets():
  vocabulary = _vocabulary("wordpiece")
  words = [f"w{i}" for i in range(40)]  # "w", "##0"... : pieces of known offsets
  context = " ".join(words)
  answer_start = context.index("w25")
  example = squad.Example("q", "which?", context, [squad.Answer("w25 w26", answer_start)])
  ((context_ids, spans),) = vocabulary.encode_with_offsets([context])
  question = vocabulary.encode("which?")
  head = 1 + len(question) + 1
  seq_length, stride = head + 20 + 1, 8
  windows = squad.windows([example], vocabulary, seq_length, stride, 64, token_types=True)
  starts = squad.window_starts(len(context_ids), 20, stride)
  assert len(windows) == len(starts) > 2
  first_token = next(i for i, (s, _) in enumerate(spans) if s == answer_start)
  last_token = max(i for i, (_, e) in enumerate(spans) if e <= answer_start + 7)
  for window, (start, length) in zip(windows, starts):
    assert window.input_ids == ([vocabulary.cls_id] + question + [vocabulary.sep_id]
                                + context_ids[start:start + length] + [vocabulary.sep_id])
    assert window.token_type_ids == [0] * head + [1] * (length + 1)
    if start <= first_token and last_token < start + length:  # the whole answer inside
      assert (window.start_position, window.end_position) == (
          head + first_token - start, head + last_token - start)
      got = window.spans[window.start_position][0], window.spans[window.end_position][1]
      assert context[got[0]:got[1]] == "w25 w26"
    else:
      assert (window.start_position, window.end_position) == (0, 0)
  assert sum(w.start_position > 0 for w in windows) >= 2  # seen whole by several
  # Every context token has exactly one window where it has the most context.
  for token in range(len(context_ids)):
    assert sum(w.max_context[head + token - s] for w, (s, l) in zip(windows, starts)
               if s <= token < s + l) == 1


def _window(example, context_spans, length=8):
  """A hand-made window: [CLS] q [SEP] then one context token per span, [SEP]."""
  spans = [None, None, None] + list(context_spans) + [None]
  spans += [None] * (length - len(spans))
  ids = list(range(len(context_spans) + 4))
  return squad.Window(example, ids, [0] * len(ids), spans,
                      [s is not None for s in spans])


def test_n_best_decoding_by_hand():
  context = "alpha beta gamma delta"
  example = squad.Example("q", "?", context, [squad.Answer("beta", 6)])
  window = _window(example, [(0, 5), (6, 10), (11, 16), (17, 22)])
  # Tokens 3..6 are alpha, beta, gamma, delta.
  starts = np.array([[0.0, 0, 0, 1.0, 4.0, -5.0, -5.0, 0]])
  ends = np.array([[0.0, 0, 0, 0, 1.0, 0, 6.0, 0]])
  # Best pair: start beta (4) .. end delta (6): 4 + 6 = 10 -> "beta gamma delta".
  assert squad_eval.best_answers([window], starts, ends, 20, 30) == {
      "q": "beta gamma delta"}
  # At most 2 tokens: beta..delta (3 tokens) is out; alpha..beta: 1 + 1 = 2 and
  # gamma..delta: -5 + 6 = 1 lose to beta..beta: 4 + 1 = 5.
  assert squad_eval.best_answers([window], starts, ends, 20, 2) == {"q": "beta"}
  # n_best_size 1: only the best start (beta) and the best end (delta) are paired.
  assert squad_eval.best_answers([window], starts, ends, 1, 2) == {"q": ""}
  # An end before the start is never an answer, nor are the question's tokens: alpha
  # (1 + 3.5) beats beta..beta (4 + 0).
  ends_before = np.array([[9.0, 9.0, 0, 3.5, 0, 0, 0, 0]])
  assert squad_eval.best_answers([window], starts, ends_before, 20, 30) == {"q": "alpha"}
  # A start outside the window giving it the most context is skipped.
  window.max_context[4] = False
  assert squad_eval.best_answers([window], starts, ends, 20, 30) == {
      "q": "alpha beta gamma delta"}


def test_no_answer_threshold_by_hand():
  example = squad.Example("q", "?", "alpha beta", [])
  window = _window(example, [(0, 5), (6, 10)], length=6)
  ends = np.array([[2.0, 0, 0, 0, 1.0, 0]])
  starts = np.array([[2.0, 0, 0, 0, 2.0, 0]])
  # Null score 2 + 2 = 4; best span beta: 2 + 1 = 3; 4 - 3 = 1.
  assert squad_eval.best_answers([window], starts, ends, 20, 30) == {"q": "beta"}
  assert squad_eval.best_answers([window], starts, ends, 20, 30, True, 0.5) == {"q": ""}
  assert squad_eval.best_answers([window], starts, ends, 20, 30, True, 1.0) == {"q": "beta"}
  # With two windows the null score is the lowest of theirs.
  other = _window(example, [(0, 5), (6, 10)], length=6)
  both = squad_eval.best_answers([window, other], np.concatenate([starts, starts * 0]),
                                 np.concatenate([ends, ends * 0]), 20, 30, True, 0.5)
  assert both == {"q": "beta"}  # null 0 now, best span still 3


def test_official_scores_by_hand():
  assert squad_eval.normalize_answer("The  Cat, (an) A-team!") == "cat ateam"
  examples = [squad.Example("1", "?", "", [squad.Answer("the red dog", 0),
                                           squad.Answer("a big red dog", 0)]),
              squad.Example("2", "?", "", [squad.Answer("Paris", 0)]),
              squad.Example("3", "?", "", [])]
  predictions = {"1": "Red dog barks", "2": "paris.", "3": ""}
  # 1: vs "red dog": EM 0, F1 p 2/3 r 1 -> 0.8; vs "big red dog": p 2/3 r 2/3 -> 2/3.
  # 2: EM 1 F1 1.  3 (v2.0, no answer, predicted ""): EM 1 F1 1.
  scores = squad_eval.scores(predictions, examples, version_2=True)
  assert scores["exact_match"] == pytest.approx(200 / 3)
  assert scores["f1"] == pytest.approx(100 * (0.8 + 1 + 1) / 3)
  assert scores["has_answer_f1"] == pytest.approx(100 * 1.8 / 2)
  assert scores["no_answer_exact_match"] == 100.0
  assert squad_eval.scores({"3": "x"}, examples, True)["no_answer_f1"] == 0.0
  v1 = squad_eval.scores(predictions, examples[:2], version_2=False)
  assert set(v1) == {"exact_match", "f1"} and v1["exact_match"] == 50.0


def _line(path, question_id):
  lines = open(path, encoding="utf-8").read().splitlines()
  return next(i + 1 for i, line in enumerate(lines) if f'"{question_id}"' in line)


def test_squad_files_with_errors_name_file_and_line(tmp_path):
  bad = squad_json(tmp_path / "bad.json", [
      ("Anne went to Bath.", [("a1", "Who?", "Anne", 0), ("a2", "Where?", "Bath", 12)])])
  with pytest.raises(squad.SquadError, match=re.escape(
      f"bad.json' line {_line(bad, 'a2')} (question a2): answer 'Bath' at offset 12 does "
      "not match its context, which has ' Bat' there")):
    squad.read_squad(bad, version_2=False)
  impossible = squad_json(tmp_path / "v2.json", [("Anne went.", [("b1", "Who?", "", 0)])],
                           version_2=True)
  with pytest.raises(squad.SquadError,
                     match=f"v2.json' line {_line(impossible, 'b1')} .*set qa.version_2"):
    squad.read_squad(impossible, version_2=False)
  assert squad.read_squad(impossible, version_2=True)[0].answers == []
  (tmp_path / "list.json").write_text("[1, 2]")
  with pytest.raises(squad.SquadError, match="list.json' is not SQuAD JSON"):
    squad.read_squad(str(tmp_path / "list.json"), False)


# --- runs -----------------------------------------------------------------------------------
def test_qa_trains_on_squad_json_and_writes_squad_predictions(tmp_path):
  data = squad_json(tmp_path / "train.json", QUESTIONS)
  config = qa_config(data, data)
  run = tmp_path / "run"
  result = train.run(config, str(run), show_progress=False, devices=ONE_DEVICE)
  assert {"exact_match", "f1"} <= set(result["eval"])
  method = qa_method.QuestionAnswering(config)
  assert len(method.windows("validation")) > 6  # long contexts in several windows
  count, output = train.predict(config, str(run), data, devices=ONE_DEVICE)
  predictions = json.loads(open(output, encoding="utf-8").read())
  assert count == 6 and sorted(predictions) == [str(i) for i in range(1, 7)]
  contexts = {qid: context for context, qas in QUESTIONS for qid, *_ in qas}
  for qid, answer in predictions.items():  # spans of the context, at most 30 tokens
    assert answer in contexts[qid]
  # The predictions score as the run's last evaluation did.
  examples = squad.read_squad(data, False)
  assert squad_eval.scores(predictions, examples, False)["f1"] == pytest.approx(
      result["eval"]["f1"])


class TinySquad(tfds.core.GeneratorBasedBuilder):
  """A local TFDS dataset with squad/v2.0's features, of hand-made questions."""
  VERSION = tfds.core.Version("1.0.0")

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
        "id": tfds.features.Text(), "title": tfds.features.Text(),
        "context": tfds.features.Text(), "question": tfds.features.Text(),
        "answers": tfds.features.Sequence({"text": tfds.features.Text(),
                                           "answer_start": np.int32})}))

  def _split_generators(self, dl_manager):
    return {"train": self._generate_examples(), "validation": self._generate_examples()}

  def _generate_examples(self):
    for context, qas in QUESTIONS:
      for qid, question, text, start in qas:
        yield qid, {"id": qid, "title": "t", "context": context, "question": question,
                    "answers": {"text": [text], "answer_start": [start]}}
    yield "7", {"id": "7", "title": "t", "context": QUESTIONS[0][0],
                "question": "Who drove?", "answers": {"text": [], "answer_start": []}}


def test_qa_reads_a_tfds_squad_dataset(tmp_path):
  TinySquad(data_dir=str(tmp_path)).download_and_prepare()
  config = qa_config()
  config.data.tfds_name, config.data.tfds_data_dir = "tiny_squad:1.0.0", str(tmp_path)
  config.qa.version_2 = True
  config.train.steps = 2
  method = qa_method.QuestionAnswering(config)
  examples = {e.id: e for e in method.examples("validation")}
  assert examples["3"].answers == [squad.Answer("Lady Russell", 32)]
  assert examples["7"].answers == []
  result = train.run(config, str(tmp_path / "run"), show_progress=False, devices=ONE_DEVICE)
  assert {"has_answer_f1", "no_answer_exact_match"} <= set(result["eval"])

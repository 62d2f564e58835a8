"""SQuAD (v1.1 and v2.0) examples and the windows the model reads.

    SQuAD JSON {'data': [{'title', 'paragraphs': [{'context', 'qas': [{'id', 'question',
      'answers': [{'text', 'answer_start'}], ['is_impossible']}]}]}]}  (or TFDS squad)
      -> Example(id, question, context, answers)
      -> Window: [CLS] question [SEP] context[window] [SEP]

Contexts longer than the sequence allows are read in windows, as BERT's run_squad.py
does (google-research/bert, convert_examples_to_features): a window holds up to
`seq_length - question - 3` context tokens (one separator more for RoBERTa's double
one) and the next window starts `doc_stride` tokens further. Each context token has its
character span in the context (the vocabulary's `encode_with_offsets`), so an answer
predicted as tokens s..e is context[start of s : end of e], exactly the original text;
and `max_context` marks, for a token seen by several windows, the window where it has
the most context on its shorter side (BERT's _check_is_max_context), the only one whose
predictions may start there. A training window's target is the answer's first and last
token, or [CLS] (index 0) for a question without an answer and for a window that does
not hold the whole answer.
"""
from __future__ import annotations

import dataclasses
import json

import numpy as np

from encoderx import files as files_lib
from encoderx.data import example_tasks, labelled


@dataclasses.dataclass
class Answer:
  text: str
  start: int  # character offset in the context


@dataclasses.dataclass
class Example:
  id: str
  question: str
  context: str
  answers: list[Answer]  # empty: no answer (SQuAD v2.0 is_impossible)


@dataclasses.dataclass
class Window:
  """One window of a context with its question: a row of the model's input."""
  example: Example
  input_ids: list[int]
  token_type_ids: list[int]
  spans: list  # per token: (start, end) in the context for context tokens, else None
  max_context: list[bool]  # per token: this window gives it the most context
  start_position: int = 0  # the answer's first and last token; 0 ([CLS]): no answer
  end_position: int = 0


class SquadError(labelled.LabelledDataError):
  """A SQuAD file that cannot be used; the message names the file and line."""


def _line_of(raw: str, question_id: str) -> int:
  """The line of a question in the file (found by its id, which SQuAD keeps unique)."""
  position = raw.find(json.dumps(question_id))
  return raw.count("\n", 0, position) + 1 if position >= 0 else 0


def read_squad(path: str, version_2: bool, with_answers: bool = True) -> list[Example]:
  """The questions of a SQuAD JSON file. Every answer must be the context's text at its
  offset; questions marked is_impossible need `version_2`; with `with_answers` (training
  and dev files) every other question needs an answer."""
  try:
    raw = files_lib.read_text(path)
    articles = json.loads(raw)["data"]
  except OSError as error:
    raise SquadError(f"cannot open '{path}': {error.strerror}.") from None
  except (ValueError, KeyError, TypeError) as error:
    raise SquadError(f"'{path}' is not SQuAD JSON ({{'data': [articles]}}): "
                     f"{error}.") from None
  examples = []
  for article in articles:
    for paragraph in article["paragraphs"]:
      context = paragraph["context"]
      for qa in paragraph["qas"]:
        where = f"'{path}' line {_line_of(raw, qa['id'])} (question {qa['id']})"
        impossible = bool(qa.get("is_impossible", False))
        if impossible and not version_2:
          raise SquadError(f"{where} has no answer (is_impossible), a SQuAD v2.0 "
                           "question; set qa.version_2=True.")
        answers = [] if impossible else [Answer(a["text"], int(a["answer_start"]))
                                         for a in qa.get("answers", [])]
        for answer in answers:
          found = context[answer.start:answer.start + len(answer.text)]
          if found != answer.text:
            raise SquadError(f"{where}: answer {answer.text!r} at offset {answer.start} "
                             f"does not match its context, which has {found!r} there.")
        if with_answers and not answers and not impossible:
          raise SquadError(f"{where} has no answer and is not marked is_impossible.")
        examples.append(Example(qa["id"], qa["question"], context, answers))
  if not examples:
    raise SquadError(f"'{path}' holds no questions.")
  return examples


def read_tfds(data_config, split: str) -> list[Example]:
  """The questions of a TFDS SQuAD split (squad/v1.1 or squad/v2.0: id, question,
  context, answers {text, answer_start}; v2.0 questions without an answer have none)."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  builder = tfds.builder(data_config.tfds_name,
                         data_dir=files_lib.optional(data_config.tfds_data_dir))
  text = lambda value: value.decode("utf-8")  # pylint: disable=unnecessary-lambda-assignment
  return [Example(text(ex["id"]), text(ex["question"]), text(ex["context"]),
                  [Answer(text(t), int(s)) for t, s in zip(ex["answers"]["text"],
                                                           ex["answers"]["answer_start"])])
          for ex in tfds.as_numpy(builder.as_dataset(split=split, shuffle_files=False))]


def window_starts(context_tokens: int, window: int, stride: int) -> list[tuple[int, int]]:
  """(start, length) of each window over `context_tokens` tokens: `window` tokens at
  most, each `stride` after the last, until one reaches the end (BERT's doc spans)."""
  spans, start = [], 0
  while True:
    length = min(context_tokens - start, window)
    spans.append((start, length))
    if start + length >= context_tokens:
      return spans
    start += min(length, stride)


def _max_context(spans: list[tuple[int, int]], index: int, position: int) -> bool:
  """Whether window `index` gives context token `position` the most context: the larger
  min(tokens left, tokens right) + 0.01 x window length (BERT's _check_is_max_context)."""
  def score(start, length):
    return min(position - start, start + length - 1 - position) + 0.01 * length
  best = max((i for i, (s, l) in enumerate(spans) if s <= position < s + l),
             key=lambda i: score(*spans[i]))
  return best == index


def windows(examples: list[Example], vocabulary, seq_length: int, doc_stride: int,
            max_query_length: int, token_types: bool) -> list[Window]:
  """Every example's windows, in order; targets from each example's first answer."""
  contexts = list(dict.fromkeys(e.context for e in examples))
  tokenized = dict(zip(contexts, vocabulary.encode_with_offsets(contexts)))
  questions = vocabulary.encode_with_offsets([e.question for e in examples])
  separators = getattr(vocabulary, "pair_separators", 1)
  cls, sep = vocabulary.cls_id, vocabulary.sep_id
  result = []
  for example, (question, _) in zip(examples, questions):
    question = question[:max_query_length]
    context_ids, context_spans = tokenized[example.context]
    head = [cls] + question + [sep] * separators
    spans = window_starts(len(context_ids), seq_length - len(head) - 1, doc_stride)
    for index, (start, length) in enumerate(spans):
      ids = head + context_ids[start:start + length] + [sep]
      types = [0] * len(head) + [1] * (length + 1) if token_types else [0] * len(ids)
      token_spans = ([None] * len(head) + context_spans[start:start + length] + [None])
      max_context = ([False] * len(head) + [_max_context(spans, index, start + i)
                                            for i in range(length)] + [False])
      window = Window(example, ids, types, token_spans, max_context)
      if example.answers:
        window.start_position, window.end_position = _answer_tokens(
            example.answers[0], token_spans)
      result.append(window)
  return result


def _answer_tokens(answer: Answer, spans: list) -> tuple[int, int]:
  """The first and last token of `answer` in a window (0, 0 when it is not all there)."""
  start, end = answer.start, answer.start + len(answer.text)
  inside = [i for i, span in enumerate(spans) if span is not None
            and span[0] < end and span[1] > start]
  context = [i for i, span in enumerate(spans) if span is not None]
  if not inside or spans[context[0]][0] > start or spans[context[-1]][1] < end:
    return 0, 0
  return inside[0], inside[-1]


def columns(windows_: list[Window], seq_length: int) -> dict[str, np.ndarray]:
  """The Task's source columns ([windows, seq_length] int32 model features, targets and
  each window's index)."""
  count = len(windows_)
  ids = np.zeros([count, seq_length], np.int32)
  types = np.zeros([count, seq_length], np.int32)
  real = np.zeros([count, seq_length], np.int32)
  for i, window in enumerate(windows_):
    ids[i, :len(window.input_ids)] = window.input_ids
    types[i, :len(window.token_type_ids)] = window.token_type_ids
    real[i, :len(window.input_ids)] = 1
  return {
      "input_ids": ids, "token_type_ids": types, "segment_ids": real,
      "positions": np.broadcast_to(np.arange(seq_length, dtype=np.int32), ids.shape).copy(),
      "start_positions": np.array([w.start_position for w in windows_], np.int32),
      "end_positions": np.array([w.end_position for w in windows_], np.int32),
      "window_index": np.arange(count, dtype=np.int32)}


def register_task(windows_fn: dict, sources: dict, seq_length: int, vocabulary,
                  description: list, shuffle_buffer: int):
  """The Task whose split `s` holds the windows `windows_fn[s]()` (of `sources[s]`)."""
  cols = {split: (lambda split=split: columns(windows_fn[split](), seq_length))
          for split in windows_fn}
  return example_tasks.register("qa", [dict(sources), seq_length, *description], cols,
                                vocabulary, (), shuffle_buffer)

"""GLUE's tasks: their files as distributed, their TFDS datasets, and the one form the
fine-tuning methods read.

    task = glue.TASKS["mrpc"]
    splits = glue.read_directory(task, "glue_data")       # GLUE's own TSVs
    splits = glue.read_tfds(task, data_dir="")            # or TFDS glue/mrpc
    files = glue.write_examples(splits, "out/data/mrpc")  # {split: TSV label, text[, text_pair]}

The eight tasks of the GLUE dev table (Wang et al. 2019; WNLI and the diagnostic set
left out, as BERT, RoBERTa and ELECTRA leave them out of theirs), each with the layout
of the files that GLUE's download script (`download_glue_data.py`) writes:

| task | directory | header | texts | label |
|---|---|---|---|---|
| cola | CoLA | none: source, label, original notation, sentence | sentence (4th) | 0 / 1 (2nd) |
| sst2 | SST-2 | sentence, label | sentence | 0 / 1 |
| mrpc | MRPC | Quality, #1 ID, #2 ID, #1 String, #2 String | #1 String, #2 String | Quality 0 / 1 |
| stsb | STS-B | index, genre, filename, year, old_index, source1, source2, sentence1, sentence2, score | sentence1, sentence2 | score 0-5 |
| qqp | QQP | id, qid1, qid2, question1, question2, is_duplicate | question1, question2 | is_duplicate 0 / 1 |
| mnli | MNLI | index, promptID, pairID, genre, ... sentence1, sentence2, label1, [label2-5,] gold_label | sentence1, sentence2 | gold_label |
| qnli | QNLI | index, question, sentence, label | question, sentence | entailment / not_entailment |
| rte | RTE | index, sentence1, sentence2, label | sentence1, sentence2 | entailment / not_entailment |

Files are read with quoting off (MNLI's and QQP's texts hold quotes), as the GLUE
baselines and Hugging Face's `glue` loader read them; MNLI's dev sets are
dev_matched.tsv and dev_mismatched.tsv. Labels are named as TFDS names them (its
ClassLabel names, in its id order: 0 / 1 in a TSV become 'unacceptable' / 'acceptable'
for CoLA...), so that both sources give the same label ids, and F1 is that of id 1 (MRPC's
'equivalent', QQP's 'duplicate'), as GLUE scores it. A missing file or column, a row
with another number of fields than its header, a label outside the task's, a score that
is not a number or bytes that are not UTF-8 stop with a line naming the file and row.
"""
from __future__ import annotations

import dataclasses
import os

from encoderx import files as files_lib
from encoderx.data import labelled

# The normalized files' columns (finetune.text_column, text_pair_column, label_column).
TEXT, TEXT_PAIR, LABEL = "text", "text_pair", "label"


@dataclasses.dataclass(frozen=True)
class Split:
  """One split of a task: its file in GLUE's directory and its TFDS split."""
  name: str  # 'train', 'dev', 'dev_matched', 'dev_mismatched'
  file: str
  tfds_split: str


@dataclasses.dataclass(frozen=True)
class Task:
  """A GLUE task: where its files are, how to read them, what trains on them.

  `texts` / `label` name header columns, or for a file without a header (CoLA) are
  0-based column indices with `columns` fields in every row. `labels`: the label names in
  TFDS's id order (() for STS-B's scores); `tsv_labels` maps a TSV's label values to them
  where they differ. `tfds_texts`: the TFDS features of the texts (the label is 'label').
  """
  name: str
  directory: str
  method: str  # 'classify' or 'similarity'
  texts: tuple
  label: str | int
  labels: tuple[str, ...]
  tfds_texts: tuple[str, ...]
  dev_splits: tuple[Split, ...] = (Split("dev", "dev.tsv", "validation"),)
  tsv_labels: dict = dataclasses.field(default_factory=dict)
  columns: int = 0  # fields of a row of a file without a header; 0: the file has one

  @property
  def splits(self) -> tuple[Split, ...]:
    return (Split("train", "train.tsv", "train"),) + self.dev_splits

  @property
  def pair(self) -> bool:
    return len(self.tfds_texts) == 2


def _binary(negative: str, positive: str) -> dict:
  return {"labels": (negative, positive), "tsv_labels": {"0": negative, "1": positive}}


NLI = ("entailment", "not_entailment")
TASKS: dict[str, Task] = {task.name: task for task in (
    Task("cola", "CoLA", "classify", texts=(3,), label=1, columns=4,
         tfds_texts=("sentence",), **_binary("unacceptable", "acceptable")),
    Task("sst2", "SST-2", "classify", texts=("sentence",), label="label",
         tfds_texts=("sentence",), **_binary("negative", "positive")),
    Task("mrpc", "MRPC", "classify", texts=("#1 String", "#2 String"), label="Quality",
         tfds_texts=("sentence1", "sentence2"), **_binary("not_equivalent", "equivalent")),
    Task("stsb", "STS-B", "similarity", texts=("sentence1", "sentence2"), label="score",
         labels=(), tfds_texts=("sentence1", "sentence2")),
    Task("qqp", "QQP", "classify", texts=("question1", "question2"), label="is_duplicate",
         tfds_texts=("question1", "question2"), **_binary("not_duplicate", "duplicate")),
    Task("mnli", "MNLI", "classify", texts=("sentence1", "sentence2"), label="gold_label",
         labels=("entailment", "neutral", "contradiction"),
         tfds_texts=("premise", "hypothesis"),
         dev_splits=(Split("dev_matched", "dev_matched.tsv", "validation_matched"),
                     Split("dev_mismatched", "dev_mismatched.tsv",
                           "validation_mismatched"))),
    Task("qnli", "QNLI", "classify", texts=("question", "sentence"), label="label",
         labels=NLI, tfds_texts=("question", "sentence")),
    Task("rte", "RTE", "classify", texts=("sentence1", "sentence2"), label="label",
         labels=NLI, tfds_texts=("sentence1", "sentence2")),
)}


class GlueDataError(labelled.LabelledDataError):
  """A GLUE file or dataset that cannot be used; the message names the file and row."""


@dataclasses.dataclass
class Examples:
  """A split's examples: texts (and pairs), and labels as names (or scores as written)."""
  source: str  # the file, or the TFDS dataset and split, they were read from
  texts: list[str] = dataclasses.field(default_factory=list)
  pairs: list[str] = dataclasses.field(default_factory=list)
  labels: list[str] = dataclasses.field(default_factory=list)

  def __len__(self) -> int:
    return len(self.labels)


def _label(task: Task, value: str, where: str) -> str:
  """A row's label as the task names it (a score checked to be a number)."""
  if not task.labels:
    try:
      float(value)
    except ValueError:
      raise GlueDataError(f"{where}: score {value!r} is not a number.") from None
    return value
  name = task.tsv_labels.get(value, value)
  if name not in task.labels:
    known = sorted(task.tsv_labels) if task.tsv_labels else list(task.labels)
    raise GlueDataError(f"{where}: label {value!r} is not one of "
                        f"{', '.join(map(repr, known))}.")
  return name


def read_file(task: Task, path: str) -> Examples:
  """A GLUE TSV of `task` as distributed (see the module doc)."""
  if not files_lib.path(path).is_file():
    raise GlueDataError(f"GLUE task {task.name}: '{path}' is missing (GLUE's layout: "
                        f"{task.directory}/{', '.join(s.file for s in task.splits)}).")
  examples, header, positions = Examples(path), None, None
  for number, line in labelled.numbered_lines(path):
    if not line.strip():
      continue
    fields = line.split("\t")
    where = f"'{path}' line {number}"
    if positions is None:
      if task.columns:  # no header: columns by position
        header, positions = None, [*task.texts, task.label]
      else:
        header = [name.lstrip("\ufeff") for name in fields]  # a BOM before the first
        missing = [c for c in (*task.texts, task.label) if c not in header]
        if missing:
          raise GlueDataError(
              f"'{path}': the header (line {number}) has no column "
              f"{', '.join(map(repr, missing))}; GLUE's {task.directory} files have "
              f"{', '.join(map(repr, (*task.texts, task.label)))}.")
        positions = [header.index(c) for c in (*task.texts, task.label)]
        continue
    expected = task.columns or len(header)
    if len(fields) != expected:
      raise GlueDataError(f"{where} has {len(fields)} fields; "
                          + (f"the header has {expected}." if header else
                             f"GLUE's {task.directory} rows have {expected}."))
    values = [fields[p] for p in positions]
    examples.texts.append(values[0])
    if task.pair:
      examples.pairs.append(values[1])
    examples.labels.append(_label(task, values[-1], where))
  if not examples.labels:
    raise GlueDataError(f"'{path}' holds no examples.")
  return examples


def read_directory(task: Task, directory: str) -> dict[str, Examples]:
  """{split: examples} of `task` from a directory in GLUE's layout (DIR/CoLA/train.tsv,
  ...): its train and dev splits."""
  return {split.name: read_file(task, os.path.join(directory, task.directory, split.file))
          for split in task.splits}


def tfds_name(task: Task) -> str:
  return f"glue/{task.name}"


def read_tfds(task: Task, data_dir: str = "", download: bool = True
              ) -> dict[str, Examples]:
  """{split: examples} of `task` from TFDS's glue/<task> (downloaded and prepared in
  `data_dir` first unless it is there, or `download` is False): the features of
  `task.tfds_texts` and `label`, label ids named by TFDS's ClassLabel."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  name = tfds_name(task)
  builder = tfds.builder(name, data_dir=files_lib.optional(data_dir))
  if download:
    builder.download_and_prepare()
  features = builder.info.features
  missing = [f for f in (*task.tfds_texts, "label") if f not in features]
  if missing:
    raise GlueDataError(f"TFDS dataset {name} has no feature {', '.join(missing)} (it "
                        f"has {', '.join(features.keys())}).")
  names = () if not task.labels else tuple(features["label"].names)
  if names and names != task.labels:
    raise GlueDataError(f"TFDS dataset {name} names its labels {names}, not {task.labels}.")
  splits = {}
  for split in task.splits:
    source = f"{name}[{split.tfds_split}]"
    examples = Examples(source)
    try:
      dataset = builder.as_dataset(split=split.tfds_split, shuffle_files=False)
    except (ValueError, KeyError) as error:  # an unknown split
      raise GlueDataError(f"TFDS dataset {name}: no split '{split.tfds_split}' "
                          f"({' '.join(str(error).split())}).") from None
    for index, example in enumerate(tfds.as_numpy(dataset)):
      texts = [example[f].decode("utf-8") for f in task.tfds_texts]
      examples.texts.append(texts[0])
      if task.pair:
        examples.pairs.append(texts[1])
      label = example["label"]
      if names and not 0 <= int(label) < len(names):
        raise GlueDataError(f"{source} example {index}: label {int(label)} is not a label "
                            "id (a test split has none).")
      examples.labels.append(names[int(label)] if names else repr(float(label)))
    if not examples.labels:
      raise GlueDataError(f"{source} holds no examples.")
    splits[split.name] = examples
  return splits


def _clean(text: str) -> str:
  """A text as one TSV field (TFDS's texts may hold tabs or line breaks)."""
  return " ".join(text.replace("\t", " ").splitlines())


def write_examples(splits: dict[str, Examples], directory: str) -> dict[str, str]:
  """Writes each split as `directory`/<split>.tsv with the columns label, text[,
  text_pair] (what the classify and similarity methods read); returns {split: path}."""
  paths = {}
  for split, examples in splits.items():
    header = [LABEL, TEXT] + ([TEXT_PAIR] if examples.pairs else [])
    rows = zip(examples.labels, examples.texts, *([examples.pairs] if examples.pairs else []))
    lines = ["\t".join(header)] + ["\t".join(_clean(f) for f in row) for row in rows]
    paths[split] = os.path.join(directory, f"{split}.tsv")
    files_lib.write_atomically(paths[split], "\n".join(lines) + "\n")
  return paths

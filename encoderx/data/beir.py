"""A retrieval set in BEIR's layout: its corpus, queries and relevance judgements.

    collection = beir.read_directory("scifact", split="test")
    collection.corpus    # {doc id: text}   (title and text joined, as BEIR embeds them)
    collection.queries   # {query id: text} (only the judged ones)
    collection.qrels     # {query id: {doc id: relevance}}

The layout (Thakur et al. 2021; beir/datasets/data_loader.py, GenericDataLoader):

    DIR/corpus.jsonl       {"_id": ..., "title": ..., "text": ...} a line (title optional)
    DIR/queries.jsonl      {"_id": ..., "text": ...} a line
    DIR/qrels/SPLIT.tsv    a header (skipped, as BEIR's loader skips it), then
                           query-id <tab> corpus-id <tab> score (an integer) a line

A document's text is its title and text joined by a space, stripped, as BEIR's
sentence-transformers models embed it (beir/retrieval/models/sentence_bert.py,
SentenceBERT.encode_corpus). As BEIR's loader does, only the queries that the split
judges are kept. Every problem stops with a line naming the file and its line: a missing
file or split, a line that is not a JSON object or lacks _id or text, an id given twice,
a judgement row without three fields or with a score that is not an integer, a
judgement naming a query or document that is not in the files, a split judging nothing.
"""
from __future__ import annotations

import dataclasses
import os

from encoderx import errors
from encoderx import files as files_lib
from encoderx.data import labelled

CORPUS, QUERIES, QRELS = "corpus.jsonl", "queries.jsonl", "qrels"
QRELS_COLUMNS = ["query-id", "corpus-id", "score"]


class RetrievalDataError(errors.UserError, ValueError):
  """A retrieval set that cannot be used; the message names the file and line."""


@dataclasses.dataclass(frozen=True)
class Collection:
  """One split of a BEIR directory (see the module docstring)."""
  corpus: dict[str, str]
  queries: dict[str, str]
  qrels: dict[str, dict[str, int]]


def _texts(path: str, title: bool) -> dict[str, str]:
  """{_id: text} of a corpus or queries file; a corpus' title joined before its text."""
  if not files_lib.path(path).exists():
    raise RetrievalDataError(f"no '{path}' (a BEIR directory holds {CORPUS}, {QUERIES} "
                             f"and {QRELS}/SPLIT.tsv).")
  columns = ["_id", "text"] + (["title"] if title else [])
  texts, lines = {}, {}
  for number, row in labelled.read_rows(path, columns, "jsonl",
                                        optional=("title",) if title else ()):
    if row["_id"] in texts:
      raise RetrievalDataError(f"'{path}' line {number}: _id {row['_id']!r} is that of "
                               f"line {lines[row['_id']]} too.")
    texts[row["_id"]] = (f"{row['title']} {row['text']}" if title else row["text"]).strip()
    lines[row["_id"]] = number
  return texts


def read_qrels(path: str, corpus: dict[str, str],
               queries: dict[str, str]) -> dict[str, dict[str, int]]:
  """{query id: {doc id: score}} of a qrels TSV whose ids are all in `corpus` and
  `queries`; its first line, the header, is skipped, as BEIR's loader skips it."""
  qrels: dict[str, dict[str, int]] = {}
  for number, line in labelled.numbered_lines(path):
    if number == 1 or not line.strip():
      continue
    fields = line.split("\t")
    if len(fields) != 3:
      raise RetrievalDataError(f"'{path}' line {number} has {len(fields)} fields; a "
                               f"judgement has 3: {', '.join(QRELS_COLUMNS)}.")
    query, doc, score = fields
    try:
      score = int(score)
    except ValueError:
      raise RetrievalDataError(f"'{path}' line {number}: score {score!r} is not an "
                               "integer.") from None
    if query not in queries:
      raise RetrievalDataError(f"'{path}' line {number}: query-id {query!r} is not in "
                               f"{QUERIES}.")
    if doc not in corpus:
      raise RetrievalDataError(f"'{path}' line {number}: corpus-id {doc!r} is not in "
                               f"{CORPUS}.")
    qrels.setdefault(query, {})[doc] = score
  return qrels


def read_directory(directory: str, split: str = "test") -> Collection:
  """The corpus, the judged queries and the judgements of `split` (see the module
  docstring); a RetrievalDataError names what is wrong."""
  qrels_path = os.path.join(directory, QRELS, f"{split}.tsv")
  if not files_lib.path(qrels_path).exists():
    qrels_dir = files_lib.path(os.path.join(directory, QRELS))
    splits = sorted(p.name.removesuffix(".tsv") for p in qrels_dir.glob("*.tsv")) \
        if qrels_dir.exists() else []
    raise RetrievalDataError(f"no '{qrels_path}': the split {split!r} is not there "
                             f"(splits: {', '.join(splits) or 'none'}).")
  corpus = _texts(os.path.join(directory, CORPUS), title=True)
  queries = _texts(os.path.join(directory, QUERIES), title=False)
  qrels = read_qrels(qrels_path, corpus, queries)
  if not any(score > 0 for judged in qrels.values() for score in judged.values()):
    raise RetrievalDataError(f"'{qrels_path}' judges no document relevant (score > 0).")
  return Collection(corpus=corpus, queries={q: queries[q] for q in queries if q in qrels},
                    qrels=qrels)

"""Retrieval scores of an embedding model on a BEIR-format set: a command and a library
call.

    python -m encoderx.retrieval --init_from=RUN|hf:DIR --data=DIR [--split=test] \
        [--k=100] [--output=scores.json] [--pooling=mean] [--max_length=256]

prints (and with --output writes) JSON:

    {"ndcg@10": 0.64, "recall@100": 0.93, "mrr@10": 0.61, "queries": 300, "corpus": 5183,
     "k": 100, "data": DIR, "split": "test", "init_from": ...}

DIR is in BEIR's layout (encoderx/data/beir.py: corpus.jsonl, queries.jsonl,
qrels/SPLIT.tsv). The judged queries and every document are embedded by
`encoderx.embed.Embedder` (batched by length, with progress; normalized, so that the inner
product is the cosine, as sentence-transformers' models for retrieval score), the k
nearest documents of each query found exactly by faiss (`IndexFlatIP`: every document
scored), and the ranking scored by pytrec_eval (encoderx/evaluation/retrieval.py: nDCG@10,
Recall@100, MRR@10, the mean over the judged queries). From Python:

    from encoderx import embed, retrieval
    embedder = embed.Embedder("hf:DIR", pooling="mean", normalize=True)
    result = retrieval.evaluate(embedder, beir.read_directory("DIR"), k=100)
"""
from __future__ import annotations

import json

import numpy as np
from absl import flags

from encoderx import cli
from encoderx import embed
from encoderx import errors
from encoderx import files as files_lib
from encoderx.data import beir
from encoderx.evaluation import retrieval as retrieval_scores

FLAGS = flags.FLAGS


def search(queries: np.ndarray, corpus: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
  """The k highest inner products of each query with the corpus, exactly (faiss
  IndexFlatIP): scores float32 [queries, k'] and corpus rows int [queries, k'], best
  first, k' = min(k, corpus rows)."""
  import faiss  # pylint: disable=g-import-not-at-top
  index = faiss.IndexFlatIP(corpus.shape[1])
  index.add(np.ascontiguousarray(corpus, np.float32))
  return index.search(np.ascontiguousarray(queries, np.float32), min(k, corpus.shape[0]))


def rank(embedder: embed.Embedder, collection: beir.Collection, k: int,
         show_progress: bool = False) -> dict[str, dict[str, float]]:
  """{query id: {doc id: cosine}} of each judged query's k nearest documents."""
  query_ids, doc_ids = list(collection.queries), list(collection.corpus)
  queries = embedder([collection.queries[q] for q in query_ids], show_progress, "queries")
  corpus = embedder([collection.corpus[d] for d in doc_ids], show_progress, "corpus")
  found_scores, found_rows = search(queries, corpus, k)
  return {query: {doc_ids[row]: float(score) for score, row in zip(scores, rows)}
          for query, scores, rows in zip(query_ids, found_scores, found_rows)}


def evaluate(embedder: embed.Embedder, collection: beir.Collection, k: int = 100,
             show_progress: bool = False) -> dict[str, float | int]:
  """nDCG@10, Recall@100 and MRR@10 of `embedder` on `collection`, with the counts."""
  run = rank(embedder, collection, k, show_progress)
  return {**retrieval_scores.scores(collection.qrels, run),
          "queries": len(collection.queries), "corpus": len(collection.corpus), "k": k}


def main(argv) -> None:
  del argv
  if FLAGS.k < retrieval_scores.RECALL_AT:
    errors.fail("--k", f"must be at least {retrieval_scores.RECALL_AT} (Recall@"
                f"{retrieval_scores.RECALL_AT} scores the top {retrieval_scores.RECALL_AT}), "
                f"got {FLAGS.k}.")
  collection = beir.read_directory(FLAGS.data, FLAGS.split)  # bad input stops here
  embedder = embed.Embedder(FLAGS.init_from, pooling=FLAGS.pooling, normalize=True,
                            max_length=FLAGS.max_length, batch_size=FLAGS.batch_size)
  result = {**evaluate(embedder, collection, FLAGS.k, show_progress=True),
            "data": FLAGS.data, "split": FLAGS.split, "init_from": FLAGS.init_from}
  text = json.dumps(result, indent=2)
  print(text)
  if FLAGS.output:
    files_lib.write_atomically(FLAGS.output, (text + "\n").encode("utf-8"))


def define_flags() -> None:
  flags.DEFINE_string("init_from", None,
                      "a run's work directory, or hf:DIR (a Hugging Face model)")
  flags.DEFINE_string("data", None, "a BEIR-format directory: corpus.jsonl, queries.jsonl, "
                      "qrels/SPLIT.tsv")
  flags.DEFINE_string("split", "test", "the qrels file to score: qrels/SPLIT.tsv")
  flags.DEFINE_integer("k", 100, "documents retrieved per query (at least 100)")
  flags.DEFINE_string("output", None, "where to write the scores as JSON too")
  flags.DEFINE_enum("pooling", "mean", list(embed.POOLINGS), "how a text's token outputs "
                    "become one vector (the model's: mean for sentence-transformers')")
  flags.DEFINE_integer("batch_size", 64, "texts per batch")
  flags.DEFINE_integer("max_length", 256, "tokens per text at most, [CLS] and [SEP] "
                       "included")
  flags.mark_flags_as_required(["init_from", "data"])


if __name__ == "__main__":
  define_flags()
  cli.run(main)

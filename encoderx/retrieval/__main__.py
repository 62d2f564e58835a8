"""The retrieval command: an embedding model's scores on a BEIR-format set
(retrieval/ranking.py).

    python -m encoderx.retrieval --init_from=RUN|hf:DIR --data=DIR [--split=test] \
        [--k=100] [--output=scores.json] [--pooling=mean] [--max_length=256] \
        [--rerank_with=RUN|hf:DIR --rerank_top=100]

A sentence-transformers model's or an embedding run's pooling, length and query /
document prompts apply where a flag leaves them open; the embeddings are always
normalized.

prints (and with --output writes) JSON:

    {"ndcg@10": 0.64, "recall@100": 0.93, "mrr@10": 0.61, "queries": 300, "corpus": 5183,
     "k": 100, "data": DIR, "split": "test", "init_from": ...}

With --rerank_with, a cross-encoder (a rerank run, or hf:DIR of a CrossEncoder) reorders
each query's --rerank_top first documents (retrieval/reranking.py), and the scores of
that second stage are added: "reranked": {"ndcg@10": ..., "recall@100": ..., "mrr@10":
..., "top": 100, "rerank_with": ...}.
"""
from __future__ import annotations

import json

from absl import flags

from encoderx import cli, embed, errors, retrieval
from encoderx import files as files_lib
from encoderx.data import beir
from encoderx.evaluation import retrieval as retrieval_scores

FLAGS = flags.FLAGS


def main(argv) -> None:
  del argv
  if FLAGS.k < retrieval_scores.RECALL_AT:
    errors.fail("--k", f"must be at least {retrieval_scores.RECALL_AT} (Recall@"
                f"{retrieval_scores.RECALL_AT} scores the top {retrieval_scores.RECALL_AT}), "
                f"got {FLAGS.k}.")
  if FLAGS.rerank_with and not 1 <= FLAGS.rerank_top <= FLAGS.k:
    errors.fail("--rerank_top", f"must be in [1, --k={FLAGS.k}] (the reranker reorders "
                f"the first stage's top documents), got {FLAGS.rerank_top}.")
  collection = beir.read_directory(FLAGS.data, FLAGS.split)  # bad input stops here
  reranker = (retrieval.Reranker(FLAGS.rerank_with, max_length=FLAGS.max_length,
                                 batch_size=FLAGS.batch_size)
              if FLAGS.rerank_with else None)
  embedder = embed.Embedder(FLAGS.init_from, pooling=FLAGS.pooling, normalize=True,
                            max_length=FLAGS.max_length, batch_size=FLAGS.batch_size)
  result = {**retrieval.evaluate(embedder, collection, FLAGS.k, show_progress=True,
                                 reranker=reranker, rerank_top=FLAGS.rerank_top),
            "data": FLAGS.data, "split": FLAGS.split, "init_from": FLAGS.init_from}
  if reranker is not None:
    result["reranked"]["rerank_with"] = FLAGS.rerank_with
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
  flags.DEFINE_enum("pooling", None, list(embed.POOLINGS), "how a text's token outputs "
                    "become one vector (default: the model's, else mean)")
  flags.DEFINE_integer("batch_size", 64, "texts per batch")
  flags.DEFINE_integer("max_length", None, "tokens per text (per query and document pair, "
                       "with --rerank_with) at most, [CLS] and [SEP] included (default: "
                       "the model's, else 256)")
  flags.DEFINE_string("rerank_with", None, "a cross-encoder that reorders each query's "
                      "top documents: a rerank run's work directory, or hf:DIR of a "
                      "CrossEncoder")
  flags.DEFINE_integer("rerank_top", 100, "with --rerank_with: how many of each query's "
                       "first documents it reorders (at most --k)")
  flags.mark_flags_as_required(["init_from", "data"])


if __name__ == "__main__":
  define_flags()
  cli.run(main)

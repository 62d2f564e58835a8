"""Retrieval scores of an embedding model on a BEIR-format set (the command:
retrieval/__main__.py).

DIR is in BEIR's layout (encoderx/data/beir.py: corpus.jsonl, queries.jsonl,
qrels/SPLIT.tsv). The judged queries and every document are embedded by
`encoderx.embed.Embedder` (batched by length, with progress; normalized, so that the inner
product is the cosine, as sentence-transformers' models for retrieval score), the k
nearest documents of each query found exactly by faiss (`IndexFlatIP`: every document
scored), and the ranking scored by pytrec_eval (encoderx/evaluation/retrieval.py: nDCG@10,
Recall@100, MRR@10, the mean over the judged queries):

    from encoderx import embed, retrieval
    embedder = embed.Embedder("hf:DIR", pooling="mean", normalize=True)
    result = retrieval.evaluate(embedder, beir.read_directory("DIR"), k=100)
"""
from __future__ import annotations

from encoderx import embed
from encoderx.data import beir
from encoderx.evaluation import retrieval as retrieval_scores


search = retrieval_scores.search  # faiss' exact search (evaluation/retrieval.py)


def rank(embedder: embed.Embedder, collection: beir.Collection, k: int,
         show_progress: bool = False) -> dict[str, dict[str, float]]:
  """{query id: {doc id: cosine}} of each judged query's k nearest documents; each text
  after the prompt sentence-transformers' encode_query / encode_document would put before
  it (embed.task_prompt: the model's "query" / "document" prompt, else none)."""
  query_ids, doc_ids = list(collection.queries), list(collection.corpus)
  queries = embedder([collection.queries[q] for q in query_ids], show_progress, "queries",
                     prompt=embed.task_prompt(embedder.prompts, "query"))
  corpus = embedder([collection.corpus[d] for d in doc_ids], show_progress, "corpus",
                    prompt=embed.task_prompt(embedder.prompts, "document"))
  return retrieval_scores.ranked(query_ids, queries, doc_ids, corpus, k)


def evaluate(embedder: embed.Embedder, collection: beir.Collection, k: int = 100,
             show_progress: bool = False, reranker=None,
             rerank_top: int = 100) -> dict[str, float | int]:
  """nDCG@10, Recall@100 and MRR@10 of `embedder` on `collection`, with the counts; with
  a `reranker` (retrieval/reranking.py's Reranker), those of the ranking whose top
  `rerank_top` it reordered too, under "reranked"."""
  run = rank(embedder, collection, k, show_progress)
  result = {**retrieval_scores.scores(collection.qrels, run),
            "queries": len(collection.queries), "corpus": len(collection.corpus), "k": k}
  if reranker is not None:
    from encoderx.retrieval import reranking  # pylint: disable=g-import-not-at-top
    reranked = reranking.rerank(reranker, collection, run, rerank_top, show_progress)
    result["reranked"] = {**retrieval_scores.scores(collection.qrels, reranked),
                          "top": rerank_top}
  return result

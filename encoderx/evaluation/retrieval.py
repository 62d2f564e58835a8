"""Scores of a ranking against relevance judgements, from pytrec_eval (trec_eval's
measures, as BEIR scores them: beir/retrieval/evaluation.py, EvaluateRetrieval.evaluate).

    run = {"q1": {"d3": 0.91, "d1": 0.52, ...}, ...}   # each query's retrieved docs, scored
    qrels = {"q1": {"d1": 1, "d7": 2}, ...}            # graded relevance, > 0 relevant
    retrieval.scores(qrels, run)  # {"ndcg@10": ..., "recall@100": ..., "mrr@10": ...}

`ranked` finds each query's nearest documents among embeddings (exactly, by faiss) and
gives the run to score. Each score is the mean over the judged queries. nDCG@10 is trec_eval's `ndcg_cut.10` (graded
gains, log2 discount), Recall@100 its `recall.100` (the relevant documents in the top 100
over all relevant ones), MRR@10 its `recip_rank` of the run cut to each query's top 10
(trec_eval's recip_rank takes no cutoff; BEIR's `mrr` cuts the same way). trec_eval
orders a query's documents by score, ties by document id, both descending; the cut
follows that order.
"""
from __future__ import annotations

import numpy as np

NDCG_AT, RECALL_AT, MRR_AT = 10, 100, 10


def search(queries: np.ndarray, corpus: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
  """The k highest inner products of each query with the corpus, exactly (faiss
  IndexFlatIP): scores float32 [queries, k'] and corpus rows int [queries, k'], best
  first, k' = min(k, corpus rows)."""
  import faiss  # pylint: disable=g-import-not-at-top
  index = faiss.IndexFlatIP(corpus.shape[1])
  index.add(np.ascontiguousarray(corpus, np.float32))
  return index.search(np.ascontiguousarray(queries, np.float32), min(k, corpus.shape[0]))


def ranked(query_ids: list[str], queries: np.ndarray, doc_ids: list[str],
           corpus: np.ndarray, k: int) -> dict[str, dict[str, float]]:
  """{query id: {doc id: inner product}} of each query's k nearest documents; queries
  [len(query_ids), hidden] and corpus [len(doc_ids), hidden] (unit vectors: cosines)."""
  found_scores, found_rows = search(queries, corpus, k)
  return {query: {doc_ids[row]: float(score) for score, row in zip(scores, rows)}
          for query, scores, rows in zip(query_ids, found_scores, found_rows)}


def top(run: dict[str, dict[str, float]], k: int) -> dict[str, dict[str, float]]:
  """Each query's k first documents in trec_eval's order."""
  return {query: dict(sorted(docs.items(), key=lambda item: (item[1], item[0]),
                             reverse=True)[:k])
          for query, docs in run.items()}


def scores(qrels: dict[str, dict[str, int]],
           run: dict[str, dict[str, float]]) -> dict[str, float]:
  """Mean nDCG@10, Recall@100 and MRR@10 over the queries of `qrels`; a judged query
  missing from `run` scores 0."""
  import pytrec_eval  # pylint: disable=g-import-not-at-top
  run = {query: run.get(query, {}) for query in qrels}
  # trec_eval leaves a query without retrieved documents out; it scores 0 here.
  per_query = pytrec_eval.RelevanceEvaluator(
      qrels, {f"ndcg_cut.{NDCG_AT}", f"recall.{RECALL_AT}"}).evaluate(run)
  reciprocal = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(
      top(run, MRR_AT))
  def mean(measures, key):
    return float(np.mean([measures.get(query, {}).get(key, 0.0) for query in qrels]))
  return {f"ndcg@{NDCG_AT}": mean(per_query, f"ndcg_cut_{NDCG_AT}"),
          f"recall@{RECALL_AT}": mean(per_query, f"recall_{RECALL_AT}"),
          f"mrr@{MRR_AT}": mean(reciprocal, "recip_rank")}

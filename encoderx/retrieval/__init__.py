"""Retrieval scores as a library (retrieval/ranking.py): `evaluate`, `rank`, `search`;
a cross-encoder's second stage (retrieval/reranking.py): `Reranker`, `rerank`.

    from encoderx import embed, retrieval
    result = retrieval.evaluate(embed.Embedder("hf:DIR", normalize=True), collection,
                                reranker=retrieval.Reranker("runs/rerank"), rerank_top=100)

The command line is `python -m encoderx.retrieval` (retrieval/__main__.py).
"""
from encoderx.retrieval.ranking import evaluate, rank, search
from encoderx.retrieval.reranking import Reranker, rerank

__all__ = ["Reranker", "evaluate", "rank", "rerank", "search"]

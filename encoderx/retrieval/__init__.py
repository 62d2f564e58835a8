"""Retrieval scores as a library (retrieval/ranking.py): `evaluate`, `rank`, `search`.

    from encoderx import embed, retrieval
    result = retrieval.evaluate(embed.Embedder("hf:DIR", normalize=True), collection)

The command line is `python -m encoderx.retrieval` (retrieval/__main__.py).
"""
from encoderx.retrieval.ranking import evaluate, rank, search

__all__ = ["evaluate", "rank", "search"]

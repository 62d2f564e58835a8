"""Sentence embeddings as a library (embed/embedder.py): `Embedder`, `embed`.

    from encoderx import embed
    vectors = embed.Embedder("hf:DIR", pooling="mean", normalize=True)(texts)

The command line is `python -m encoderx.embed` (embed/__main__.py).
"""
from encoderx.embed.embedder import (BUCKETS, POOLINGS, Embedder, embed, named_prompt,
                                     read_lines, task_prompt)

__all__ = ["BUCKETS", "POOLINGS", "Embedder", "embed", "named_prompt", "read_lines",
           "task_prompt"]

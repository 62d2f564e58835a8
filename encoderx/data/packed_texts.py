"""An embedding model's training texts packed into rows (contrastive.pack_texts).

    packed = packed_texts.pack(texts, rows_multiple=8)   # texts {feature: [chunks, texts, length]}

A contrastive batch embeds every text alone: the anchors, positives and negatives of its
rows, each padded to the batch's length. Sentences are short (STS-B's pairs average 14
tokens at length 64), so most of what a padded batch computes is padding. Here the
texts of each chunk (the whole batch, or one gradient-caching chunk) are placed into
rows of the same length by best-fit decreasing (packing.best_fit), each text with its
own segment id and positions restarting at 0: attention stays inside a text
(masks.segment_mask), so a packed text's hidden states are those it has in a row of its
own, and pooling per text (heads.pool_packed) gives the same embeddings with a fraction
of the tokens computed. sentence-transformers pads each column of texts to its longest
(its collator); packing computes fewer tokens than that (the fine-tuning bench's
embed_stsb row says how many).

The number of packed rows is rounded up to a bucket (ROW_FRACTIONS of the texts, a
multiple of `rows_multiple`: the data-parallel devices) so that a run compiles its step
for a few shapes only, as finetune.length_buckets does for lengths. Packing is
deterministic: the same batch gives the same rows (resume and the order untouched).

Output, for chunks C, texts per chunk T, packed rows per chunk R, length L:
  input_ids, token_type_ids, segment_ids, positions  [C, R, L]  (segment 0: padding)
  token_text  [C, R, L]  the chunk's text each token belongs to (T for padding)
  text_start, text_end  [C, T]  each text's first and last token, as an index into the
                                chunk's R * L tokens
"""
from __future__ import annotations

import math

import numpy as np

from encoderx.data import packing

PACKED_FEATURES = ("input_ids", "token_type_ids", "segment_ids", "positions")
# Packed rows per chunk come in these fractions of its texts (then a multiple of the
# data-parallel devices): one compiled step each.
ROW_FRACTIONS = (1 / 8, 3 / 16, 1 / 4, 5 / 16, 3 / 8, 1 / 2, 5 / 8, 3 / 4, 1)


def row_buckets(texts: int, rows_multiple: int = 1) -> list[int]:
  """The packed row counts a chunk of `texts` texts may take, ascending."""
  return sorted({rows_multiple * math.ceil(math.ceil(texts * f) / rows_multiple)
                 for f in ROW_FRACTIONS})


def pack(texts: dict[str, np.ndarray], rows_multiple: int = 1) -> dict[str, np.ndarray]:
  """`texts` {PACKED_FEATURES: [chunks, texts, length]} (segment_ids > 0 on a text's
  tokens, from its first position) -> the packed rows and maps of the module doc."""
  segments = np.asarray(texts["segment_ids"])
  chunks, count, length = segments.shape
  lengths = (segments > 0).sum(axis=-1)
  placed = [packing.best_fit(lengths[c].tolist(), length) for c in range(chunks)]
  rows = next(r for r in row_buckets(count, rows_multiple)
              if r >= max(len(p) for p in placed))
  packed = {name: np.zeros([chunks, rows, length], np.asarray(texts[name]).dtype)
            for name in PACKED_FEATURES}
  padding = np.asarray(texts["input_ids"])[segments == 0]
  packed["input_ids"][:] = padding[0] if padding.size else 0  # the pipeline's padding id
  packed["token_text"] = np.full([chunks, rows, length], count, np.int32)
  packed["text_start"] = np.zeros([chunks, count], np.int32)
  packed["text_end"] = np.zeros([chunks, count], np.int32)
  for chunk, chunk_rows in enumerate(placed):
    for row, indices in enumerate(chunk_rows):
      start = 0
      for segment, text in enumerate(indices, start=1):
        end = start + lengths[chunk, text]
        for name in ("input_ids", "token_type_ids", "positions"):
          packed[name][chunk, row, start:end] = texts[name][chunk, text, :end - start]
        packed["segment_ids"][chunk, row, start:end] = segment
        packed["token_text"][chunk, row, start:end] = text
        packed["text_start"][chunk, text] = row * length + start
        packed["text_end"][chunk, text] = row * length + max(end - 1, start)
        start = end
  return packed

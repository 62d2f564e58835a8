"""STS-B without training, two ways on the same weights: encoderx's embeddings scored by
encoderx, and sentence-transformers' own evaluation of the same model.

    python -m encoderx.tools.parity.sts_compare --init_from=hf:MODEL_DIR \
        --data=../shared/corpora/stsb/dev.tsv [--pooling=mean] [--max_length=128]

encoderx: `embed.Embedder` (mean pooling and normalization, as the model's
sentence-transformers modules) embeds both columns; the cosine of each pair is scored
against the gold score by Pearson and Spearman (encoderx/evaluation/scores.py: scipy).
sentence-transformers: `SentenceTransformer(MODEL_DIR)` scored by its
`EmbeddingSimilarityEvaluator` on the same pairs (its cosine Pearson and Spearman).
The file is a TSV with columns score, text_a, text_b.
"""
from __future__ import annotations

import numpy as np
from absl import app, flags

from encoderx import embed
from encoderx.data import labelled
from encoderx.evaluation import scores

FLAGS = flags.FLAGS


def read_pairs(path: str) -> tuple[list[str], list[str], np.ndarray]:
  """(first texts, second texts, gold scores [pairs]) of an STS TSV."""
  rows = [row for _, row in labelled.read_rows(path, ["score", "text_a", "text_b"])]
  return ([r["text_a"] for r in rows], [r["text_b"] for r in rows],
          np.array([float(r["score"]) for r in rows]))


def correlations(embedder: embed.Embedder, pairs: tuple[list[str], list[str], np.ndarray]
                 ) -> dict[str, float]:
  """Pearson and Spearman of the cosines of STS `pairs` (read_pairs) with their scores
  (the embedder normalizes)."""
  first, second, gold = pairs
  return scores.correlations(np.sum(embedder(first) * embedder(second), axis=-1), gold)


def main(argv) -> None:
  del argv
  pairs = read_pairs(FLAGS.data)
  first, second, gold = pairs
  embedder = embed.Embedder(FLAGS.init_from, pooling=FLAGS.pooling, normalize=True,
                            max_length=FLAGS.max_length)
  ours = correlations(embedder, pairs)
  from sentence_transformers import SentenceTransformer  # pylint: disable=g-import-not-at-top
  from sentence_transformers.evaluation import EmbeddingSimilarityEvaluator  # pylint: disable=g-import-not-at-top
  model = SentenceTransformer(FLAGS.init_from.removeprefix("hf:"), device="cpu")
  model.max_seq_length = FLAGS.max_length
  theirs = EmbeddingSimilarityEvaluator(first, second, (gold / 5.0).tolist(),
                                        name="sts")(model)
  print(f"{len(gold)} pairs of {FLAGS.data}")
  print(f"encoderx embed + scipy: Pearson {ours['pearson']:.4f}, Spearman "
        f"{ours['spearman']:.4f}")
  print(f"sentence-transformers EmbeddingSimilarityEvaluator: Pearson "
        f"{theirs['sts_pearson_cosine']:.4f}, Spearman {theirs['sts_spearman_cosine']:.4f}")
  print(f"differences: Pearson {abs(ours['pearson'] - theirs['sts_pearson_cosine']):.1e}, "
        f"Spearman {abs(ours['spearman'] - theirs['sts_spearman_cosine']):.1e}")


if __name__ == "__main__":
  flags.DEFINE_string("init_from", None, "hf:DIR, a sentence-transformers model directory.")
  flags.DEFINE_string("data", None, "A TSV of pairs: score, text_a, text_b.")
  flags.DEFINE_enum("pooling", "mean", ["mean", "cls"], "encoderx's pooling (the model's).")
  flags.DEFINE_integer("max_length", 128, "Tokens per text at most, on both sides.")
  flags.mark_flags_as_required(["init_from", "data"])
  app.run(main)

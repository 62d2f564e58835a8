"""A cross-encoder's second stage over a first-stage ranking (`--rerank_with` of
retrieval/__main__.py).

    reranker = Reranker("runs/rerank")          # a rerank run, or hf:DIR of a CrossEncoder
    scores = reranker([(query, document), ...])  # float32 [pairs]: the head's logits
    reranked = rerank(reranker, collection, run, top=100)

`Reranker` scores a pair as encoderx's rerank method (encoderx/methods/rerank.py) and
sentence-transformers' CrossEncoder (cross_encoder/model.py, CrossEncoder.predict with
activation Identity) do: [CLS] query [SEP] document [SEP], cut longest-first to
max_length tokens, one logit on the pooled [CLS] (or on the first token's output, for a
run trained with finetune.pooling=first_token, which has no pooler). Any activation the
model was trained with is monotone, so the logits rank as its scores do.

`rerank` rescores each query's `top` first documents (in trec_eval's order, the order
that scored them: encoderx/evaluation/retrieval.py) and orders them by the reranker's
score, ties in first-stage order; the documents past `top` follow in their first-stage
order. The reranked run's scores are the ranks turned around (the first of n documents
scores n, the last 1), so that every scorer orders it so.
"""
from __future__ import annotations

import functools

import jax
import numpy as np

from encoderx import errors, sources
from encoderx.data import beir
from encoderx.embed import embedder
from encoderx.evaluation import retrieval as retrieval_scores
from encoderx.models import finetuning


class RerankerError(errors.UserError, ValueError):
  """A --rerank_with model that cannot score pairs."""
  argument = "rerank_with"


class Reranker:
  """Scores (query, document) pairs with the one-logit head of `init_from`."""

  def __init__(self, init_from: str, max_length: int | None = None, batch_size: int = 64):
    source = sources.open_source(init_from)
    self.vocabulary, model_config, self.max_length = embedder.open_encoder(
        source, max_length or embedder.DEFAULT_MAX_LENGTH)
    self.batch_size = batch_size
    params = source.load_params()
    head = params.get("classifier", {})
    if np.shape(head.get("kernel"))[-1:] != (1,):
      raise RerankerError(
          f"'{init_from}' has no one-score head (a classifier with one output); name a "
          "run of method rerank, or hf:DIR of a CrossEncoder (num_labels 1).")
    self.params = {"encoder_model": params["encoder_model"], "classifier": head}
    pooling = "pooler" if "pooler" in params["encoder_model"] else "first_token"
    self.model = finetuning.SequenceClassifier(model_config, num_labels=1,
                                               pooling=pooling, dropout=0.0)
    self.token_types = model_config.embeddings.type_vocab_size > 1

  @functools.cached_property
  def _score_batch(self):
    return jax.jit(lambda params, batch: self.model.apply({"params": params}, batch)[:, 0])

  def pair_ids(self, pairs: list[tuple[str, str]]):
    """(ids, token types) of [CLS] query [SEP] document [SEP] per pair, cut
    longest-first to max_length (encoderx/data/classification.py's rule)."""
    from encoderx.data import classification  # pylint: disable=g-import-not-at-top
    vocabulary = self.vocabulary
    queries = embedder.word_pieces(vocabulary, [query for query, _ in pairs])
    documents = embedder.word_pieces(vocabulary, [document for _, document in pairs])
    separators = getattr(vocabulary, "pair_separators", 1)
    keep_first, keep_second = (np.asarray(x) for x in classification.longest_first_lengths(
        np.array([len(q) for q in queries]), np.array([len(d) for d in documents]),
        self.max_length - 2 - separators))
    rows, types = [], []
    for query, document, first, second in zip(queries, documents, keep_first, keep_second):
      rows.append([vocabulary.cls_id] + query[:first] + [vocabulary.sep_id] * separators
                  + document[:second] + [vocabulary.sep_id])
      types.append([0] * (first + 1 + separators)
                   + [int(self.token_types)] * (second + 1))
    return rows, types

  def __call__(self, pairs: list[tuple[str, str]], show_progress: bool = False
               ) -> np.ndarray:
    """float32 [len(pairs)]: each pair's logit."""
    rows, types = self.pair_ids(list(pairs))
    def apply(chosen):
      return self._score_batch(self.params, embedder.padded_batch(
          [rows[i] for i in chosen], self.batch_size, self.vocabulary.pad_id,
          [types[i] for i in chosen]))
    return embedder.in_length_order(rows, self.batch_size, apply, (), show_progress,
                                    "rerank")


def rerank(reranker: Reranker, collection: beir.Collection,
           run: dict[str, dict[str, float]], top: int,
           show_progress: bool = False) -> dict[str, dict[str, float]]:
  """`run` with each query's `top` first documents reordered by the reranker (see the
  module docstring)."""
  ordered = {query: list(retrieval_scores.top({query: docs}, len(docs))[query])
             for query, docs in run.items()}
  pairs = [(collection.queries[query], collection.corpus[doc])
           for query, docs in ordered.items() for doc in docs[:top]]
  scores = iter(reranker(pairs, show_progress).tolist())
  reranked = {}
  for query, docs in ordered.items():
    head = [(next(scores), doc) for doc in docs[:top]]
    head_order = [doc for _, doc in sorted(head, key=lambda item: -item[0])]  # stable
    order = head_order + docs[top:]
    reranked[query] = {doc: float(len(order) - i) for i, doc in enumerate(order)}
  return reranked

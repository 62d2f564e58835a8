"""Contrastive losses of embeddings, and gradient caching: pure JAX.

Mirrors sentence-transformers 6.2.0:
  ranking_losses      sentence_transformer/losses/multiple_negatives_ranking.py,
                      MultipleNegativesRankingLoss (directions ('query_to_doc',),
                      similarity_fct util.cos_sim, default scale 20); with symmetric=True
                      multiple_negatives_symmetric_ranking.py,
                      MultipleNegativesSymmetricRankingLoss (directions ('query_to_doc',
                      'doc_to_query'), partition_mode 'per_direction': the two
                      directions' log-partitions averaged, i.e. the mean of the two
                      cross-entropies).
  matryoshka_losses   sentence_transformer/losses/matryoshka.py, MatryoshkaLoss (the loss
                      at each dimension, the embeddings cut then normalized, weighted
                      and summed).
  cached_value_and_grad
                      sentence_transformer/losses/cached_multiple_negatives_ranking.py,
                      CachedMultipleNegativesRankingLoss and base/losses/gradcache.py
                      (GradCache, Gao, Zhang, Han and Callan, 2021).

The similarity matrix is one matmul of the whole global batch's anchors [batch, hidden]
against all its candidates [(1 + negatives) * batch, hidden]: under jit with
batch-sharded embeddings, XLA computes it across devices, so every positive and hard
negative on every device is a negative of every anchor (no gather per device, unlike
sentence-transformers' gather_across_devices).
"""
from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp

from encoderx import errors

# A learned scale starts at log(contrastive.scale) and is kept at most this (CLIP's cap).
MAX_LEARNED_SCALE = 100.0


class ContrastiveError(errors.UserError, ValueError):
  """Embeddings or settings the contrastive loss cannot take."""


def unit(x: jax.Array) -> jax.Array:
  """[..., hidden] scaled to length 1 (torch.nn.functional.normalize's epsilon)."""
  return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def check_batch(batch_size: int) -> None:
  if batch_size < 2:
    raise ContrastiveError(f"a contrastive batch of {batch_size} anchor has no in-batch "
                           "negative; use a batch of at least 2.")


def check_matryoshka(dims: Sequence[int], weights: Sequence[float],
                     hidden_size: int) -> None:
  """Dimensions strictly decreasing, each in [1, hidden_size]; one weight each (or
  none: all 1)."""
  dims = list(dims)
  if any(d < 1 or d > hidden_size for d in dims):
    raise ContrastiveError(f"Matryoshka dimensions {dims} must be in [1, the hidden size "
                           f"{hidden_size}].")
  if any(a <= b for a, b in zip(dims, dims[1:])):
    raise ContrastiveError(f"Matryoshka dimensions {dims} must be strictly decreasing "
                           "(e.g. 768, 512, 256).")
  if weights and len(weights) != len(dims):
    raise ContrastiveError(f"{len(weights)} Matryoshka weights for {len(dims)} "
                           "dimensions; give one weight per dimension, or none (all 1).")


def _losses_of_scores(scores: jax.Array, symmetric: bool) -> tuple[jax.Array, jax.Array]:
  """scores [..., batch, (1 + k) * batch] (positives first) -> per anchor losses and
  whether the positive ranks first, [..., batch]."""
  batch = scores.shape[-2]
  positive = jnp.diagonal(scores[..., :batch], axis1=-2, axis2=-1)
  losses = jax.nn.logsumexp(scores, axis=-1) - positive
  if symmetric:
    losses = (losses + jax.nn.logsumexp(scores[..., :batch], axis=-2) - positive) / 2
  correct = (jnp.argmax(scores, -1) == jnp.arange(batch)).astype(jnp.float32)
  return losses, correct


def ranking_losses(anchors: jax.Array, candidates: jax.Array, scale,
                   symmetric: bool = False) -> tuple[jax.Array, jax.Array]:
  """Per anchor: the cross-entropy of picking its positive among all the candidates by
  scale * cosine similarity, and whether the positive ranks first (float).

  anchors [batch, hidden]; candidates [(1 + k) * batch, hidden]: the positives, then each
  column of hard negatives. symmetric: also each positive picking its anchor among all
  anchors (the same matrix's first block, transposed), the two cross-entropies averaged.
  """
  return matryoshka_losses(anchors, candidates, scale, (), (), symmetric)


def matryoshka_losses(anchors: jax.Array, candidates: jax.Array, scale,
                      dims: Sequence[int] = (), weights: Sequence[float] = (),
                      symmetric: bool = False) -> tuple[jax.Array, jax.Array]:
  """ranking_losses at each of `dims` (the embeddings' first d features), weighted
  (`weights`, default 1 each) and summed per anchor; no dims: the full embeddings.
  `correct` is at the first (largest) dimension.

  The embeddings are cut by zeroing the features past d (the same cosines as slicing),
  so that every dimension's scores come from one batched matmul [dims, batch, (1 + k) *
  batch]: one similarity computation over the sharded batch, not one per dimension.
  ranking_losses is this at the full size: a plain 2-D matmul (and one per dimension)
  compiled for 8 CPU devices into collectives that deadlocked when the executable was
  loaded from JAX's persistent compilation cache (XLA CPU, jax 0.10.2: an all-gather
  rendezvous timeout, devices waiting at different all-gathers)."""
  check_batch(anchors.shape[0])
  dims = tuple(dims) or (anchors.shape[-1],)
  check_matryoshka(dims, weights, anchors.shape[-1])
  kept = (jnp.arange(anchors.shape[-1]) < jnp.asarray(dims)[:, None]).astype(anchors.dtype)
  scores = scale * jnp.einsum("dbh,dch->dbc", unit(anchors * kept[:, None]),
                              unit(candidates * kept[:, None]))
  losses, correct = _losses_of_scores(scores, symmetric)  # [dims, batch]
  weights = jnp.asarray(weights or [1.0] * len(dims), losses.dtype)
  return jnp.einsum("d,db->b", weights, losses), correct[0]


# --- gradient caching ----------------------------------------------------------------------
def split_chunks(tree, count: int):
  """[rows, ...] -> [count, rows / count, ...], chunk i = rows i, i + count, ...: strided,
  so that each chunk of a batch-sharded array is spread over every data device."""
  def split(x):
    return jnp.swapaxes(x.reshape(x.shape[0] // count, count, *x.shape[1:]), 0, 1)
  return jax.tree_util.tree_map(split, tree)


def join_chunks(tree):
  """Inverse of split_chunks: [count, rows / count, ...] -> [rows, ...]."""
  return jax.tree_util.tree_map(
      lambda x: jnp.swapaxes(x, 0, 1).reshape(x.shape[0] * x.shape[1], *x.shape[2:]), tree)


def chunk_keys(key: jax.Array, count: int) -> jax.Array:
  """The dropout key of each chunk: both passes of gradient caching use these (the
  re-run must see the dropout masks its cached embedding was computed with)."""
  return jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(count))


def cached_value_and_grad(embed_fn: Callable, params, chunks, loss_of_embeddings: Callable,
                          key: jax.Array):
  """((loss, aux), gradient w.r.t. params) of `loss_of_embeddings(params, embeddings)`,
  embeddings = embed_fn(params, chunk, key_i) of every chunk joined, by GradCache:

  1. every chunk embedded without keeping activations (a lax.map, no gradient);
  2. the loss and its gradient w.r.t. the params (e.g. a learned scale) and all the
     embeddings;
  3. per chunk (a lax.scan), the VJP of embed_fn re-run with the same dropout key
     (chunk_keys) on that chunk's slice of the embeddings' gradient, summed.

  The result equals jax.value_and_grad of the uncached loss (embed_fn on the same chunks
  with the same keys); activation memory is one chunk's. chunks: a pytree of
  [count, rows, ...] (split_chunks); embed_fn returns a pytree of [rows, ...]."""
  count = jax.tree_util.tree_leaves(chunks)[0].shape[0]
  keys = chunk_keys(key, count)
  fixed = jax.lax.stop_gradient(params)
  embeddings = jax.lax.map(lambda inputs: embed_fn(fixed, *inputs), (chunks, keys))
  (loss, aux), (grads, embedding_grads) = jax.value_and_grad(
      loss_of_embeddings, argnums=(0, 1), has_aux=True)(params, join_chunks(embeddings))

  def add_chunk(total, inputs):
    chunk, chunk_key, cotangent = inputs
    _, vjp = jax.vjp(lambda p: embed_fn(p, chunk, chunk_key), params)
    return jax.tree_util.tree_map(jnp.add, total, vjp(cotangent)[0]), None

  grads, _ = jax.lax.scan(add_chunk, grads,
                          (chunks, keys, split_chunks(embedding_grads, count)))
  return (loss, aux), grads


def cached_loss(embed_fn: Callable, params, chunks, loss_of_embeddings: Callable,
                key: jax.Array):
  """(loss, aux) as cached_value_and_grad computes them, differentiable w.r.t. params
  (a custom VJP returning the cached gradient), so that a train step's
  jax.value_and_grad takes it as it would the uncached loss."""

  @jax.custom_vjp
  def loss_fn(params, chunks, key):
    return cached_value_and_grad(embed_fn, params, chunks, loss_of_embeddings, key)[0]

  def forward(params, chunks, key):
    value, grads = cached_value_and_grad(embed_fn, params, chunks, loss_of_embeddings, key)
    return value, grads

  def backward(grads, cotangents):
    loss_cotangent = cotangents[0]
    return (jax.tree_util.tree_map(lambda g: loss_cotangent * g, grads), None, None)

  loss_fn.defvjp(forward, backward)
  return loss_fn(params, chunks, key)

"""Replaced-token detection (ELECTRA): the generator's samples, the discriminator's labels
and its terms.

The generator (an MLM model) scores the masked positions of a batch masked by
encoderx/objectives/mlm.py; a token is drawn at each from its softmax with Gumbel noise
at temperature 1 and no gradient through the draw; the discriminator reads the batch with
the samples in place and learns, at every non-padding token, whether the token was
replaced. A sample equal to the original is not a replacement (google-research/electra
run_pretraining.py `_get_fake_data`; pretrain_helpers.py `sample_from_softmax`,
`scatter_update`).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from encoderx.objectives import mlm


def sample(logits: jax.Array, key: jax.Array) -> jax.Array:
  """Token ids [batch, predictions] drawn from softmax(logits [..., vocab]) by the
  Gumbel-max trick (temperature 1); no gradient flows through the draw."""
  return jax.random.categorical(key, jax.lax.stop_gradient(logits).astype(jnp.float32)
                                ).astype(jnp.int32)


def replace_with_samples(batch: dict, sampled: jax.Array) -> dict:
  """The discriminator's input ids and labels from a masked batch and the samples.

  The samples [batch, predictions] replace every masked position (what was [MASK] or
  kept); `rtd_labels` [batch, length] int32 is 1 where the token now differs from the
  original.
  """
  positions, weights = batch["masked_positions"], batch["masked_weights"] > 0
  replaced = (sampled != batch["masked_ids"]).astype(jnp.int32)
  return {"input_ids": mlm.place(batch["input_ids"], positions, weights, sampled),
          "rtd_labels": mlm.place(jnp.zeros_like(batch["input_ids"]), positions, weights,
                                  replaced)}


def sample_terms(sampled: jax.Array, batch: dict) -> dict[str, jax.Array]:
  """{'sampled_correct'}: masked positions whose sample equals the original token."""
  same = (sampled == batch["masked_ids"]).astype(jnp.float32)
  return {"sampled_correct": jnp.sum(same * batch["masked_weights"])}


def token_weights(batch: dict) -> jax.Array:
  """[batch, length] float32: 1.0 on the tokens the discriminator is scored on (every
  non-padding token, special tokens included, as ELECTRA's input_mask)."""
  return (batch["segment_ids"] > 0).astype(jnp.float32)


def token_count(batch: dict) -> jax.Array:
  """The number of scored tokens in a batch (at least 1): the discriminator's divisor."""
  return jnp.maximum(jnp.sum(token_weights(batch)), 1.0)


def terms(logits: jax.Array, labels: jax.Array, weights: jax.Array) -> dict[str, jax.Array]:
  """Binary cross-entropy and confusion sums of the discriminator's logits [batch, length]
  against `labels` (1: replaced) over `weights`, in float32."""
  logits = logits.astype(jnp.float32)
  labels = labels.astype(jnp.float32)
  predicted = (logits > 0).astype(jnp.float32)
  losses = optax.sigmoid_binary_cross_entropy(logits, labels)
  return {"loss_sum": jnp.sum(losses * weights),
          "correct": jnp.sum((predicted == labels) * weights),
          "count": jnp.sum(weights),
          "true_positive": jnp.sum(predicted * labels * weights),
          "predicted_positive": jnp.sum(predicted * weights),
          "positive": jnp.sum(labels * weights)}


def summarize(sums: dict) -> dict[str, jax.Array]:
  """From {'rtd': terms, 'mlm': terms with 'sampled_correct'} (either may be absent): the
  precision and recall of 'replaced', the replaced share of the scored tokens, and the
  share of masked positions whose sample equals the original. Losses and accuracies are
  summarized as every objective's (methods/pretrain.py: summarize_terms)."""
  metrics = {}
  if "rtd" in sums:
    t = sums["rtd"]
    metrics["rtd_precision"] = t["true_positive"] / jnp.maximum(t["predicted_positive"], 1.0)
    metrics["rtd_recall"] = t["true_positive"] / jnp.maximum(t["positive"], 1.0)
    metrics["rtd_replaced_fraction"] = t["positive"] / jnp.maximum(t["count"], 1.0)
  if "mlm" in sums:
    t = sums["mlm"]
    metrics["mlm_sampled_accuracy"] = t["sampled_correct"] / jnp.maximum(t["count"], 1.0)
  return metrics

"""XLNet pretraining (Yang et al. 2019): permutation language modelling with two-stream
relative attention and a memory of previous segments.

The data are XLNet's row streams (encoderx/data/row_streams.py: every batch row continues
the row before it), built from the corpus or read from files `encoderx.preprocess` made
for the same rows per process, reuse_len and bi_data; `prepare` samples each row's
targets and factorization order on device (encoderx/objectives/plm.py), the model is
encoderx/models/xlnet.py's, and the loss is the mean cross-entropy of the predictions
(zihangdai/xlnet function_builder.py `two_stream_loss`).

The memory is method state with a row per example: what entered each layer at the
reused positions of the previous steps, {'hidden': [batch, layers, mem_len, hidden],
'valid': [batch, mem_len] (slots that hold a token)}. At each step the rows whose stream
starts a new document set forget theirs, the model attends to it, and it becomes
concat(memory, this step's reused part)[-mem_len:] with no gradient (XLNet's
`_cache_mem`; train_gpu.py feeds it back every step, starting from zeros). It is
sharded like the batch (rows over the data axes), split with micro-batches, and saved
in checkpoints with the run. Evaluation starts every batch with no memory.
"""
from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from encoderx import errors
from encoderx.methods import base as method_lib
from encoderx.methods import pretrain
from encoderx.models import two_stream_attention, xlnet
from encoderx import objectives as objectives_lib
from encoderx.objectives import plm

MEMORY_AXES = {"hidden": ("activation_batch", None, None, "activation_embed"),
               "valid": ("activation_batch", None)}


def _process_rows(config) -> int:
  """The rows of the batch this process loads (each process streams its own)."""
  from encoderx.data import tasks  # pylint: disable=g-import-not-at-top
  return tasks.stream_rows(config, jax.process_count())


class PermutationLanguageModelling(method_lib.Method):
  """XLNet's PLM with memory on a PermutationLanguageModel (module docstring)."""
  name = "xlnet"
  per_example_state = True

  def __init__(self, config):
    from encoderx.data import tasks  # pylint: disable=g-import-not-at-top
    super().__init__(config)
    self.vocabulary = tasks.build_vocabulary(config.data.vocab)
    self.model_config = method_lib.model_config(config, self.vocabulary)
    fields = config.objective.plm
    self.plm_config = plm.PlmConfig(
        special_ids=tuple(self.vocabulary.special_ids),
        functional_ids=(self.vocabulary.sep_id, self.vocabulary.cls_id),
        prediction_k=fields.partial_prediction_k, max_span_words=fields.max_span_words,
        num_predict=fields.num_predict, perm_size=fields.perm_size,
        reuse_len=fields.reuse_len)
    self.mem_len, self.bi_data = fields.mem_len, fields.bi_data
    self.model = xlnet.PermutationLanguageModel(self.model_config)

  @classmethod
  def config_fields(cls):
    return {"objective": objectives_lib.config_section()}

  @classmethod
  def validate(cls, config) -> None:
    fail, fields, model = errors.fail, config.objective.plm, config.model
    pretrain.validate_corpus(config)
    if model.attention.variant != two_stream_attention.NAME:
      fail("model.attention.variant", f"xlnet needs {two_stream_attention.NAME!r}, got "
           f"{model.attention.variant!r}.")
    if 0 < model.embeddings.type_vocab_size < 3:
      fail("model.embeddings.type_vocab_size", f"XLNet's rows have 3 token types (A, B, [CLS]); "
           f"got {model.embeddings.type_vocab_size}.", "Use 0 (segments enter the attention only).")
    errors.check_positive(config, "objective.plm.partial_prediction_k",
                              "objective.plm.num_predict", "objective.plm.max_span_words",
                              "objective.plm.perm_size", "objective.plm.reuse_len")
    seq_length = config.data.seq_length
    if fields.reuse_len > seq_length - 4:
      fail("objective.plm.reuse_len", f"{fields.reuse_len} leaves no room in "
           f"data.seq_length={seq_length} for A [SEP] B [SEP] [CLS].",
           "XLNet reuses half the row (256 of 512).")
    if fields.num_predict > seq_length:
      fail("objective.plm.num_predict", f"{fields.num_predict} exceeds "
           f"data.seq_length={seq_length}.")
    if fields.mem_len < 0:
      fail("objective.plm.mem_len", f"must be >= 0 (0: no memory), got {fields.mem_len}.")
    if fields.bi_data and _process_rows(config) % 2:
      fail("objective.plm.bi_data", f"reads half of the rows backwards; the "
           f"{_process_rows(config)} rows each process loads must be even.")
    if config.train.long_fraction:
      fail("train.long_fraction", "xlnet trains at one length (its memory and rows "
           "continue from step to step); set it to 0.")

  # --- data ------------------------------------------------------------------------------
  def task(self):
    from encoderx.data import tasks  # pylint: disable=g-import-not-at-top
    return tasks.register_stream_task(self.config, jax.process_count())

  def check_data(self) -> None:
    pretrain.check_corpus(self.config, jax.process_count(), examples="XLNet's row streams")

  # --- parameters and memory -------------------------------------------------------------
  def init(self, key: jax.Array) -> dict:
    batch = xlnet.init_batch(1, 8, predictions=2)
    params = self.model.init({"params": key, "dropout": key}, batch)["params"]
    if not self.mem_len:
      return {"params": params}
    config, rows = self.model_config, self.config.train.batch_size
    memory = {"hidden": jnp.zeros([rows, config.num_layers, self.mem_len,
                                   config.hidden_size], config.compute_dtype),
              "valid": jnp.zeros([rows, self.mem_len], bool)}
    return {"params": params, "state": {
        name: nn.LogicallyPartitioned(value, names=MEMORY_AXES[name])
        for name, value in memory.items()}}

  def _memory(self, state, batch: dict) -> dict | None:
    """The memory this step attends to: rows that start a document set forget theirs."""
    if not self.mem_len:
      return None
    keep = batch["stream_start"] == 0
    return {"hidden": state["hidden"] * keep[:, None, None, None].astype(
                state["hidden"].dtype),
            "valid": state["valid"] & keep[:, None]}

  def _next_memory(self, memory: dict | None, layer_inputs: jax.Array, batch: dict):
    """concat(memory, what entered each layer at the reused positions)[-mem_len:]."""
    if memory is None:
      return {}
    reuse = self.plm_config.reuse_len
    reused = jnp.moveaxis(layer_inputs[:, :, :reuse], 0, 1)  # [batch, layers, reuse, H]
    hidden = jnp.concatenate([memory["hidden"], reused.astype(memory["hidden"].dtype)],
                             axis=2)[:, :, -self.mem_len:]
    valid = jnp.concatenate([memory["valid"], batch["segment_ids"][:, :reuse] > 0],
                            axis=1)[:, -self.mem_len:]
    return jax.lax.stop_gradient({"hidden": hidden, "valid": valid})

  # --- the train step --------------------------------------------------------------------
  def prepare(self, batch: dict, key: jax.Array, step: jax.Array | None = None) -> dict:
    del step
    batch = dict(batch)
    if not self.bi_data:  # every row forwards: one direction of positional encodings
      batch.pop("reversed", None)
    return plm.prepare(batch, key, self.plm_config)

  def denominators(self, batch: dict) -> dict:
    return {"plm": plm.prediction_count(batch)}

  def loss(self, params, state, batch, key, denominators, update, carry):
    del update, carry
    memory = self._memory(state, batch)
    outputs = self.model.apply({"params": params}, batch, memory, deterministic=False,
                               rngs={"dropout": key})
    terms = plm.terms(outputs["logits"], batch)
    return terms["loss_sum"] / denominators["plm"], method_lib.LossOutput(
        sums={"plm": terms}, state=self._next_memory(memory, outputs["layer_inputs"],
                                                     batch))

  def summarize(self, sums) -> dict:
    return pretrain.summarize_terms(sums)

  # --- evaluation ------------------------------------------------------------------------
  def evaluate(self, params, state, batch, key):
    """Loss and accuracy sums of a batch ordered and targeted with `key`, no memory."""
    del state
    batch = self.prepare(batch, key)
    outputs = self.model.apply({"params": params}, batch, None, deterministic=True)
    return {"plm": plm.terms(outputs["logits"], batch)}

  def summarize_evaluation(self, outputs: list) -> dict[str, float]:
    totals = jax.tree_util.tree_map(lambda *xs: sum(xs), *outputs)
    metrics = {k: float(v) for k, v in pretrain.summarize_terms(totals).items()}
    metrics["plm_perplexity"] = math.exp(min(metrics["plm_loss"], 50.0))
    return metrics

  def describe(self) -> dict:
    return {"model": method_lib.describe_model(self.model_config), "heads": ["plm"],
            "memory": {"mem_len": self.mem_len, "rows": self.config.train.batch_size}}

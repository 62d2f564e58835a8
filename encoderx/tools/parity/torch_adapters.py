"""The PyTorch counterpart of each training method: one set, shared by the bench
(encoderx/tools/speed/bench.py), the comparisons and the parity tests
(encoderx/tools/parity/step_parity.py).

    adapter = torch_adapters.adapter(trainer.method)    # fresh HF model(s), the method's sizes
    batch = adapter.inputs(prepared)       # a TorchBatch from a prepared (masked) encoderx batch
    loss = adapter.loss(batch, key)        # a torch scalar: what the HF class(es) minimize
    params = adapter.converted_params(trainer)          # the HF weights as encoderx parameters
    ours, theirs = adapter.state_dicts(trainer, params)  # both as the HF state dict, numpy

An adapter (adapter_base.py's Adapter) is found by the method's name and, where a method
spans families, its model's family (REGISTRY; "*": any family the Hugging Face conversion
knows); the embedding methods' are in sentence_adapters.py:

  pretrain, any family: the family's HF class `head` (default its first, the pretraining
      class: BertForPreTraining, RobertaForMaskedLM, AlbertForPreTraining,
      DebertaV2ForMaskedLM, ModernBertForMaskedLM with sparse_prediction as ModernBERT
      trains, EuroBertForMaskedLM) fed the prepared batch (no token types where the
      family has none), with MLM labels in HF's form (-100
      where nothing is predicted) and the sentence label where the class has a sentence
      head (SENTENCE_LABELS: NSP, SOP); the class's own loss. Not SpanBERT's objectives:
      HF has no span boundary (SBO) head.
  electra, family electra: ElectraForMaskedLM (the generator) and ElectraForPreTraining
      (the discriminator) sharing one embeddings module (`ElectraPair`); the loss is the
      MLM weight x the generator's MLM + rtd_lambda x the discriminator's binary
      cross-entropy on the tokens sampled from the generator at the masked positions.
  xlnet, family xlnet: XLNetLMHeadModel with the method's mem_len, reuse_len and bi_data,
      fed encoderx's targets and factorization orders (perm_mask, target_mapping, labels)
      and its own `mems` of the step before, carried as encoderx carries its memory.
  classify / similarity / tag, any family: the family's task class with the method's
      labels (BertForSequenceClassification with num_labels, or num_labels=1 and
      problem_type='regression' for similarity; BertForTokenClassification), its
      classifier_dropout the method's; fed the labels (tags -100 where encoderx's are -1:
      pieces after a word's first, special tokens) and scored by the class's own loss.
  contrastive, any family: the family's base class (BertModel; its pooler left out of
      the comparison), each view mean-pooled, and sentence-transformers' loss class of
      the config called on the views' features: MultipleNegativesRankingLoss (symmetric:
      its per-direction form), CachedMultipleNegativesRankingLoss (cache_chunk_size as
      mini_batch_size), inside MatryoshkaLoss; a learned scale is a `logit_scale`
      parameter (open_clip's), exp of it capped as encoderx caps it. Mean pooling only,
      no learned scale with gradient caching.
  rerank, any family: the family's sequence classification class with one label and
      sentence-transformers' cross_encoder loss of rerank.loss (BinaryCrossEntropyLoss,
      MultipleNegativesRankingLoss without in-batch negatives, MarginMSELoss,
      ListNetLoss) on the batch's (query, document) pairs.

`strict` (the default) is parity's: the inputs and loss are what encoderx's step computes
or an error says why they cannot be (rows packing several documents, which HF's attention
mask cannot keep apart; positions not from 0; XLNet rows that start a stream while others
continue, or padding in the reused part), and ELECTRA's tokens are sampled with the train
step's own key (`loss(batch, key)`) as encoderx samples them. `strict=False` is the
bench's: the same work where HF cannot give the same values (a packed row's documents
attend to each other, XLNet's mems are carried whatever the rows), ELECTRA's samples drawn
by PyTorch (no key).
"""
from __future__ import annotations

import jax
import numpy as np
import torch

from encoderx.hf import engine
from encoderx.tools.parity import sentence_adapters
from encoderx.tools.parity.adapter_base import (Adapter, NoAdapterError, TorchBatch,
                                                 hf_inputs, hf_model, task_class_refusal)

# The HF pretraining class's argument for the sentence objective's labels.
SENTENCE_LABELS = {"BertForPreTraining": "next_sentence_label",
                   "AlbertForPreTraining": "sentence_order_label"}
IGNORED = -100  # Hugging Face's label for positions nothing is predicted at
ANY_FAMILY = "*"


# --- inputs ---------------------------------------------------------------------------
def mlm_labels(batch: dict) -> np.ndarray:
  """[batch, length] int64: the original token at every masked position, -100 elsewhere
  (encoderx's masked_positions / masked_ids / masked_weights in HF's form)."""
  labels = np.full(batch["input_ids"].shape, IGNORED, np.int64)
  rows, slots = np.nonzero(np.asarray(batch["masked_weights"]) > 0)
  positions = np.asarray(batch["masked_positions"])[rows, slots]
  if len(set(zip(rows.tolist(), positions.tolist()))) != len(rows):
    raise ValueError("a position is masked twice; HF labels hold one target per token.")
  labels[rows, positions] = np.asarray(batch["masked_ids"])[rows, slots]
  return labels


# --- the adapters ---------------------------------------------------------------------


class Pretraining(Adapter):
  """The pretrain method: the family's HF class `head` (see the module doc)."""
  description = "the family's pretraining class (MLM, + NSP / SOP where it has them)"

  @classmethod
  def refusal(cls, method):
    if "sbo" in method.config.objective.names:
      return ("Hugging Face has no SpanBERT pretraining class (no span boundary head) "
              "for objective 'sbo'")
    return None

  # The family's HF config fields its pretraining sets: ModernBERT's recipe decodes
  # only the masked positions (sparse_prediction; the same loss, a mean over them).
  TRAINING_FIELDS = {"modernbert": {"sparse_prediction": True}}

  @classmethod
  def scores_every_position(cls, method):
    fields = cls.TRAINING_FIELDS.get(method.model_config.family, {})
    return not fields.get("sparse_prediction", False)

  def build(self, head):
    family = self.method.model_config.family
    model = hf_model(self.method, self.method.model_config, family, head,
                     **self.TRAINING_FIELDS.get(family, {}))
    self.head = head or engine.head_of_class(family, type(model).__name__)
    return model

  def inputs(self, prepared):
    kwargs = self.model_inputs(prepared)
    kwargs["labels"] = torch.from_numpy(mlm_labels(prepared))
    sentence = SENTENCE_LABELS.get(type(self.model).__name__)
    if sentence:
      kwargs[sentence] = torch.from_numpy(np.asarray(prepared["sentence_label"], np.int64))
    return TorchBatch(kwargs, prepared)

  def loss(self, batch, key=None):
    """The class's own loss: MLM (+ NSP / SOP when it has a sentence head), each a mean
    over its predictions, as encoderx's."""
    del key
    return self.model(**batch.kwargs).loss


class ElectraPair(torch.nn.Module):
  """ElectraForMaskedLM (generator) and ElectraForPreTraining (discriminator) sharing
  one embeddings module (tokens, positions, types, LayerNorm), as ELECTRA's models and
  encoderx's rtd.embedding_sharing='shared'; each keeps its own projection."""

  def __init__(self, generator, discriminator):
    super().__init__()
    self.generator, self.discriminator = generator, discriminator
    discriminator.electra.embeddings = generator.electra.embeddings


class Electra(Adapter):
  """The electra method: the generator and discriminator pair (see the module doc)."""
  description = "ElectraForMaskedLM + ElectraForPreTraining sharing their embeddings"

  @classmethod
  def refusal(cls, method):
    rtd = method.config.rtd
    if rtd.training != "joint" or rtd.embedding_sharing != "shared":
      return ("the PyTorch pair trains jointly with shared embeddings (rtd.training='joint', "
              f"rtd.embedding_sharing='shared'); the config has {rtd.training!r}, "
              f"{rtd.embedding_sharing!r}")
    return None

  def build(self, head):
    del head
    method = self.method
    return ElectraPair(hf_model(method, method.generator_config, "electra", "mlm"),
                       hf_model(method, method.model_config, "electra", "pretraining"))

  def inputs(self, prepared):
    kwargs = hf_inputs(prepared, self.strict)
    kwargs["labels"] = torch.from_numpy(mlm_labels(prepared))
    return TorchBatch(kwargs, prepared)

  def loss(self, batch, key=None):
    """The generator's MLM loss, then the discriminator's binary cross-entropy on the
    batch with tokens sampled from the generator's logits at the masked positions: with
    `key` (the train step's loss key) as encoderx's train step draws them
    (methods/electra.py `loss`, objectives/rtd.py `sample`), else by PyTorch."""
    pair, method = self.model, self.method
    generated = pair.generator(**batch.kwargs)
    if key is None:
      corrupted, replaced = self._sampled_in_torch(batch.kwargs, generated.logits)
    else:
      corrupted, replaced = self._sampled_as_encoderx(batch.prepared, generated.logits, key)
    inputs = {k: v for k, v in batch.kwargs.items() if k != "labels"}
    discriminated = pair.discriminator(**{**inputs, "input_ids": corrupted},
                                       labels=replaced)
    return method.mlm_weight * generated.loss + method.rtd_lambda * discriminated.loss

  @staticmethod
  def _sampled_in_torch(kwargs: dict, logits: torch.Tensor):
    labels = kwargs["labels"]
    chosen = labels != IGNORED
    original = torch.where(chosen, labels, kwargs["input_ids"])
    with torch.no_grad():
      sampled = torch.distributions.Categorical(logits=logits[chosen]).sample()
      corrupted = original.clone()
      corrupted[chosen] = sampled
    return corrupted, (corrupted != original).long()

  @staticmethod
  def _sampled_as_encoderx(prepared: dict, logits: torch.Tensor, key):
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
    from encoderx.objectives import rtd  # pylint: disable=g-import-not-at-top
    _, sample_key, _ = jax.random.split(key, 3)
    at_masks = np.take_along_axis(logits.detach().numpy(),
                                  np.asarray(prepared["masked_positions"])[..., None], 1)
    sampled = rtd.sample(jnp.asarray(at_masks), sample_key)
    corrupted = jax.device_get(rtd.replace_with_samples(
        {k: jnp.asarray(v) for k, v in prepared.items()}, sampled))
    return (torch.tensor(corrupted["input_ids"], dtype=torch.long),
            torch.tensor(corrupted["rtd_labels"], dtype=torch.long))

  def converted_params(self, trainer):
    method, pair = self.method, self.model
    generator, _, _ = engine.import_state_dict(pair.generator.state_dict(),
                                           method.generator_config, "electra", "mlm")
    discriminator, _, _ = engine.import_state_dict(pair.discriminator.state_dict(),
                                               method.model_config, "electra", "pretraining")
    params = method.with_transferable_params({"generator": generator}, discriminator)
    params = jax.tree_util.tree_map(np.asarray, params)
    engine.check_tree(params, trainer.abstract_state.params)
    return params

  def state_dicts(self, trainer, params):
    del trainer
    method = self.method
    ours = {f"generator.{k}": v for k, v in engine.to_hf(
        params["generator"], method.generator_config, "electra", "mlm").items()}
    ours.update({f"discriminator.{k}": v for k, v in engine.to_hf(
        method.transferable_params(params), method.model_config, "electra",
        "pretraining").items()})
    return ours, {k: v.detach().numpy() for k, v in self.model.state_dict().items()}


def xlnet_inputs(batch: dict, strict: bool = True) -> dict:
  """A prepared xlnet batch -> XLNetLMHeadModel's keyword arguments: perm_mask (1: may
  not see; the query stream's visibility, which the content stream widens by itself as
  HF's does), target_mapping ([batch, predictions, length] one-hot, zero for unused
  slots) and labels ([batch, predictions], -100 for unused slots)."""
  inputs = hf_inputs(batch, strict)
  positions = np.asarray(batch["target_positions"])
  used = np.asarray(batch["target_weights"]) > 0
  mapping = np.zeros(positions.shape + (batch["input_ids"].shape[1],), np.float32)
  rows, slots = np.nonzero(used)
  mapping[rows, slots, positions[rows, slots]] = 1.0
  labels = np.where(used, np.asarray(batch["target_ids"]), IGNORED).astype(np.int64)
  inputs.update(perm_mask=torch.tensor(~np.asarray(batch["perm_visible"]),
                                       dtype=torch.float32),
                target_mapping=torch.from_numpy(mapping), labels=torch.from_numpy(labels))
  return inputs


class XLNet(Adapter):
  """The xlnet method: XLNetLMHeadModel with its memory (see the module doc)."""
  description = "XLNetLMHeadModel with mems carried from step to step"

  def build(self, head):
    del head
    method = self.method
    self.head = "pretraining"
    self.mems = None
    return hf_model(method, method.model_config, "xlnet", "pretraining", bi_data=method.bi_data,
                    mem_len=method.mem_len or None,
                    reuse_len=method.plm_config.reuse_len if method.mem_len else None)

  def inputs(self, prepared):
    return TorchBatch(xlnet_inputs(prepared, self.strict), prepared)

  def loss(self, batch, key=None):
    """XLNetLMHeadModel's own loss (the mean cross-entropy of the predictions, as
    encoderx's) with HF's `mems` carried from step to step (detached by HF) as encoderx
    carries its memory. Strict: HF's cache has no per-slot validity, so where encoderx's
    memory holds invalid slots (before it fills) HF's is shorter, which only works while
    every row starts its stream together (step 0) and no row holds padding in its reused
    part; anything else is an error."""
    del key
    method = self.method
    if self.strict:
      self._check(batch.prepared)
    outputs = self.model(**batch.kwargs, mems=self.mems, use_mems=bool(method.mem_len))
    self.mems = outputs.mems if method.mem_len else None
    return outputs.loss

  def _check(self, prepared: dict) -> None:
    method = self.method
    if method.bi_data:
      half = len(prepared["input_ids"]) // 2
      if list(np.asarray(prepared["reversed"]) > 0) != [False] * half + [True] * half:
        raise ValueError("HF's bi_data reads the second half of the rows backwards.")
    starts = np.asarray(prepared["stream_start"]) > 0
    if starts.all():
      self.mems = None
    elif starts.any():
      raise ValueError("some rows start a new stream: HF's mems cannot forget per row.")
    reused = np.asarray(prepared["segment_ids"])[:, :method.plm_config.reuse_len]
    if method.mem_len and (reused == 0).any():
      raise ValueError("padding in the reused part: HF's mems would attend to it.")


class FineTuning(Adapter):
  """The classify, similarity and tag methods: the family's task class (see the module
  doc) with the method's labels, fed the batch's labels in HF's form; the class's own
  loss."""
  description = ("the family's ForSequenceClassification (classify; similarity: one "
                 "output, regression) or ForTokenClassification (tag) class")
  # method -> the family's head (encoderx/hf/<family>.py) that is its HF class.
  HEADS = {"classify": "sequence_classification", "similarity": "sequence_classification",
           "tag": "token_classification"}

  @classmethod
  def refusal(cls, method):
    return task_class_refusal(method, cls.HEADS[method.name])

  def build(self, head):
    del head
    method = self.method
    self.head = self.HEADS[method.name]
    fields = {"num_labels": 1 if method.name == "similarity" else len(method.labels),
              "classifier_dropout": method.config.finetune.classifier_dropout}
    if method.name == "similarity":
      fields["problem_type"] = "regression"  # MSE on the one output
    return hf_model(method, method.model_config, method.model_config.family, self.head,
                    **fields)

  def inputs(self, prepared):
    kwargs = self.model_inputs(prepared)
    if self.method.name == "tag":  # first pieces carry their tag, the rest -1: ignored
      tags = np.asarray(prepared["tags"])
      labels = torch.from_numpy(np.where(tags >= 0, tags, IGNORED).astype(np.int64))
    elif self.method.name == "similarity":
      labels = torch.tensor(np.asarray(prepared["label"]), dtype=torch.float32)
    else:
      labels = torch.tensor(np.asarray(prepared["label"]), dtype=torch.long)
    kwargs["labels"] = labels
    return TorchBatch(kwargs, prepared)

  def loss(self, batch, key=None):
    """The class's own loss: mean cross-entropy over the examples (classify) or the
    labelled tokens (tag), or mean squared error (similarity), as encoderx's."""
    del key
    return self.model(**batch.kwargs).loss


# --- the registry ---------------------------------------------------------------------
# (method name, model family or ANY_FAMILY) -> its adapter.
REGISTRY: dict[tuple[str, str], type[Adapter]] = {
    ("pretrain", ANY_FAMILY): Pretraining,
    ("electra", "electra"): Electra,
    ("xlnet", "xlnet"): XLNet,
    ("classify", ANY_FAMILY): FineTuning,
    ("similarity", ANY_FAMILY): FineTuning,
    ("tag", ANY_FAMILY): FineTuning,
    ("contrastive", ANY_FAMILY): sentence_adapters.Contrastive,
    ("rerank", ANY_FAMILY): sentence_adapters.Rerank,
}


def known() -> str:
  return "; ".join(f"{name} ({'any family' if family == ANY_FAMILY else family}): "
                   f"{cls.description}" for (name, family), cls in REGISTRY.items())


def adapter_class(method) -> type[Adapter]:
  """The adapter of `method` (an encoderx Method: its `name`, its model's family and its
  config); NoAdapterError says why there is none."""
  name, family = method.name, method.model_config.family
  found = REGISTRY.get((name, family)) or REGISTRY.get((name, ANY_FAMILY))
  if found is None:
    raise NoAdapterError(f"no PyTorch adapter for method {name!r} with model family "
                         f"{family!r}. Adapters: {known()}.")
  refusal = found.refusal(method)
  if refusal:
    raise NoAdapterError(f"no PyTorch adapter for this {name!r} config: {refusal}.")
  return found


def adapter(method, head: str | None = None, strict: bool = True) -> Adapter:
  """The PyTorch counterpart of `method` (see the module doc), its model freshly
  initialized from torch's random state; `head` picks the HF class where the method's
  family has several (the pretrain method)."""
  return adapter_class(method)(method, head, strict)

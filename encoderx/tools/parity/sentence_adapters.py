"""The PyTorch counterparts of the embedding methods (torch_adapters.py's registry and
module docstring): contrastive (SentenceEmbedder under sentence-transformers' embedding
losses) and rerank (a CrossEncoder over encoderx's encoded pairs under its cross_encoder
losses), each calling sentence-transformers 6.2's own loss classes.
"""
from __future__ import annotations

import numpy as np
import torch

from encoderx.hf import engine
from encoderx.tools.parity.adapter_base import (Adapter, TorchBatch, hf_model,
                                                 task_class_refusal)


class SentenceEmbedder(torch.nn.Module):
  """What sentence-transformers' embedding losses call as their model: features ->
  {'sentence_embedding': the family's base class (`encoder`), mean-pooled over the
  attention mask (sentence-transformers' Pooling)}; with a learned scale, its log as the
  parameter `logit_scale` (open_clip's CLIP.logit_scale), which the loss reads."""

  def __init__(self, encoder: torch.nn.Module, log_scale: float | None = None):
    super().__init__()
    self.encoder = encoder
    if log_scale is not None:
      self.logit_scale = torch.nn.Parameter(torch.tensor(log_scale, dtype=torch.float32))

  def forward(self, features: dict) -> dict:
    hidden = self.encoder(**features).last_hidden_state
    mask = features["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    return {"sentence_embedding": (hidden * mask).sum(1) / torch.clamp(mask.sum(1),
                                                                       min=1e-9)}

  def get_embedding_dimension(self) -> int:  # MatryoshkaLoss checks its dimensions
    return self.encoder.config.hidden_size

  def __getitem__(self, index: int) -> torch.nn.Module:
    """A SentenceTransformer's modules: the cached losses look at the first (the input
    module) for a StaticEmbedding, which cannot be cut into mini-batches."""
    return [self.encoder][index]


class Contrastive(Adapter):
  """The contrastive method: the family's base class without its pooler (BertModel),
  mean-pooled (SentenceEmbedder), trained by sentence-transformers' own loss classes
  called as its trainer calls them, on the views' features (reference_loss)."""
  description = ("the family's base class, mean pooling and sentence-transformers' "
                 "(Cached)MultipleNegatives(Symmetric)RankingLoss, in MatryoshkaLoss")

  @classmethod
  def refusal(cls, method):
    settings = method.config.contrastive
    if method.config.finetune.pooling != "mean":
      return "only mean pooling (finetune.pooling='mean')"
    if settings.learn_scale and settings.cache_chunk_size:
      return ("no learned scale with gradient caching (sentence-transformers' cached loss "
              "back-propagates each mini-batch on its own, through one scale tensor)")
    return None

  def build(self, head):
    del head
    from encoderx.objectives import contrastive  # pylint: disable=g-import-not-at-top
    self.head = "base"
    settings = self.method.config.contrastive
    encoder = hf_model(self.method, self.method.model_config,
                       self.method.model_config.family, self.head)
    log_scale = float(np.log(np.float32(settings.scale))) if settings.learn_scale else None
    self.max_scale = contrastive.MAX_LEARNED_SCALE
    return SentenceEmbedder(encoder, log_scale)

  def reference_loss(self) -> torch.nn.Module:
    """sentence-transformers' loss of the method's config (Contrastive.reference_loss
    names it): MultipleNegativesRankingLoss (symmetric: directions query_to_doc and
    doc_to_query, per_direction, as MultipleNegativesSymmetricRankingLoss), cached
    (CachedMultipleNegativesRankingLoss, mini_batch_size = contrastive.cache_chunk_size),
    inside MatryoshkaLoss with contrastive.matryoshka_dims and weights."""
    from sentence_transformers.sentence_transformer import losses  # pylint: disable=g-import-not-at-top
    settings = self.method.config.contrastive
    options = dict(scale=settings.scale)
    if settings.symmetric:
      options.update(directions=("query_to_doc", "doc_to_query"),
                     partition_mode="per_direction")
    if settings.cache_chunk_size:
      self.ranking = losses.CachedMultipleNegativesRankingLoss(
          self.model, mini_batch_size=settings.cache_chunk_size, **options)
    else:
      self.ranking = losses.MultipleNegativesRankingLoss(self.model, **options)
    if not settings.matryoshka_dims:
      return self.ranking
    return losses.MatryoshkaLoss(self.model, self.ranking, list(settings.matryoshka_dims),
                                 list(settings.matryoshka_weights) or None)

  # The base class's pooler, which encoderx's SentenceEncoder lacks and the loss never
  # reads: left out of the conversion and of the weights compared.
  def converted_params(self, trainer):
    config = self.method.model_config
    params, _, _ = engine.import_state_dict(self.model.encoder.state_dict(), config,
                                            config.family, self.head)
    self.pooler = params["encoder_model"].pop("pooler")
    if self.method.config.contrastive.learn_scale:
      params["logit_scale"] = self.model.logit_scale.detach().numpy().copy()
    engine.check_tree(params, trainer.abstract_state.params)
    return params

  def state_dicts(self, trainer, params):
    """The encoder's HF state dict (no pooler) and, learned, 'logit_scale'."""
    del trainer
    config = self.method.model_config
    encoder = {**params["encoder_model"], "pooler": self.pooler}
    ours = engine.to_hf({"encoder_model": encoder}, config, config.family, self.head)
    theirs = {k: v.detach().numpy() for k, v in self.model.encoder.state_dict().items()}
    ours, theirs = ({k: v for k, v in d.items() if not k.startswith("pooler.")}
                    for d in (ours, theirs))
    if "logit_scale" in params:
      ours["logit_scale"] = np.asarray(params["logit_scale"])
      theirs["logit_scale"] = self.model.logit_scale.detach().numpy()
    return ours, theirs

  def inputs(self, prepared):
    views = {prefix: {name[len(prefix):]: value for name, value in prepared.items()
                      if name.startswith(prefix)} for prefix in self.method.views.values()}
    views[""] = {name: prepared[name] for name in ("input_ids", "segment_ids",
                                                   "token_type_ids", "positions")}
    return TorchBatch({f"{index}.{name}": value
                       for index, prefix in enumerate(self.method.views.values())
                       for name, value in self.model_inputs(views[prefix]).items()},
                      prepared)

  def loss(self, batch, key=None):
    """The reference loss's forward on the views' features (anchor, positive, negatives),
    as sentence-transformers' trainer calls it; a learned scale is exp(logit_scale) capped
    at MAX_LEARNED_SCALE, as encoderx's (Contrastive.scale)."""
    del key
    if not hasattr(self, "loss_module"):
      self.loss_module = self.reference_loss()
    features = [{name.partition(".")[2]: value for name, value in batch.kwargs.items()
                 if name.partition(".")[0] == str(index)}
                for index in range(len(self.method.views))]
    if self.method.config.contrastive.learn_scale:
      self.ranking.scale = torch.clamp(self.model.logit_scale.exp(), max=self.max_scale)
    return self.loss_module(features, None)


def prepared_cross_encoder(classifier: torch.nn.Module):
  """A sentence-transformers CrossEncoder (its losses accept nothing else) over pairs
  encoderx already encoded: a pair is (row, document index) of the features ([rows,
  documents, length] tensors) given to its `use`, scored by `classifier`
  (BertForSequenceClassification, one label) as CrossEncoder scores a pair."""
  from sentence_transformers.cross_encoder import CrossEncoder  # pylint: disable=g-import-not-at-top

  class PreparedCrossEncoder(CrossEncoder):
    """(A class here: sentence-transformers is imported only where it is used.)"""

    def __init__(self):  # pylint: disable=super-init-not-called
      torch.nn.Module.__init__(self)  # none of CrossEncoder's loading: the model is given
      self.classifier = classifier
      self.features = {}

    @property
    def num_labels(self) -> int:
      return self.classifier.config.num_labels

    @property
    def device(self) -> torch.device:
      return next(self.classifier.parameters()).device

    def use(self, features: dict) -> None:
      self.features = features

    def preprocess(self, pairs, **unused) -> dict:
      rows, documents = (torch.tensor(index) for index in zip(*pairs))
      return {name: value[rows, documents] for name, value in self.features.items()}

    def forward(self, features, **unused):  # pylint: disable=arguments-differ
      return {"scores": self.classifier(**features).logits}

  return PreparedCrossEncoder()


class Rerank(Adapter):
  """The rerank method: the family's sequence classification class with one label and
  sentence-transformers' cross_encoder loss of rerank.loss (methods/rerank.py:
  REFERENCE_LOSSES) with the loss's activation, called on (query, document) pairs of the
  batch (prepared_cross_encoder)."""
  description = ("the family's ForSequenceClassification with one label and "
                 "sentence-transformers' cross_encoder loss")

  @classmethod
  def refusal(cls, method):
    return task_class_refusal(method, "sequence_classification")

  def build(self, head):
    del head
    method = self.method
    self.head = "sequence_classification"
    classifier = hf_model(method, method.model_config, method.model_config.family,
                          self.head, num_labels=1,
                          classifier_dropout=method.config.finetune.classifier_dropout)
    self.cross_encoder = prepared_cross_encoder(classifier)
    return classifier

  def inputs(self, prepared):
    from encoderx.methods import rerank, simcse  # pylint: disable=g-import-not-at-top
    documents = sum(1 for name in prepared if name.endswith("input_ids"))
    views = [self.model_inputs(simcse.view(prepared, rerank.doc_prefix(i)))
             for i in range(documents)]
    kwargs = {name: torch.stack([view[name] for view in views], 1) for name in views[0]}
    for target in ("label", "teacher"):
      if target in prepared:
        kwargs[target] = torch.tensor(np.asarray(prepared[target]), dtype=torch.float32)
    return TorchBatch(kwargs, prepared)

  def loss(self, batch, key=None):
    """sentence-transformers' loss on the rows' (query, document) pairs: binary
    BinaryCrossEntropyLoss((queries, documents), labels); listwise its
    MultipleNegativesRankingLoss's calculate_loss on the positive's and each hard
    negative's logits (its forward adds num_negatives random in-batch negatives, and
    refuses 0); margin_mse MarginMSELoss((queries, positives, negatives...), teacher
    scores); listnet ListNetLoss((queries, documents of each), teacher scores)."""
    del key
    from sentence_transformers.cross_encoder import losses  # pylint: disable=g-import-not-at-top
    from encoderx.methods import rerank  # pylint: disable=g-import-not-at-top
    settings, model = self.method.config.rerank, self.cross_encoder
    kwargs = dict(batch.kwargs)
    targets = {name: kwargs.pop(name) for name in ("label", "teacher") if name in kwargs}
    model.use(kwargs)
    rows, documents = kwargs["input_ids"].shape[:2]
    queries = list(range(rows))
    columns = [[document] * rows for document in range(documents)]
    activation = (torch.nn.Sigmoid() if rerank.activation(settings) == "sigmoid"
                  else torch.nn.Identity())
    if settings.loss == "binary":
      return losses.BinaryCrossEntropyLoss(model, activation_fn=activation)(
          [queries, columns[0]], targets["label"])
    if settings.loss == "listwise":
      loss = losses.MultipleNegativesRankingLoss(
          model, num_negatives=0, activation_fn=activation,
          scale=settings.scale or rerank.DEFAULT_LISTWISE_SCALE)
      return loss.calculate_loss([loss.call_model_with_columns(queries, column)
                                  for column in columns], rows)
    if settings.loss == "margin_mse":
      return losses.MarginMSELoss(model, activation_fn=activation)(
          [queries, *columns], targets["teacher"])
    return losses.ListNetLoss(model, activation_fn=activation)(
        [queries, [list(range(documents))] * rows], list(targets["teacher"]))

"""contrastive: an embedding model trained as sentence-transformers trains one, over the
whole global batch.

Training rows are (anchor, positive[, negatives ...]) in a TSV or JSON-lines file with
sentence-transformers' column names: `anchor`, `positive`, and `negative` or
`negative_1`, `negative_2` ... (contrastive.anchor_column, positive_column,
negative_columns; () finds the file's negative columns). Each text is embedded alone
([CLS] text [SEP], finetune.pooling: "mean", "first_token" or "last_token"), with
contrastive.prompts.query before each anchor and prompts.document before each positive
and negative.

The loss (encoderx/objectives/contrastive.py) is sentence-transformers'
MultipleNegativesRankingLoss over the global batch: each anchor against every positive
and hard negative of the batch, on every device (one sharded similarity matrix), at
contrastive.scale (20) or a learned scale (learn_scale: params['logit_scale'] holds its
log, CLIP's), optionally symmetric (MultipleNegativesSymmetricRankingLoss), at several
Matryoshka dimensions (matryoshka_dims / matryoshka_weights, MatryoshkaLoss). Because
the batch is one loss, train.grad_accum_steps must be 1; contrastive.cache_chunk_size > 0
bounds the activation memory instead by gradient caching (GradCache,
CachedMultipleNegativesRankingLoss): the batch embedded in chunks of that many rows,
then each chunk re-run with its slice of the embeddings' gradient (the same dropout
keys in both passes), which equals the uncached step.

Unlabelled text (data/unlabelled_pairs.py): contrastive.pairs_from "crops" (Contriever's
two random spans of a document) or "ict" (the inverse cloze task's sentence and the rest
of its passage) makes the rows anew each epoch from the train split of the corpus
pretraining reads (data.files, data.document_marker ...), instead of finetune.train_file.
finetune.train_file may name several files, comma-separated as data.files: each batch
is then of one file's rows (contrastive.source_sampling: "proportional" to their sizes
or "round_robin", sentence-transformers' ProportionalBatchSampler, RoundRobinBatchSampler).

contrastive.pack_texts (default on) packs a training batch's texts into rows on the host
(data/packed_texts.py: best fit, each text its own segment, so attention stays inside
it), and pools each text of the packed rows: the same embeddings and step as texts
padded each to its own row (tested), with the padding of short sentences not computed
(host_batch). With gradient caching each chunk's texts are packed apart.

contrastive.no_duplicates (default on) orders each epoch's rows so that no batch holds
a text twice (a false negative), as sentence-transformers' NoDuplicatesBatchSampler
(data/no_duplicates.py): the order is the one batched, so the Task does not shuffle.

Dev evaluation: finetune.dev_file holds STS pairs (finetune.text_column,
text_pair_column, a score in label_column; the query prompt before both texts), scored
by the Spearman correlation of their cosine similarities (simcse.ScoresStsPairs);
contrastive.dev_retrieval names a retrieval set in BEIR's layout (data/beir.py, split
contrastive.dev_retrieval_split), scored as sentence-transformers'
InformationRetrievalEvaluator scores one: its queries (query prompt) and corpus
(document prompt) embedded with the current params, each query's nearest documents
by cosine (faiss, exactly) scored by nDCG@10, Recall@100 and MRR@10
(evaluation/retrieval.py, as `encoderx.retrieval` scores a model). Either or both may
be given. The set's texts are rows of the validation split beside the STS pairs
(`dev_text`: a text's place among the queries then the documents, -1 for a pair), so
they are embedded by the evaluation step the loop already runs, sharded as it is, and
ranked in summarize_evaluation.
"""
from __future__ import annotations

import functools
import logging

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from encoderx import errors
from encoderx import files as files_lib
from encoderx.data import beir, packed_texts
from encoderx.evaluation import retrieval as retrieval_scores
from encoderx.methods import base as method_lib
from encoderx.methods import contrastive_rows
from encoderx.methods import finetune, similarity, simcse
from encoderx.models import finetuning
from encoderx.objectives import contrastive as objective

logger = logging.getLogger("encoderx")


def config_section() -> ml_collections.ConfigDict:
  """config.contrastive: the training rows' columns, the loss, gradient caching."""
  return ml_collections.ConfigDict(dict(
      anchor_column="anchor",
      positive_column="positive",
      negative_columns=(),  # (): the file's 'negative' or 'negative_1', 'negative_2' ...
      scale=20.0,  # of the cosine similarities (1 / temperature); a learned scale's start
      learn_scale=False,
      symmetric=False,  # also each positive picking its anchor among the batch's anchors
      # The loss at each of these (strictly decreasing) leading sizes of the embedding,
      # weighted by matryoshka_weights (() : 1 each); (): the full embedding only.
      matryoshka_dims=(),
      matryoshka_weights=(),
      # 0: the whole batch's activations at once; n: gradient caching in chunks of n rows
      # (a divisor of train.batch_size).
      cache_chunk_size=0,
      # The texts of a training batch (of each chunk) packed into rows by best fit, each
      # attending to itself only (encoderx/data/packed_texts.py): the same embeddings,
      # fewer padded tokens computed. With several processes the texts stay padded.
      pack_texts=True,
      # Prefixes: `query` before anchors (and both dev texts), `document` before positives
      # and negatives.
      prompts=ml_collections.ConfigDict(dict(query="", document="")),
      # No text twice in a batch: each epoch's rows ordered as sentence-transformers'
      # NoDuplicatesBatchSampler draws batches (data/no_duplicates.py).
      no_duplicates=True,
      # "crops" | "ict": rows made each epoch from data.files' documents; "": the
      # labelled finetune.train_file.
      pairs_from="",
      # Several train files (comma-separated): each batch is of one file, the files
      # drawn "proportional" to their sizes or in turn ("round_robin").
      source_sampling="proportional",
      # A retrieval set in BEIR's layout scored at each evaluation (nDCG@10, Recall@100,
      # MRR@10), beside finetune.dev_file's STS pairs or instead of them; the split of
      # its qrels/SPLIT.tsv.
      dev_retrieval="",
      dev_retrieval_split="dev",
  ))


class Contrastive(contrastive_rows.TrainingRows, simcse.ScoresStsPairs,
                  finetune.ReadsLabelledFiles, finetune.FineTuning):
  """An embedding model trained by in-batch and hard negatives (the module docstring)."""
  name = "contrastive"
  config_sections = ("data", "finetune", "contrastive")
  STS_METRICS = simcse.ScoresStsPairs.METRICS
  RETRIEVAL_METRICS = (f"ndcg@{retrieval_scores.NDCG_AT}",
                       f"recall@{retrieval_scores.RECALL_AT}", f"mrr@{retrieval_scores.MRR_AT}")
  METRICS = STS_METRICS + RETRIEVAL_METRICS

  @classmethod
  def config_fields(cls):
    return {**super().config_fields(), "contrastive": config_section()}

  def build_model(self):
    return finetuning.SentenceEncoder(self.model_config, pooling=self.config.finetune.pooling)

  @classmethod
  def required_files(cls, config) -> tuple[str, ...]:
    """The dev file of STS pairs is optional beside a retrieval set."""
    del cls  # the train files are checked by validate_train_files
    return () if config.contrastive.dev_retrieval and not config.finetune.dev_file else (
        "dev_file",)

  @classmethod
  def validate(cls, config) -> None:
    super().validate(config)
    cls.validate_train_files(config)
    cls.validate_dev(config)
    settings, fail = config.contrastive, errors.fail
    errors.check_choice("finetune.pooling", config.finetune.pooling,
                        finetuning.SENTENCE_POOLINGS)
    if not config.finetune.text_pair_column:
      fail("finetune.text_pair_column", "is empty; the dev file's STS pairs are "
           "text_column and text_pair_column.")
    if settings.scale <= 0:
      fail("contrastive.scale", f"must be positive, got {settings.scale}.")
    if settings.learn_scale and settings.scale > objective.MAX_LEARNED_SCALE:
      fail("contrastive.scale", f"{settings.scale} is above a learned scale's cap of "
           f"{objective.MAX_LEARNED_SCALE:g}.")
    if config.train.batch_size < 2:
      fail("train.batch_size", f"a contrastive batch of {config.train.batch_size} has no "
           "in-batch negative; use at least 2.")
    if config.train.grad_accum_steps != 1:
      fail("train.grad_accum_steps", "must be 1: the contrastive loss is over the whole "
           "batch.", "Set contrastive.cache_chunk_size to bound its memory instead.")
    chunk = settings.cache_chunk_size
    if chunk < 0 or (chunk and config.train.batch_size % chunk):
      fail("contrastive.cache_chunk_size", f"{chunk} is not 0 or a divisor of "
           f"train.batch_size={config.train.batch_size}.")
    prompts = settings.prompts
    if settings.symmetric and bool(prompts.query) != bool(prompts.document):
      fail("contrastive.prompts", f"query={prompts.query!r}, document="
           f"{prompts.document!r}: a symmetric loss makes each side the other's query, so "
           "set both prompts or neither.")

  trains_sentence_embeddings = True

  @classmethod
  def take_sentence_embedding(cls, config, pooling: str, prompts: dict) -> list[str]:
    """The source's pooling, and its query and document prompts where the run sets none:
    training continues the embedding model it starts from (all-MiniLM-L6-v2 pools by
    mean, a BGE model by [CLS] with a query prompt). A prompt the run sets is its own."""
    changed = []  # a pooling the method has not (a SimCSE run's pooler) stays the run's
    if pooling in finetuning.SENTENCE_POOLINGS and config.finetune.pooling != pooling:
      config.finetune.pooling = pooling
      changed.append(f"finetune.pooling={pooling!r}")
    for name in ("query", "document"):
      if prompts.get(name) and not config.contrastive.prompts[name]:
        config.contrastive.prompts[name] = prompts[name]
        changed.append(f"contrastive.prompts.{name}={prompts[name]!r}")
    return changed

  @classmethod
  def validate_dev(cls, config) -> None:
    """The retrieval set's directory, the whole dev split read, a best_metric evaluated."""
    directory, fail = config.contrastive.dev_retrieval, errors.fail
    if directory and not files_lib.path(directory).is_dir():
      fail("contrastive.dev_retrieval", f"'{directory}' is not a directory (one in BEIR's "
           f"layout: {beir.CORPUS}, {beir.QUERIES}, {beir.QRELS}/SPLIT.tsv).")
    if directory and config.eval.batches:
      fail("eval.batches", f"is {config.eval.batches}; a retrieval set is ranked against "
           "its whole corpus, so set it to 0 (the whole dev split).")
    evaluated = (cls.STS_METRICS if config.finetune.dev_file else ()) + (
        cls.RETRIEVAL_METRICS if directory else ())
    if config.eval.best_metric and config.eval.best_metric not in evaluated:
      fail("eval.best_metric", f"{config.eval.best_metric!r} is not evaluated: "
           f"{', '.join(evaluated)} are (retrieval metrics need contrastive.dev_retrieval, "
           "STS ones finetune.dev_file).")
    if config.finetune.group_by_length and len(contrastive_rows.train_files(config)) > 1:
      fail("finetune.group_by_length", "would mix the rows of finetune.train_file's "
           "files, whose batches are each of one file; turn it off.")
    if config.contrastive.no_duplicates and config.finetune.group_by_length:
      fail("contrastive.no_duplicates", "orders the batches itself; "
           "finetune.group_by_length would regroup them. Turn one off.")

  # --- data (the training rows: contrastive_rows.TrainingRows) ----------------------------
  @functools.cached_property
  def dev_collection(self) -> beir.Collection | None:
    """The retrieval set of contrastive.dev_retrieval, or None."""
    settings = self.config.contrastive
    if not settings.dev_retrieval:
      return None
    return beir.read_directory(settings.dev_retrieval, settings.dev_retrieval_split)

  def dev_columns(self) -> dict:
    """The STS pairs, each text after the query prompt (dev_text -1), then the retrieval
    set's queries (query prompt) and documents (document prompt), a text a row (an
    empty pair, label 0; dev_text its place among them)."""
    prompts, parts = self.config.contrastive.prompts, []
    if self.config.finetune.dev_file:
      pairs = super().dev_columns()
      parts.append({"text": [prompts.query + text for text in pairs["text"]],
                    "text_pair": [prompts.query + text for text in pairs["text_pair"]],
                    "label": np.asarray(pairs["label"], np.float32),
                    "dev_text": np.full([len(pairs["text"])], -1, np.int32)})
    if self.dev_collection is not None:
      collection = self.dev_collection
      texts = ([prompts.query + text for text in collection.queries.values()]
               + [prompts.document + text for text in collection.corpus.values()])
      parts.append({"text": texts, "text_pair": [""] * len(texts),
                    "label": np.zeros([len(texts)], np.float32),
                    "dev_text": np.arange(len(texts), dtype=np.int32)})
    return {name: [value for part in parts for value in part[name]]
            if name in ("text", "text_pair") else np.concatenate([p[name] for p in parts])
            for name in parts[0]}

  @functools.cached_property
  def views(self) -> dict[str, str]:
    """Training field -> its features' prefix in the batch."""
    fields = {"text": "", "text_pair": "pair_"}
    fields.update({f"negative_{i}": f"negative{i}_"
                   for i in range(1, len(self.negative_columns()) + 1)})
    return fields

  def task(self):
    from encoderx.data import example_tasks  # pylint: disable=g-import-not-at-top
    columns = {"train": self.training_columns, "validation": self.dev_columns}
    return example_tasks.register(
        "contrastive", [self.config.finetune.to_dict(), self.config.contrastive.to_dict(),
                        self.config.data.vocab.to_dict(),
                        self.config.train.batch_size]  # the order's batches
        + ([self.config.data.to_dict()] if self.config.contrastive.pairs_from else []),
        columns, self.vocabulary,
        [functools.partial(simcse.encode_split, train_prefixes=self.views)],
        self.config.data.shuffle_buffer,
        self.train_order if self.orders_rows else None,
        self.epoch_pairs if self.config.contrastive.pairs_from else None)

  def check_data(self) -> None:
    settings = self.config.contrastive
    try:
      objective.check_matryoshka(settings.matryoshka_dims, settings.matryoshka_weights,
                                 self.model_config.hidden_size)
    except objective.ContrastiveError as error:
      errors.fail("contrastive.matryoshka_dims", str(error))
    train, dev = self.training_columns(), self.dev_columns()
    self.check_pairs_from(len(next(iter(train.values()))))
    if self.config.contrastive.pairs_from:
      train = self.epoch_pairs(train, 0)
    collection = self.dev_collection
    logger.info("train: %d rows of an anchor, a positive and %d hard negatives; dev: %d "
                "scored pairs, %d retrieval queries over %d documents", len(train["text"]),
                len(train) - 2, int(np.sum(dev["dev_text"] < 0)),
                len(collection.queries) if collection else 0,
                len(collection.corpus) if collection else 0)

  # --- parameters ------------------------------------------------------------------------
  def init(self, key):
    variables = super().init(key)
    if self.config.contrastive.learn_scale:
      variables["params"]["logit_scale"] = jnp.log(
          jnp.asarray(self.config.contrastive.scale, jnp.float32))
    return variables

  def transferable_params(self, params) -> dict:
    return {"encoder_model": params["encoder_model"]}

  def with_transferable_params(self, params, transferable: dict):
    return {**params, **transferable}

  # --- the train step --------------------------------------------------------------------
  def scale(self, params) -> jax.Array:
    if "logit_scale" not in params:
      return jnp.asarray(self.config.contrastive.scale, jnp.float32)
    return jnp.minimum(jnp.exp(params["logit_scale"]), objective.MAX_LEARNED_SCALE)

  def host_batch(self, batch: dict, seq_length: int, rows_multiple: int = 1) -> dict:
    """With contrastive.pack_texts, the batch's texts packed into rows, per chunk
    (packed_texts.pack; laid out so that objective.split_chunks gives each chunk its
    rows and maps); else (and with several processes, whose rows would each pack their
    own way: the same step on padded texts) the finetune's length buckets."""
    if not self.config.contrastive.pack_texts or jax.process_count() > 1:
      return super().host_batch(batch, seq_length, rows_multiple)
    from encoderx.data import example_tasks  # pylint: disable=g-import-not-at-top
    count = self.chunk_count(len(batch["input_ids"]))

    def by_chunk(rows):  # [rows, views, ...] -> [chunks, rows / chunks * views, ...]
      split = np.swapaxes(rows.reshape(-1, count, *rows.shape[1:]), 0, 1)
      return split.reshape(count, -1, *rows.shape[2:])

    texts = {name: by_chunk(np.stack([batch[prefix + name] for prefix in self.views.values()],
                                     1)) for name in example_tasks.MODEL_FEATURES}
    packed = packed_texts.pack(texts, rows_multiple)
    # [chunks, n, ...] -> [n * chunks, ...], chunk c at c, c + chunks, ... (split_chunks)
    return {name: np.swapaxes(value, 0, 1).reshape(-1, *value.shape[2:])
            for name, value in packed.items()}

  def chunk_count(self, rows: int) -> int:
    """How many chunks gradient caching embeds a batch of `rows` rows in (1: uncached)."""
    chunk = self.config.contrastive.cache_chunk_size
    return rows // chunk if chunk else 1

  def denominators(self, batch):
    rows = (len(batch["text_start"]) // len(self.views) if "text_start" in batch
            else len(batch["input_ids"]))
    return {"examples": jnp.asarray(rows, jnp.float32)}

  def embed_packed(self, params, packed: dict, key: jax.Array) -> jax.Array:
    """Packed rows and maps (packed_texts) -> [rows, views, hidden]."""
    return self.apply(params, packed, key).reshape(-1, len(self.views),
                                                     self.model_config.hidden_size)

  def embed_rows(self, params, rows: dict, key: jax.Array) -> jax.Array:
    """rows {feature: [rows, views, length]} -> [rows, views, hidden] (views: anchor,
    positive, negatives), in one pass of the encoder."""
    count, views = rows["input_ids"].shape[:2]
    flat = {name: value.reshape(count * views, -1) for name, value in rows.items()}
    return self.apply(params, flat, key).reshape(count, views, -1)

  def loss_of_embeddings(self, params, embedded: jax.Array):
    """embedded [batch, views, hidden] -> (mean loss, metric sums)."""
    settings = self.config.contrastive
    candidates = jnp.swapaxes(embedded[:, 1:], 0, 1).reshape(-1, embedded.shape[-1])
    losses, correct = objective.matryoshka_losses(
        embedded[:, 0], candidates, self.scale(params), settings.matryoshka_dims,
        settings.matryoshka_weights, settings.symmetric)
    sums = {"loss_sum": losses.sum(), "correct": correct.sum(),
            "count": jnp.asarray(losses.shape[0], jnp.float32),
            "scale": self.scale(params)}
    return losses.mean(), sums

  def loss(self, params, state, batch, key, denominators, update, carry):
    # One micro-batch (validate: grad_accum_steps 1), so the mean is over the batch.
    del denominators, update, carry
    from encoderx.data import example_tasks  # pylint: disable=g-import-not-at-top
    if "token_text" in batch:  # packed on the host (host_batch)
      embed, rows = self.embed_packed, batch
      count = self.chunk_count(len(batch["text_start"]) // len(self.views))
    else:
      embed = self.embed_rows
      rows = {name: jnp.stack([batch[prefix + name] for prefix in self.views.values()], 1)
              for name in example_tasks.MODEL_FEATURES}
      count = self.chunk_count(rows["input_ids"].shape[0])
    if self.config.contrastive.cache_chunk_size:
      loss, sums = objective.cached_loss(embed, params, objective.split_chunks(rows, count),
                                         self.loss_of_embeddings, key)
    else:
      loss, sums = self.loss_of_embeddings(params, embed(params, rows, key))
    return loss, method_lib.LossOutput(sums, state)

  def summarize(self, sums):
    count = jnp.maximum(sums["count"], 1.0)
    return {"contrastive_loss": sums["loss_sum"] / count,
            "accuracy": sums["correct"] / count,  # the positive ranked first
            "scale": sums["scale"]}

  def reference_loss(self) -> str:
    """sentence-transformers' class of this loss (the module docstring): e.g.
    'MatryoshkaLoss(CachedMultipleNegativesSymmetricRankingLoss)'."""
    settings = self.config.contrastive
    loss = ("Cached" * bool(settings.cache_chunk_size) + "MultipleNegatives"
            + "Symmetric" * settings.symmetric + "RankingLoss")
    return f"MatryoshkaLoss({loss})" if settings.matryoshka_dims else loss

  # --- evaluation ------------------------------------------------------------------------
  def evaluate(self, params, state, batch, key):
    outputs = {**super().evaluate(params, state, batch, key), "dev_text": batch["dev_text"]}
    if self.dev_collection is not None:  # the texts' embeddings, to rank on the host
      outputs["embeddings"] = objective.unit(self.apply(params, simcse.view(batch, "")))
    return outputs

  def summarize_evaluation(self, outputs: list) -> dict[str, float]:
    """Spearman and Pearson of the STS pairs; nDCG@10, Recall@100, MRR@10 of the
    retrieval set (each query's nearest documents by cosine)."""
    rows, metrics = finetune.real_rows(outputs), {}
    pairs = rows["dev_text"] < 0
    if pairs.any():
      metrics.update(similarity.correlations(rows["scores"][pairs], rows["labels"][pairs]))
    collection = self.dev_collection
    if collection is not None:
      texts = ~pairs
      embedded = rows["embeddings"][texts][np.argsort(rows["dev_text"][texts])]
      queries = len(collection.queries)
      run = retrieval_scores.ranked(list(collection.queries), embedded[:queries],
                                    list(collection.corpus), embedded[queries:],
                                    retrieval_scores.RECALL_AT)
      metrics.update(retrieval_scores.scores(collection.qrels, run))
    return metrics

  # --- identity --------------------------------------------------------------------------
  def describe_head(self) -> dict:
    """Read by the export to a sentence-transformers directory: keep these keys."""
    settings = self.config.contrastive
    return {"pooling": self.config.finetune.pooling, "normalize": True,
            "prompts": {"query": settings.prompts.query,
                        "document": settings.prompts.document},
            "matryoshka_dims": [int(d) for d in settings.matryoshka_dims]}

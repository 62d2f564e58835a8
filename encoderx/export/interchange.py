"""A run as a sentence-transformers model or a CrossEncoder reranker directory.

    export_sentence_transformers(workdir, output, step=None)
      -> export_hf's directory of the bare encoder (head 'base') with modules.json,
         sentence_bert_config.json, 1_Pooling/, 2_Normalize/ (when the run normalizes),
         config_sentence_transformers.json (prompts, similarity cosine) and a README model
         card: SentenceTransformer(output).encode(texts) is encoderx.embed's embeddings
    export_cross_encoder(workdir, output, step=None)
      -> export_hf's sequence-classification directory of a one-score run (the rerank
         or similarity method), config.json naming CrossEncoder's activation (the
         reranker's: sigmoid for the binary and listwise losses; else the identity),
         the tokenizer's length the run's data.seq_length, and a model card:
         CrossEncoder(output).predict(pairs) is the run's scores (of pairs that fit in
         that length; where transformers' cut of a longer pair keeps other tokens than
         encoderx's, the score differs a little)

An embedding run is one whose method's `describe_head()` gives a pooling and no labels
(simcse; contrastive: pooling, normalize, prompts, matryoshka_dims, each optional). The
files are encoderx/hf/st_directory.py's; sentence-transformers stores no Matryoshka
dimensions (they are a `truncate_dim` when loading), so the card names them.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from encoderx.export import model_card, writer
from encoderx.hf import engine, st_directory

POOLER = "encoder_model/pooler/dense/"
# A reranker's describe_head()["activation"] -> CrossEncoder's activation_fn: predict()
# returns the scores as the run's loss read them (a similarity run's: the identity).
ACTIVATIONS = {"identity": "torch.nn.modules.linear.Identity",
               "sigmoid": "torch.nn.modules.activation.Sigmoid"}


def _embedding(run: writer.Run) -> tuple[st_directory.SentenceEmbedding, list[int]]:
  """(the run's sentence embedding, its Matryoshka dimensions); ExportError for a run
  that is not an embedding model's."""
  head = run.method.describe_head()
  embedding = st_directory.of_run_head(head, run.config.data.seq_length)
  if embedding is None:
    raise writer.ExportError(
        f"the '{run.config.method}' method does not train sentence embeddings; "
        "--format=sentence-transformers exports a simcse or contrastive run "
        "(--format=cross-encoder a similarity run, --format=hf any).", argument="workdir")
  if head["pooling"] not in st_directory.RUN_POOLINGS:
    raise writer.ExportError(f"pooling {head['pooling']!r} has no sentence-transformers "
                             f"Pooling mode ({', '.join(st_directory.RUN_POOLINGS)} do).")
  return embedding, list(head.get("matryoshka_dims") or [])


def _with_unused_pooler(run: writer.Run) -> writer.Run:
  """The run with a zero pooler where the family's bare class has one (BertModel,
  RobertaModel, AlbertModel) and the run none (an embedding method's encoder):
  sentence-transformers pools the token outputs and never reads it. Zeros rather than
  leaving it out, which transformers would fill at random, with a warning, on every
  load."""
  hidden = run.model_config.hidden_size
  needed = {path for _, path, _ in engine.class_rules(run.model_config,
                                                      run.model_config.family, "base")}
  params = {**run.params, "encoder_model": dict(run.params["encoder_model"])}
  if {POOLER + "kernel", POOLER + "bias"} <= needed and "pooler" not in params["encoder_model"]:
    params["encoder_model"]["pooler"] = {"dense": {
        "kernel": np.zeros([hidden, hidden], np.float32), "bias": np.zeros([hidden], np.float32)}}
  return dataclasses.replace(run, params=params)


def export_sentence_transformers(workdir: str, output: str,
                                 step: int | None = None) -> writer.Exported:
  """Writes the run's encoder as a sentence-transformers directory (module docstring)."""
  output = writer.output_directory(output)
  run = writer.load_run(workdir, step)
  embedding, dims = _embedding(run)  # before anything is written
  run = _with_unused_pooler(run)

  def add_files(directory: str) -> None:
    st_directory.write(directory, embedding, run.model_config.hidden_size, tuple(dims))
    model_card.write(directory, model_card.embedding_card(run, workdir, embedding, dims))

  return writer.write_hf(run, output, step, "base", add_files=add_files)


def export_cross_encoder(workdir: str, output: str,
                         step: int | None = None) -> writer.Exported:
  """Writes a one-score run as a CrossEncoder directory (module docstring)."""
  output = writer.output_directory(output)
  run = writer.load_run(workdir, step)
  head = run.method.describe_head()
  if not (head.get("regression") or head.get("kind") == "cross-encoder"):
    raise writer.ExportError(
        f"the '{run.config.method}' method does not score pairs with one output; "
        "--format=cross-encoder exports a rerank or similarity run (a classify run's "
        "labels export with --format=hf).", argument="workdir")
  activation = ACTIVATIONS[head.get("activation", "identity")]

  def add_files(directory: str) -> None:
    model_card.write(directory, model_card.cross_encoder_card(run, workdir))

  # CrossEncoder cuts pairs at the tokenizer's length: the one the run was trained at.
  fields = {"num_labels": 1,
            "sentence_transformers": {"activation_fn": activation}}
  return writer.write_hf(run, output, step, None, fields, add_files,
                         max_length=run.config.data.seq_length)

"""The README.md model card of an exported sentence-transformers or CrossEncoder directory:
the base model (the run's init_from), the data (its train file), the loss (the method),
the dev scores of its best checkpoint (when eval.best_metric kept one) and how to load
it. The metadata block follows sentence-transformers 6.2.0's card (base/model_card.py,
`get_model_specific_metadata`: library_name, pipeline_tag, base_model, tags).
"""
from __future__ import annotations

import glob
import json
import os
import sys

from encoderx import files as files_lib
from encoderx.hf import st_directory


def best_metrics(workdir: str) -> tuple[int, dict] | None:
  """(step, metrics) of the run's best checkpoint (best/STEP/metrics, written by
  checkpoint.BestCheckpoint), or None when it kept none."""
  found = []
  for path in glob.glob(os.path.join(str(files_lib.path(workdir)), "best", "*",
                                     "metrics", "metrics")):
    step = os.path.basename(os.path.dirname(os.path.dirname(path)))
    if step.isdigit():
      with open(path, encoding="utf-8") as f:
        found.append((int(step), json.load(f)))
  return max(found) if found else None  # one is kept


def _loss(run) -> str:
  """The method's name, the reference library's name of its loss (where it has one) and
  the first paragraph of its module's docstring."""
  doc = sys.modules[type(run.method).__module__].__doc__ or ""
  named = run.method.reference_loss()
  return (f"`{run.config.method}`" + (f" (sentence-transformers' {named})" if named else "")
          + ": " + " ".join(doc.split("\n\n")[0].split()))


def _training(run, workdir: str) -> list[str]:
  finetune = run.config.get("finetune", {})
  best = best_metrics(workdir)
  scores = (", ".join(f"{name} {value:.4f}" for name, value in sorted(best[1].items())
                      if isinstance(value, (int, float)))
            + f" (the best checkpoint's, step {best[0]}; dev file "
            f"{finetune.get('dev_file', '')})"
            if best else "not recorded (the run kept no best checkpoint)")
  return ["## Training (encoderx)", "",
          f"- Base model: {run.config.init_from or 'none (trained from scratch)'}",
          f"- Data: {finetune.get('train_file', '') or run.config.data.get('tfds_name', '')}",
          f"- Loss: {_loss(run)}",
          f"- Steps: {run.config.train.steps}, batch {run.config.train.batch_size}",
          f"- Dev scores: {scores}", ""]


def _front_matter(run, pipeline: str, library: str, tags: list[str]) -> list[str]:
  base = run.config.init_from.removeprefix("hf:") if run.config.init_from else ""
  return ["---", f"library_name: {library}", f"pipeline_tag: {pipeline}",
          *([f"base_model: {base}"] if base else []), "tags:",
          *(f"- {tag}" for tag in ["encoderx", *tags]), "---", ""]


def embedding_card(run, workdir: str, embedding: st_directory.SentenceEmbedding,
                   matryoshka_dims: list[int]) -> str:
  """The card of an embedding model."""
  lines = _front_matter(run, "sentence-similarity", "sentence-transformers",
                        ["sentence-transformers", "sentence-similarity"])
  lines += [f"# {run.config.method} embedding model ({run.model_config.family})", "",
            f"Trained with encoderx. Embeddings of {run.model_config.hidden_size} "
            f"dimensions: {embedding.pooling} pooling"
            + (", normalized" if embedding.normalize else "")
            + f", cosine similarity, texts up to {embedding.max_seq_length} tokens.", ""]
  if embedding.prompts:
    lines += ["Prompts (put before each text; `encode_query` / `encode_document` use "
              "them):", "", *(f"- {name}: `{prefix!r}`"
                              for name, prefix in embedding.prompts.items()), ""]
  if matryoshka_dims:
    lines += [f"Matryoshka dimensions: {', '.join(map(str, matryoshka_dims))} (load with "
              f"`SentenceTransformer(DIR, truncate_dim={min(matryoshka_dims)})` for the "
              "shortest).", ""]
  lines += ["```python", "from sentence_transformers import SentenceTransformer",
            'model = SentenceTransformer("DIR")', 'embeddings = model.encode(["a text"])',
            "```", "", *_training(run, workdir)]
  return "\n".join(lines)


def cross_encoder_card(run, workdir: str) -> str:
  """The card of a reranker (one score per pair)."""
  lines = _front_matter(run, "text-ranking", "sentence-transformers",
                        ["sentence-transformers", "cross-encoder"])
  lines += [f"# {run.config.method} cross-encoder ({run.model_config.family})", "",
            "Trained with encoderx: one score per (text, text pair), the head's output "
            f"through {run.method.describe_head().get('activation', 'identity')} "
            "(the activation CrossEncoder applies).", "",
            "```python", "from sentence_transformers import CrossEncoder",
            'model = CrossEncoder("DIR")', 'scores = model.predict([("query", "document")])',
            "```", "", *_training(run, workdir)]
  return "\n".join(lines)


def write(directory: str, text: str) -> None:
  with open(os.path.join(directory, "README.md"), "w", encoding="utf-8") as f:
    f.write(text)

"""Sentence embeddings from a trained encoder (the command: embed/__main__.py).

    from encoderx import embed
    embedder = embed.Embedder("hf:DIR", pooling="mean", normalize=True)
    vectors = embedder(["It is a truth universally acknowledged.", ...])  # [n, hidden]

`init_from` is what --init_from of a training run takes: a run's work directory (its
latest checkpoint: e.g. a SimCSE run) or hf:DIR, a Hugging Face model directory (e.g. a
sentence-transformers model's). Where an argument leaves it open, the model's own
pooling, normalization, prompts and length apply (sources.Source.sentence_embedding):
a sentence-transformers directory's modules, or an embedding run's (simcse, contrastive)
as it was trained, so that Embedder(RUN) is SentenceTransformer(its export).

Texts are tokenized as training tokenizes them ([CLS] text [SEP], cut to `max_length`
tokens), sorted by length into batches padded to a few bucket lengths (one compilation
each), embedded by one jitted function and put back in input order. `mean` pooling
averages the encoder's outputs over the real tokens, special ones included, `cls` takes
the first token's and `lasttoken` the last real token's, as sentence-transformers'
Pooling does; `normalize` scales to unit length (its Normalize module).
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from tqdm.auto import tqdm

from encoderx import errors, sources
from encoderx.data import labelled, tasks
from encoderx.hf import st_directory
from encoderx.models import model_config
from encoderx.models import finetuning

POOLINGS = st_directory.MODE_POOLINGS  # --pooling's names -> the encoder's pooling
# Padded lengths of the batches: each a compilation; a batch takes the shortest that fits.
BUCKETS = (16, 32, 64, 128, 256, 512)
DEFAULT_MAX_LENGTH = 256


def open_encoder(source, max_length: int):
  """(its vocabulary, its model config, max_length within the model's positions) of an
  opened `source` (sources.open_source of a run or hf:DIR), set up for inference: its
  params come unscanned and without the vocabulary's padding rows; without dropout, the
  default attention is the fast one."""
  vocabulary = tasks.build_vocabulary(ml_collections.ConfigDict(source.vocab))
  fields = {**source.model, "layout.scan": False, "layout.remat": False,
            "vocab_multiple": 1, "attention.kernel": "auto"}
  config = model_config.ModelConfig.from_config(model_config.nested(fields),
                                                vocabulary.vocab_size)
  limit = config.embeddings.max_positions - config.embeddings.position_offset
  return vocabulary, config, min(max_length, limit)


def word_pieces(vocabulary, texts: list[str]) -> list[list[int]]:
  """The word piece ids of each text (no special tokens)."""
  rows = []
  for start in range(0, len(texts), 1024):  # one tokenizer call per 1,024 texts
    rows += vocabulary.tokenize_words_tf(texts[start:start + 1024]).merge_dims(1, 2).to_list()
  return rows


def padded_batch(rows: list[list[int]], batch_size: int, pad_id: int,
                 types: list[list[int]] | None = None) -> dict[str, np.ndarray]:
  """The model's features of token id rows (token types `types`, default 0), padded to
  the shortest of BUCKETS that holds the longest, and with empty rows to batch_size."""
  longest = max(len(row) for row in rows)
  length = next((b for b in BUCKETS if b >= longest), longest)
  ids = np.full([batch_size, length], pad_id, np.int32)
  real = np.zeros([batch_size, length], np.int32)
  token_types = np.zeros([batch_size, length], np.int32)
  for i, row in enumerate(rows):
    ids[i, :len(row)], real[i, :len(row)] = row, 1
    if types is not None:
      token_types[i, :len(row)] = types[i]
  return {"input_ids": ids, "token_type_ids": token_types, "segment_ids": real,
          "positions": np.broadcast_to(np.arange(length, dtype=np.int32), ids.shape)}


def in_length_order(rows: list[list[int]], batch_size: int, apply, shape: tuple[int, ...],
                    show_progress: bool = False, description: str = "embed") -> np.ndarray:
  """float32 [len(rows), *shape]: `apply(indices)` (-> [batch_size, *shape]) of the rows
  in batches of similar lengths, longest first, put back in input order."""
  order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))
  output = np.zeros([len(rows), *shape], np.float32)
  starts = range(0, len(order), batch_size)
  for start in tqdm(starts, desc=description, unit="batch", disable=not show_progress):
    chosen = order[start:start + batch_size]
    output[chosen] = np.asarray(apply(chosen))[:len(chosen)]
  return output


def named_prompt(prompts: dict, name: str, argument: str = "prompt_name") -> str:
  """The prefix of prompt `name` of a model's `prompts`; a name it lacks stops (a
  UserError about `argument`, listing the names it has)."""
  if name not in prompts:
    raise errors.UserError(f"prompt {name!r} is not one of the model's: "
                           f"{', '.join(prompts) or 'it has none'}.", argument=argument)
  return prompts[name]


def task_prompt(prompts: dict, task: str) -> str:
  """The prefix sentence-transformers 6.2 puts before a text of `task` ("query" or
  "document") when given no prompt: a model's prompt of that name, else none, never its
  default prompt. `SentenceTransformer.encode_query` / `encode_document`
  (sentence_transformers/sentence_transformer/model.py) pick the prompt name "query" /
  the first of "document", "passage", "corpus" in `self.prompts`, which always holds
  "query" and "document" (`_default_prompts`, "" unless the model sets them:
  `_validate_prompts` in base/model.py), so that `_resolve_prompt` never falls back to
  `default_prompt_name`, and "passage" and "corpus" are never reached."""
  return prompts.get(task, "")


class Embedder:
  """Embeds texts with the encoder of `init_from` (see the module docstring)."""

  def __init__(self, init_from: str, pooling: str | None = None,
               normalize: bool | None = None, max_length: int | None = None,
               batch_size: int = 64):
    source = sources.open_source(init_from)
    # The model's own settings (a sentence-transformers directory's, an embedding run's),
    # where an argument leaves one open.
    saved = source.sentence_embedding() or st_directory.SentenceEmbedding()
    pooling = pooling or saved.pooling
    if pooling not in POOLINGS:
      raise errors.UserError(f"pooling {pooling!r} is not one of {', '.join(POOLINGS)}.",
                             argument="pooling")
    normalize = saved.normalize if normalize is None else normalize
    max_length = max_length or saved.max_seq_length or DEFAULT_MAX_LENGTH
    self.embedding = dataclasses.replace(saved, pooling=pooling, normalize=normalize)
    self.vocabulary, self.model_config, self.max_length = open_encoder(source, max_length)
    self.batch_size = batch_size
    self.model = finetuning.SentenceEncoder(self.model_config, POOLINGS[pooling])
    params = source.load_params()
    self.params = {"encoder_model": {k: v for k, v in params["encoder_model"].items()
                                     if k != "pooler"}}

  @functools.cached_property
  def _embed_batch(self):
    def embed(params, batch):
      vectors = self.model.apply({"params": params}, batch).astype(jnp.float32)
      if self.embedding.normalize:
        vectors /= jnp.maximum(jnp.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)
      return vectors
    return jax.jit(embed)

  def token_ids(self, texts: list[str]) -> list[list[int]]:
    """[CLS] pieces [SEP] of each text, at most max_length ids."""
    vocabulary = self.vocabulary
    return [[vocabulary.cls_id] + ids[:self.max_length - 2] + [vocabulary.sep_id]
            for ids in word_pieces(vocabulary, texts)]

  @property
  def prompts(self) -> dict:
    return self.embedding.prompts

  def __call__(self, texts: list[str], show_progress: bool = False,
               description: str = "embed", prompt_name: str | None = None,
               prompt: str | None = None) -> np.ndarray:
    """float32 [len(texts), hidden]; `description` names the progress bar. Each text
    starts with `prompt` where given ("" for none), else with the model's prompt
    `prompt_name` (default: its default prompt, if any), as sentence-transformers'
    encode(prompt=..., prompt_name=...) prefixes it."""
    if prompt is None:
      prompt = (named_prompt(self.prompts, prompt_name) if prompt_name
                else self.embedding.prompt())
    rows = self.token_ids([prompt + text for text in texts])
    def apply(chosen):
      return self._embed_batch(self.params, padded_batch(
          [rows[i] for i in chosen], self.batch_size, self.vocabulary.pad_id))
    return in_length_order(rows, self.batch_size, apply, (self.model_config.hidden_size,),
                           show_progress, description)


def embed(texts: list[str], init_from: str, **options) -> np.ndarray:
  """float32 [len(texts), hidden]: `Embedder(init_from, **options)(texts)`."""
  return Embedder(init_from, **options)(texts)


def read_lines(path: str) -> list[str]:
  """Every line of a UTF-8 text file (blank ones too, so rows match line numbers)."""
  return [line for _, line in labelled.numbered_lines(path)]

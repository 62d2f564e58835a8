"""sentence-transformers' files beside a Hugging Face model directory: what turns the
encoder's outputs into a sentence embedding (pooling, normalization, prompts), written by
`encoderx.export --format=sentence-transformers` and read by `--init_from=hf:DIR`
(encoderx/sources.py) for encoderx.embed and encoderx.retrieval. A run's own is its
method's head description (`of_run_head`), so that a run embeds as its export does.

    write(directory, SentenceEmbedding(pooling="mean", normalize=True), 384)
    read(directory)  # -> SentenceEmbedding, or None without modules.json
    of_run_head({"pooling": "mean", "normalize": True, ...}, 128)  # or None

This mirrors sentence-transformers 6.2.0: modules.json and config_sentence_transformers.json
of `SentenceTransformer.save` (base/model.py, BaseModel.save), sentence_bert_config.json
of `Transformer` (base/modules/transformer.py), 1_Pooling/config.json of `Pooling`
(sentence_transformer/modules/pooling.py) and 2_Normalize/config.json of `Normalize`
(base/modules/normalize.py). The module types and pooling keys written are the older
names (`sentence_transformers.models.Pooling`, `pooling_mode_mean_tokens`), which every
release since 2.x reads and 6.2 converts (`_convert_legacy_pooling_config`), so that the
directory loads in the sentence-transformers a user has, not only the newest. A reranker
is a plain sequence-classification directory whose config.json names CrossEncoder's
`activation_fn` (cross_encoder/model.py, CrossEncoder.get_default_activation_fn): see
export/interchange.py's ACTIVATIONS.
"""
from __future__ import annotations

import dataclasses
import json
import os

from encoderx import errors

MODULES = "modules.json"
# The identity, so that CrossEncoder.predict returns the head's score itself (its
# default for one label is a sigmoid).
# A run's finetune.pooling -> sentence-transformers' pooling mode (which is also the
# name encoderx.embed's --pooling takes).
RUN_POOLINGS = {"mean": "mean", "first_token": "cls", "last_token": "lasttoken"}
# And back: a pooling mode -> the run's finetune.pooling.
MODE_POOLINGS = {mode: pooling for pooling, mode in RUN_POOLINGS.items()}
LEGACY_POOLING_KEYS = {"cls": "pooling_mode_cls_token", "max": "pooling_mode_max_tokens",
                       "mean": "pooling_mode_mean_tokens",
                       "mean_sqrt_len_tokens": "pooling_mode_mean_sqrt_len_tokens",
                       "weightedmean": "pooling_mode_weightedmean_tokens",
                       "lasttoken": "pooling_mode_lasttoken"}
# modules.json's types (the class name: the module paths moved in 6.0).
TRANSFORMER, POOLING, NORMALIZE = "Transformer", "Pooling", "Normalize"


class StDirectoryError(errors.UserError, ValueError):
  """A sentence-transformers directory whose modules encoderx cannot reproduce."""
  argument = "init_from"


@dataclasses.dataclass(frozen=True)
class SentenceEmbedding:
  """How a sentence-transformers model makes an embedding of the encoder's outputs."""
  pooling: str = "mean"  # sentence-transformers' mode: mean, cls, lasttoken
  normalize: bool = False
  prompts: dict = dataclasses.field(default_factory=dict)  # name -> prefix
  default_prompt_name: str | None = None
  max_seq_length: int | None = None
  do_lower_case: bool = False

  def prompt(self, name: str | None = None) -> str:
    """The prefix of prompt `name` (None: the default prompt's, or none)."""
    name = name or self.default_prompt_name
    return self.prompts.get(name, "") if name else ""


def of_run_head(head: dict, max_seq_length: int | None) -> SentenceEmbedding | None:
  """The sentence embedding of a run whose method describes its head as `head`
  (describe_head(): simcse's pooling; contrastive's pooling, normalize and prompts), its
  texts cut at `max_seq_length` tokens (the run's data.seq_length); None for a run that
  does not train sentence embeddings (no pooling, or labels or one score: a classifier,
  a reranker). The pooling is sentence-transformers' name for it (RUN_POOLINGS), or the
  run's own where it has none."""
  if "pooling" not in head or {"labels", "regression"} & head.keys():
    return None
  return SentenceEmbedding(
      pooling=RUN_POOLINGS.get(head["pooling"], head["pooling"]),
      normalize=bool(head.get("normalize", False)), prompts=dict(head.get("prompts") or {}),
      default_prompt_name=head.get("default_prompt_name"), max_seq_length=max_seq_length)


def _write_json(path: str, value: dict | list) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    json.dump(value, f, indent=2)
    f.write("\n")


def write(directory: str, embedding: SentenceEmbedding, hidden_size: int,
          matryoshka_dims: tuple[int, ...] = ()) -> list[str]:
  """Writes the sentence-transformers files of `embedding` into `directory` (which holds
  the Hugging Face model); returns the names written at its top. `matryoshka_dims`, the
  sizes the model was trained at, go into config_sentence_transformers.json as
  "matryoshka_dims": sentence-transformers has no field for them and ignores a key it
  does not read (BaseModel._parse_model_config), and its `truncate_dim` would make one
  of them every encode's default."""
  modules = [("", "sentence_transformers.models.Transformer"),
             ("1_Pooling", "sentence_transformers.models.Pooling")]
  if embedding.normalize:
    modules.append(("2_Normalize", "sentence_transformers.models.Normalize"))
    _write_json(os.path.join(directory, "2_Normalize", "config.json"), {})
  _write_json(os.path.join(directory, MODULES), [
      {"idx": i, "name": str(i), "path": path, "type": kind}
      for i, (path, kind) in enumerate(modules)])
  _write_json(os.path.join(directory, "sentence_bert_config.json"), {
      "max_seq_length": embedding.max_seq_length, "do_lower_case": embedding.do_lower_case})
  _write_json(os.path.join(directory, "1_Pooling", "config.json"), {
      "word_embedding_dimension": hidden_size,
      **{key: mode == embedding.pooling for mode, key in LEGACY_POOLING_KEYS.items()},
      "include_prompt": True})
  _write_json(os.path.join(directory, "config_sentence_transformers.json"), {
      "model_type": "SentenceTransformer", "prompts": embedding.prompts,
      "default_prompt_name": embedding.default_prompt_name, "similarity_fn_name": "cosine",
      **({"matryoshka_dims": [int(d) for d in matryoshka_dims]} if matryoshka_dims else {})})
  return ["1_Pooling", *(["2_Normalize"] if embedding.normalize else []),
          "config_sentence_transformers.json", MODULES, "sentence_bert_config.json"]


def _read_json(path: str) -> dict | list:
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except (OSError, ValueError) as error:
    raise StDirectoryError(f"cannot read {path}: {error}") from None


def _pooling_mode(path: str) -> tuple[str, bool]:
  """(the one pooling mode, include_prompt) of a Pooling module's config.json, in 6.x's
  form ('pooling_mode') or the older one (a pooling_mode_* flag)."""
  config = _read_json(path)
  modes = config.get("pooling_mode")
  if modes is None:
    modes = [mode for mode, key in LEGACY_POOLING_KEYS.items() if config.get(key)]
  modes = [modes] if isinstance(modes, str) else list(modes)
  if len(modes) != 1:
    raise StDirectoryError(f"{path} pools by {' + '.join(modes) or 'nothing'}; encoderx "
                           "pools by one mode (mean, cls or lasttoken).")
  return modes[0], config.get("include_prompt", True)


def read(directory: str) -> SentenceEmbedding | None:
  """The sentence embedding of a sentence-transformers directory; None when `directory`
  has no modules.json (a plain Hugging Face model). A module encoderx cannot reproduce
  (Dense, LayerNorm, a second Transformer, ...) stops here, named."""
  if not os.path.isfile(os.path.join(directory, MODULES)):
    return None
  fields, include_prompt = {}, True
  for module in _read_json(os.path.join(directory, MODULES)):
    kind, path = module.get("type", "").rsplit(".", 1)[-1], module.get("path", "")
    if kind == TRANSFORMER and path == "" and "pooling" not in fields:
      continue
    if kind == POOLING and "pooling" not in fields:
      fields["pooling"], include_prompt = _pooling_mode(
          os.path.join(directory, path, "config.json"))
    elif kind == NORMALIZE:
      fields["normalize"] = True
    else:
      where = f" in {os.path.join(directory, path)}" if path else ""
      hint = (f"; give hf:{os.path.join(directory, path)} (the encoder alone)"
              if kind == TRANSFORMER and path else "")
      raise StDirectoryError(
          f"{os.path.join(directory, MODULES)}: module {module.get('name', '?')} "
          f"({module.get('type')}{where}) is not one encoderx reproduces (it reads a "
          f"Transformer at the top, Pooling and Normalize){hint}.")
  settings = os.path.join(directory, "config_sentence_transformers.json")
  if os.path.isfile(settings):
    config = _read_json(settings)
    fields["prompts"] = dict(config.get("prompts") or {})
    fields["default_prompt_name"] = config.get("default_prompt_name")
  if fields.get("prompts") and not include_prompt:
    raise StDirectoryError(f"{directory}'s Pooling leaves the prompt's tokens out "
                           "(include_prompt=false); encoderx pools over the whole text.")
  transformer = os.path.join(directory, "sentence_bert_config.json")
  if os.path.isfile(transformer):
    config = _read_json(transformer)
    fields["max_seq_length"] = config.get("max_seq_length")
    fields["do_lower_case"] = bool(config.get("do_lower_case", False))
  return SentenceEmbedding(**fields)

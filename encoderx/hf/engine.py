"""Hugging Face (PyTorch) <-> encoderx weights, both directions from one rule table.

A rule maps one Hugging Face parameter name to one encoderx parameter path with an
array transform and its inverse (PyTorch Linear stores [out, in]; Flax Dense [in, out];
attention kernels here are [hidden, heads, head_dim]). Converting in and back out is the
identity, which the tests check, and outputs on converted weights match the PyTorch
model's, which the tests check too.

A family (`Family`, encoderx/hf/base.py) is one `model_type` of transformers: its config
class, how its config.json fields map to `config.model` (`model.family` names it), the
rules of its encoder, and its classes (`Head`s): the pretraining class, the masked-LM
class, task classes (sequence classification, ...) and the bare model, each with the
rules of the parts it holds beyond the encoder. Conversion is total: every weight of the
chosen class is mapped, and every encoderx parameter of the encoder too, or a
`ConversionError` names what is left; configurations the family cannot represent are
refused by the family's `check`. This module reads the families' tables and knows no
family of its own.

    params = engine.from_hf(BertForPreTraining.from_pretrained(d).state_dict(), config)
    state_dict = engine.to_hf(params, config)  # the class that holds all of params
    state_dict = engine.to_hf(params, config, family="roberta", head="mlm")

A new family is a module `encoderx/hf/<family>.py` that defines `FAMILY = Family(...)`:
its encoder rules, its `Head`s, its config mapping and checks, written with the building
blocks of encoderx/hf/rules.py (see encoderx/hf/bert.py); and one line in
encoderx/hf/families.py naming that module (tests/export_checks.py has the checks every
family passes).
"""
from __future__ import annotations

from typing import Mapping

import flax
import flax.linen as nn
import jax
import numpy as np

from encoderx.hf import base, families, rules
from encoderx.models import model_config
from encoderx.models import embeddings, encoder


def head_of_class(family: str, hf_class: str) -> str | None:
  """The head name of one of the family's classes ('BertForPreTraining' -> 'pretraining')."""
  return next((name for name, head in families.family_named(family).heads.items()
               if head.hf_class == hf_class), None)


def class_rules(config: model_config.ModelConfig, family: str, head: str) -> list[base.Rule]:
  """Every rule of the family's class `head`: encoder, pooler (if it has one), head."""
  fam = families.family_named(family)
  if head not in fam.heads:
    raise base.ConversionError(f"family '{family}' has no class for head '{head}'; its "
                               f"heads: {', '.join(fam.heads)}.")
  spec = fam.heads[head]
  prefix = f"{fam.prefix}." if spec.base_prefix else ""
  all_rules = fam.encoder(config, prefix)
  if spec.pooler and fam.pooler:
    all_rules += rules.dense(f"{prefix}{fam.pooler}", "encoder_model/pooler/dense")
  return all_rules + spec.rules(config)


# --- configs --------------------------------------------------------------------------------
def hf_config(config: model_config.ModelConfig, family: str = "bert", **overrides):
  """The family's `transformers` config with the sizes of an encoderx ModelConfig."""
  import transformers  # pylint: disable=g-import-not-at-top
  fam = families.family_named(family)
  fields = {hf_name: config.field(name) for name, hf_name in fam.field_names.items()}
  fields.update(fam.hf_fields(config))
  fields.update(overrides)
  return getattr(transformers, fam.config_class)(**fields)


SPECIAL_TOKEN_ROLES = ("pad", "bos", "eos", "mask", "cls", "sep", "unk")


def special_token_fields(family: str) -> tuple[str, ...]:
  """The special-token id fields (pad_token_id, ...) the family's config class has, read
  from the class: building a config to see would warn where a default id lies outside
  the run's vocabulary (EuroBertConfig's mask_token_id 128,002)."""
  import transformers  # pylint: disable=g-import-not-at-top
  config_class = getattr(transformers, families.family_named(family).config_class)
  return tuple(f"{role}_token_id" for role in SPECIAL_TOKEN_ROLES
               if hasattr(config_class, f"{role}_token_id"))


def model_fields(hf_config_dict: Mapping[str, object]) -> tuple[str, dict]:
  """(family, encoderx model fields by path ('attention.window'), `family` included) of
  a Hugging Face config.json;
  the inverse of hf_config. Raises ConversionError for what encoderx cannot represent."""
  family = hf_config_dict.get("model_type")
  if family not in families.names():
    raise base.ConversionError(f"model_type {family!r} has no conversion rules here; "
                               f"known: {', '.join(families.names())}.")
  fam = families.family_named(family)
  fields = {name: hf_config_dict[hf_name] for name, hf_name in fam.field_names.items()
            if hf_name in hf_config_dict}
  position_type = hf_config_dict.get("position_embedding_type", "absolute")
  if position_type != "absolute":
    raise base.ConversionError(f"position_embedding_type {position_type!r} is not "
                               "supported (only 'absolute').")
  fields.update(fam.model_fields(hf_config_dict))
  fields["family"] = family
  return family, fields


def hf_model(config: model_config.ModelConfig, family: str = "bert", head: str | None = None,
             **overrides):
  """A freshly initialized PyTorch model of the family's class `head` (default: the
  first, most complete one) with these sizes."""
  import transformers  # pylint: disable=g-import-not-at-top
  fam = families.family_named(family)
  spec = fam.heads[head or next(iter(fam.heads))]
  return getattr(transformers, spec.hf_class)(hf_config(config, family,
                                                        **{**spec.hf_fields, **overrides}))


def hf_pretraining_model(config: model_config.ModelConfig, family: str = "bert", **overrides):
  """The family's pretraining class (its first head), freshly initialized."""
  return hf_model(config, family, None, **overrides)


# --- conversion -----------------------------------------------------------------------------
# Buffers some classes save beside their weights; they are not parameters.
BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")
# encoderx parameters of the encoder proper: every one must convert.
ENCODER_PARTS = ("encoder_model/embeddings", "encoder_model/encoder")


def _numpy(value) -> np.ndarray:
  if hasattr(value, "detach"):  # a torch tensor
    value = value.detach().cpu().float().numpy()
  return np.asarray(value)


def part(path: str) -> str:
  """The model part a parameter belongs to: 'mlm_head', 'encoder_model/pooler', ..."""
  parts = path.split("/")
  return "/".join(parts[:2]) if parts[0] == "encoder_model" else parts[0]


def is_buffer(name: str) -> bool:
  return any(name.endswith(buffer) for buffer in BUFFERS)


def _flat_params(params, config: model_config.ModelConfig) -> dict[str, np.ndarray]:
  """Unboxed, unscanned, without the vocabulary's padding rows, by path."""
  params = nn.unbox(params)
  if config.layout.scan:
    params = encoder.unstack_layers(params, config.num_layers)
  params = embeddings.resize_vocabulary(params, config.vocab_size)
  return {"/".join(k): v for k, v in
          flax.traverse_util.flatten_dict(jax.device_get(params)).items()}


def exportable_heads(params, config: model_config.ModelConfig, family: str) -> list[str]:
  """The family's heads whose class holds nothing the params lack, most complete first."""
  fam = families.family_named(family)
  have = set(_flat_params(params, config))
  return [name for name in fam.heads
          if all(path in have for _, path, _ in class_rules(config, family, name))]


def export_state_dict(params, config: model_config.ModelConfig, family: str = "bert",
                      head: str | None = None,
                      drop: tuple[str, ...] | None = ()) -> tuple[dict, str, list[str]]:
  """encoderx params -> (HF state dict of numpy arrays, head, parts left out).

  `head` picks the class (default: the family's most complete class whose parts the
  params all have). Every weight of the class must come from a parameter, and every
  parameter must go to a weight, but for whole parts (heads, the pooler) named in
  `drop` (None: any part but the encoder's). Raises ConversionError naming the rest.
  The vocabulary's padding rows (model.vocab_multiple) are left out: the class has
  `vocab_size` rows, as config.json says.
  """
  fam = families.family_named(family)
  fam.check(config)
  flat = _flat_params(params, config)
  if head is None:
    candidates = exportable_heads(params, config, family)
    if not candidates:
      raise base.ConversionError(f"no {family} class fits parameters with parts "
                                 f"{', '.join(sorted({part(p) for p in flat}))}.")
    head = candidates[0]
  fam.export_check(config, head)
  head_rules = class_rules(config, family, head)
  hf_class = fam.heads[head].hf_class
  if (config.heads.pooler_act != fam.pooler_act
      and any(path.startswith("encoder_model/pooler/") for _, path, _ in head_rules)):
    raise base.ConversionError(f"model.heads.pooler_act={config.heads.pooler_act!r}: {hf_class}'s "
                               f"pooler applies {fam.pooler_act}.")
  missing = sorted(path for _, path, _ in head_rules if path not in flat)
  if missing:
    raise base.ConversionError(f"{hf_class} needs parameters these lack: "
                               f"{', '.join(missing)}.")
  used = {path for _, path, _ in head_rules}
  left = sorted(path for path in flat if path not in used)
  unread = {path for _, path, _ in fam.unread(config)}
  refused = [p for p in left if p not in unread and (
      part(p) in ENCODER_PARTS or (drop is not None and part(p) not in drop))]
  if refused:
    raise base.ConversionError(f"{hf_class} has no place for: {', '.join(refused)}.")
  state_dict = {}
  for hf_name, path, transform in head_rules:  # the blocks of a fused weight in rule order
    value = transform.to_hf(np.asarray(flat[path], np.float32), config)
    state_dict[hf_name] = (np.concatenate([state_dict[hf_name], value])
                           if hf_name in state_dict else value)
  return state_dict, head, sorted({p if p in unread else part(p) for p in left})


def to_hf(params, config: model_config.ModelConfig, family: str = "bert",
          head: str | None = None) -> dict[str, np.ndarray]:
  """encoderx params -> HF state dict (numpy arrays) of the class holding all of them;
  inverse of `from_hf`. Anything left over is a ConversionError."""
  return export_state_dict(params, config, family, head)[0]


def import_state_dict(state_dict: Mapping[str, object], config: model_config.ModelConfig,
                      family: str = "bert", head: str | None = None,
                      unused_heads: bool = False,
                      prefer: str | None = None) -> tuple[dict, str, list[str]]:
  """HF state dict -> (encoderx params as a nested dict of numpy arrays, head, unused).

  `head` names the class the weights are of (default: the family's class whose weights
  are all there and leave the fewest over; `prefer` breaks ties). Every weight of that
  class converts; a weight left over is a ConversionError. With `unused_heads`, weights
  may be of a class with no rules here (BertForQuestionAnswering, ...): its encoder (and
  pooler) convert and its head weights are returned in `unused`; the encoder's must
  still all convert. The vocabulary parameters come padded with zero rows to
  `config.padded_vocab_size` (model.vocab_multiple); export drops those rows again.
  """
  fam = families.family_named(family)
  fam.check(config)
  unread = {hf_name for hf_name, _, _ in fam.unread(config)}
  names = {name for name in state_dict if not is_buffer(name)
           and name.removeprefix(f"{fam.prefix}.") not in unread}
  candidates = [(name, class_rules(config, family, name),
                 set(fam.heads[name].tied_names(config)))
                for name in ([head] if head else fam.heads)]
  if unused_heads and not head:
    encoder_rules = fam.encoder(config, f"{fam.prefix}.")
    if fam.pooler:
      pooler = rules.dense(f"{fam.prefix}.{fam.pooler}", "encoder_model/pooler/dense")
      candidates.append(("encoder", encoder_rules + pooler, set()))
    candidates.append(("encoder", encoder_rules, set()))
  fits = []
  for name, candidate_rules, tied in candidates:
    needed = {hf_name for hf_name, _, _ in candidate_rules}
    fits.append((len(needed - names), len(names - needed - tied), name != prefer, name,
                 candidate_rules, needed, tied))
  absent, _, _, head, head_rules, needed, tied = min(fits, key=lambda fit: fit[:3])
  hf_class = fam.heads[head].hf_class if head in fam.heads else f"the {family} encoder"
  if absent:
    raise base.ConversionError(f"the weights lack what {hf_class} has: "
                               f"{', '.join(sorted(needed - names))}.")
  left = sorted(names - needed - tied)
  encoder_names = {hf_name for hf_name, _, _ in fam.encoder(config, f"{fam.prefix}.")
                   + fam.encoder(config, "")}
  refused = [n for n in left if not unused_heads or n in encoder_names
             or n.startswith((f"{fam.prefix}.embeddings.", f"{fam.prefix}.encoder.",
                              "embeddings.", "encoder."))]
  if refused:
    raise base.ConversionError(f"weights with no {family} conversion rule ({hf_class}): "
                               f"{', '.join(refused)}.")
  flat = {tuple(path.split("/")): transform.to_flax(_numpy(state_dict[hf_name]), config)
          for hf_name, path, transform in head_rules}
  params = embeddings.resize_vocabulary(flax.traverse_util.unflatten_dict(flat),
                                        config.padded_vocab_size)
  if config.layout.scan:
    params = encoder.stack_layers(params)
  return params, head, left


def from_hf(state_dict: Mapping[str, object], config: model_config.ModelConfig,
            family: str = "bert", expected=None, head: str | None = None) -> dict:
  """HF state dict -> encoderx params (nested dict of numpy arrays); every weight must
  convert. `expected` (an encoderx param tree, e.g. from `jax.eval_shape(model.init,
  ...)`) makes every missing or misshapen parameter an error too."""
  params, _, _ = import_state_dict(state_dict, config, family, head)
  if expected is not None:
    check_tree(params, expected)
  return params


def check_tree(params, expected) -> None:
  """Raises ConversionError listing missing, unexpected and misshapen parameters."""
  got = {k: np.shape(v) for k, v in flax.traverse_util.flatten_dict(params).items()}
  want = {k: tuple(v.shape) for k, v in
          flax.traverse_util.flatten_dict(nn.unbox(expected)).items()}
  problems = [f"missing {'/'.join(k)}" for k in want.keys() - got.keys()]
  problems += [f"unexpected {'/'.join(k)}" for k in got.keys() - want.keys()]
  problems += [f"{'/'.join(k)}: shape {got[k]} != {want[k]}"
               for k in want.keys() & got.keys() if got[k] != want[k]]
  if problems:
    raise base.ConversionError("converted weights do not fit the model: "
                               + "; ".join(sorted(problems)))

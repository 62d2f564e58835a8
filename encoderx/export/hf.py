"""Hugging Face (PyTorch) <-> encoderx weights, both directions from one rule table.

A rule maps one Hugging Face parameter name to one encoderx parameter path with an
array transform and its inverse (PyTorch Linear stores [out, in]; Flax Dense [in, out];
attention kernels here are [hidden, heads, head_dim]). Converting in and back out is the
identity, which the tests check, and outputs on converted weights match the PyTorch
model's, which the tests check too. Each family has its rule table (`RULES`): 'bert'
(BertForPreTraining), 'roberta' (RobertaForMaskedLM), 'albert' (AlbertForPreTraining) and
'deberta-v2' (DebertaV2ForMaskedLM: DeBERTa v2 and v3), 'electra'
(ElectraForPreTraining, the discriminator; ElectraForMaskedLM, the generator) and 'xlnet'
(XLNetLMHeadModel).

    params = hf.from_hf(BertForPreTraining.from_pretrained(d).state_dict(), model_config)
    state_dict = hf.to_hf(params, model_config)
    params = hf.from_hf(RobertaForMaskedLM.from_pretrained(d).state_dict(), model_config,
                        family="roberta")
    params = hf.from_hf(albert_state_dict, model_config, family="albert")
"""
from __future__ import annotations

import dataclasses
import re
from typing import Callable, Mapping

import flax
import flax.linen as nn
import jax
import numpy as np

from encoderx.models import common


@dataclasses.dataclass(frozen=True)
class Transform:
  to_flax: Callable[[np.ndarray, common.ModelConfig], np.ndarray]
  to_hf: Callable[[np.ndarray, common.ModelConfig], np.ndarray]


COPY = Transform(lambda x, c: x, lambda x, c: x)
LINEAR = Transform(lambda x, c: x.T, lambda x, c: x.T)
HEADS_IN = Transform(  # [heads*dim, hidden] -> [hidden, heads, dim]
    lambda x, c: x.T.reshape(x.shape[1], c.num_heads, c.head_dim),
    lambda x, c: x.reshape(x.shape[0], -1).T)
HEADS_BIAS = Transform(lambda x, c: x.reshape(c.num_heads, c.head_dim),
                       lambda x, c: x.reshape(-1))
HEADS_OUT = Transform(  # [hidden, heads*dim] -> [heads, dim, hidden]
    lambda x, c: x.T.reshape(c.num_heads, c.head_dim, x.shape[0]),
    lambda x, c: x.reshape(-1, x.shape[-1]).T)
# XLNet stores its output projection as [hidden, heads, dim]; ours is [heads, dim, hidden].
XLNET_HEADS_OUT = Transform(lambda x, c: x.transpose(1, 2, 0),
                            lambda x, c: x.transpose(2, 0, 1))
XLNET_MASK_EMB = Transform(lambda x, c: x.reshape(-1),  # [1, 1, hidden] -> [hidden]
                           lambda x, c: x.reshape(1, 1, -1))


def _dense(hf: str, flax_path: str, kernel: Transform = LINEAR, bias: Transform = COPY):
  return [(f"{hf}.weight", f"{flax_path}/kernel", kernel), (f"{hf}.bias", f"{flax_path}/bias", bias)]


def _layer_norm(hf: str, flax_path: str):
  return [(f"{hf}.weight", f"{flax_path}/scale", COPY), (f"{hf}.bias", f"{flax_path}/bias", COPY)]


# Where each part of an encoder layer lives in a family's HF layer module.
BERT_LAYER = dict(
    query="attention.self.query", key="attention.self.key", value="attention.self.value",
    out="attention.output.dense", attention_norm="attention.output.LayerNorm",
    intermediate="intermediate.dense", output="output.dense", ffn_norm="output.LayerNorm")
DEBERTA_LAYER = dict(
    BERT_LAYER, query="attention.self.query_proj", key="attention.self.key_proj",
    value="attention.self.value_proj")
ALBERT_LAYER = dict(
    query="attention.query", key="attention.key", value="attention.value",
    out="attention.dense", attention_norm="attention.LayerNorm",
    intermediate="ffn", output="ffn_output", ffn_norm="full_layer_layer_norm")


def _layer(hf: str, flax: str, names: dict[str, str]):
  """Rules of one encoder layer: HF module `hf` (parts named by `names`) <-> `flax`."""
  attention = f"{flax}/attention/self_attention"
  return (_dense(f"{hf}.{names['query']}", f"{attention}/query", HEADS_IN, HEADS_BIAS)
          + _dense(f"{hf}.{names['key']}", f"{attention}/key", HEADS_IN, HEADS_BIAS)
          + _dense(f"{hf}.{names['value']}", f"{attention}/value", HEADS_IN, HEADS_BIAS)
          + _dense(f"{hf}.{names['out']}", f"{attention}/out", HEADS_OUT)
          + _layer_norm(f"{hf}.{names['attention_norm']}", f"{flax}/attention/layer_norm")
          + _dense(f"{hf}.{names['intermediate']}", f"{flax}/ffn/intermediate")
          + _dense(f"{hf}.{names['output']}", f"{flax}/ffn/output")
          + _layer_norm(f"{hf}.{names['ffn_norm']}", f"{flax}/ffn/layer_norm"))


def _embeddings(hf: str):
  """Token, position and token-type tables and their LayerNorm (BERT and ALBERT)."""
  flax = "encoder_model/embeddings"
  return [(f"{hf}embeddings.{table}.weight", f"{flax}/{table}/embedding", COPY)
          for table in ("word_embeddings", "position_embeddings", "token_type_embeddings")
          ] + _layer_norm(f"{hf}embeddings.LayerNorm", f"{flax}/layer_norm")


def _encoder(config: common.ModelConfig, hf: str):
  """Embeddings and layers, shared by BERT and RoBERTa (`hf`: 'bert.', 'roberta.', '')."""
  rules = _embeddings(hf)
  for i in range(config.num_layers):
    rules += _layer(f"{hf}encoder.layer.{i}", f"encoder_model/encoder/layer_{i}",
                    BERT_LAYER)
  return rules


def _mlm_head(dense: str, layer_norm: str, bias: str):
  """The MLM head's transform, LayerNorm and output bias (its decoder is the tied word
  embedding), named as the family names them."""
  return (_dense(dense, "mlm_head/transform")
          + _layer_norm(layer_norm, "mlm_head/layer_norm")
          + [(bias, "mlm_head/output_bias", COPY)])


def bert_rules(config: common.ModelConfig, prefix: str = "bert"):
  """Rules for BertForPreTraining / BertForMaskedLM / BertModel (prefix '')."""
  hf = f"{prefix}." if prefix else ""
  rules = _encoder(config, hf)
  rules += _dense(f"{hf}pooler.dense", "encoder_model/pooler/dense")
  rules += _mlm_head("cls.predictions.transform.dense",
                     "cls.predictions.transform.LayerNorm", "cls.predictions.bias")
  rules += _dense("cls.seq_relationship", "sentence_head/classifier")
  return rules


def roberta_rules(config: common.ModelConfig, prefix: str = "roberta"):
  """Rules for RobertaForMaskedLM / RobertaModel (prefix ''): BERT's encoder under
  `roberta.`, no pooler (MLM only), and `lm_head` whose decoder is tied to the word
  embeddings (its bias is `lm_head.bias`)."""
  rules = _encoder(config, f"{prefix}." if prefix else "")
  rules += _mlm_head("lm_head.dense", "lm_head.layer_norm", "lm_head.bias")
  return rules


def albert_rules(config: common.ModelConfig, prefix: str = "albert"):
  """Rules for AlbertForPreTraining / AlbertForMaskedLM / AlbertModel (prefix '').

  ALBERT's layers are groups of shared layers: `layer_sharing='all'` is one group (the
  released models; our `shared_layer`), 'none' is one group per layer (HF
  num_hidden_groups = num_hidden_layers). HF always maps embeddings to the hidden size
  (`embedding_hidden_mapping_in`), our Embeddings' `projection`, so embedding_size must
  differ from hidden_size.
  """
  if config.layer_sharing not in ("all", "none"):
    raise ValueError(f"layer_sharing={config.layer_sharing!r} has no Hugging Face ALBERT "
                     "equivalent; ALBERT shares 'all' layers or (one group per layer) none.")
  if config.embedding_size == config.hidden_size:
    raise ValueError("Hugging Face ALBERT always projects embeddings to the hidden size; "
                     "set model.embedding_size below model.hidden_size.")
  hf = f"{prefix}." if prefix else ""
  rules = _embeddings(hf) + _dense(f"{hf}encoder.embedding_hidden_mapping_in",
                                   "encoder_model/embeddings/projection")
  groups = ["shared_layer"] if config.layer_sharing == "all" else [
      f"layer_{i}" for i in range(config.num_layers)]
  for group, layer in enumerate(groups):
    rules += _layer(f"{hf}encoder.albert_layer_groups.{group}.albert_layers.0",
                    f"encoder_model/encoder/{layer}", ALBERT_LAYER)
  rules += _dense(f"{hf}pooler", "encoder_model/pooler/dense")
  rules += _mlm_head("predictions.dense", "predictions.LayerNorm", "predictions.bias")
  rules += _dense("sop_classifier.classifier", "sentence_head/classifier")
  return rules


def deberta_rules(config: common.ModelConfig, prefix: str = "deberta"):
  """Rules for DebertaV2ForMaskedLM / DebertaV2Model (prefix ''), DeBERTa v2 and v3.

  BERT's embeddings and layers under DeBERTa's names, plus the relative distance table
  and its LayerNorm (`encoder.rel_embeddings`, `encoder.LayerNorm`) and, without
  share_att_key, each layer's position projections. The MLM head is written as
  DeBERTa's own checkpoints name it (`lm_predictions.lm_head`, Hugging Face's
  legacy=False); Hugging Face's legacy head (`cls.predictions`, the same weights) is
  read too. A position table (`embeddings.position_embeddings`) converts when the model
  has one (absolute positions, or the enhanced mask decoder, which Hugging Face lacks).
  """
  if config.embedding_size != config.hidden_size:
    raise ValueError("Hugging Face DeBERTa projects embeddings before their LayerNorm, "
                     "without bias; encoderx's DeBERTa needs model.embedding_size = "
                     "hidden_size.")
  hf = f"{prefix}." if prefix else ""
  rules = _embeddings(hf)
  relative = "encoder_model/encoder/relative"
  rules += [(f"{hf}encoder.rel_embeddings.weight", f"{relative}/relative_embeddings", COPY)]
  rules += _layer_norm(f"{hf}encoder.LayerNorm", f"{relative}/layer_norm")
  own_projections = [] if config.share_att_key else [
      (name, projection) for term, name, projection in (
          ("c2p", "pos_key_proj", "position_key"), ("p2c", "pos_query_proj", "position_query"))
      if term in config.relative_attention_terms]
  for i in range(config.num_layers):
    hf_layer, layer = f"{hf}encoder.layer.{i}", f"encoder_model/encoder/layer_{i}"
    rules += _layer(hf_layer, layer, DEBERTA_LAYER)
    for name, projection in own_projections:
      rules += _dense(f"{hf_layer}.attention.self.{name}",
                      f"{layer}/attention/self_attention/{projection}", HEADS_IN, HEADS_BIAS)
  rules += _mlm_head("lm_predictions.lm_head.dense", "lm_predictions.lm_head.LayerNorm",
                     "lm_predictions.lm_head.bias")
  rules += _mlm_head("cls.predictions.transform.dense",
                     "cls.predictions.transform.LayerNorm", "cls.predictions.bias")
  return rules


def electra_rules(config: common.ModelConfig, prefix: str = "electra"):
  """Rules for ElectraForPreTraining (the discriminator: `rtd_head`), ElectraForMaskedLM
  (the generator: `mlm_head`, its decoder tied to the word embeddings, its bias
  `generator_lm_head.bias`) and ElectraModel (prefix ''): BERT's encoder under
  `electra.`, no pooler, and `embeddings_project` (our Embeddings' `projection`) when the
  embedding size differs from the hidden size. Hugging Face's generator head applies
  GELU whatever hidden_act says (ElectraGeneratorPredictions), as ELECTRA's models use.
  """
  hf = f"{prefix}." if prefix else ""
  rules = _encoder(config, hf)
  rules += _dense(f"{hf}embeddings_project", "encoder_model/embeddings/projection")
  rules += _dense("discriminator_predictions.dense", "rtd_head/transform")
  rules += _dense("discriminator_predictions.dense_prediction", "rtd_head/classifier")
  rules += _mlm_head("generator_predictions.dense", "generator_predictions.LayerNorm",
                     "generator_lm_head.bias")
  return rules


def xlnet_rules(config: common.ModelConfig, prefix: str = "transformer"):
  """Rules for XLNetLMHeadModel / XLNetModel (prefix ''): the word embedding, per layer
  the relative attention (q, k, v, o, r kernels [hidden, heads, dim], no biases; the
  r_w / r_r / r_s biases and seg_embed) with its LayerNorm and the feed-forward;
  `mask_emb` (the query stream's start) and `lm_loss.bias` go to the PLM head, whose
  output weights are tied to the word embedding."""
  hf = f"{prefix}." if prefix else ""
  rules = [(f"{hf}word_embedding.weight", "encoder_model/embeddings/word_embeddings/embedding",
            COPY), (f"{hf}mask_emb", "plm_head/mask_emb", XLNET_MASK_EMB)]
  for i in range(config.num_layers):
    layer, flax_layer = f"{hf}layer.{i}", f"encoder_model/encoder/layer_{i}"
    attention = f"{flax_layer}/attention/self_attention"
    rules += [(f"{layer}.rel_attn.{name}", f"{attention}/{ours}/kernel", COPY)
              for name, ours in (("q", "query"), ("k", "key"), ("v", "value"),
                                 ("r", "relative"))]
    rules += [(f"{layer}.rel_attn.o", f"{attention}/out/kernel", XLNET_HEADS_OUT)]
    rules += [(f"{layer}.rel_attn.{name}", f"{attention}/{name}", COPY)
              for name in ("r_w_bias", "r_r_bias", "r_s_bias", "seg_embed")]
    rules += (_layer_norm(f"{layer}.rel_attn.layer_norm", f"{flax_layer}/attention/layer_norm")
              + _dense(f"{layer}.ff.layer_1", f"{flax_layer}/ffn/intermediate")
              + _dense(f"{layer}.ff.layer_2", f"{flax_layer}/ffn/output")
              + _layer_norm(f"{layer}.ff.layer_norm", f"{flax_layer}/ffn/layer_norm"))
  rules += [("lm_loss.bias", "plm_head/output_bias", COPY)]
  return rules


# Rule tables by model family (a Hugging Face model_type); `family=` of from_hf / to_hf
# picks one.
RULES = {"bert": bert_rules, "roberta": roberta_rules, "albert": albert_rules,
         "deberta-v2": deberta_rules, "electra": electra_rules, "xlnet": xlnet_rules}


def rules_for(family: str, config: common.ModelConfig):
  if family not in RULES:
    raise ValueError(f"no Hugging Face conversion rules for family '{family}'; "
                     f"known: {', '.join(RULES)}")
  return RULES[family](config)


# Family -> (transformers config class, pretraining model class) names.
HF_CLASSES = {"bert": ("BertConfig", "BertForPreTraining"),
              "roberta": ("RobertaConfig", "RobertaForMaskedLM"),
              "albert": ("AlbertConfig", "AlbertForPreTraining"),
              "deberta-v2": ("DebertaV2Config", "DebertaV2ForMaskedLM"),
              "electra": ("ElectraConfig", "ElectraForPreTraining"),
              "xlnet": ("XLNetConfig", "XLNetLMHeadModel")}

# encoderx model field -> the name of the same field in Hugging Face configs.
HF_FIELD_NAMES = dict(
    vocab_size="vocab_size", hidden_size="hidden_size", num_layers="num_hidden_layers",
    num_heads="num_attention_heads", intermediate_size="intermediate_size",
    hidden_act="hidden_act", max_position_embeddings="max_position_embeddings",
    type_vocab_size="type_vocab_size", hidden_dropout="hidden_dropout_prob",
    attention_dropout="attention_probs_dropout_prob", layer_norm_eps="layer_norm_eps",
    initializer_range="initializer_range")
# XLNet's config names them differently, has one dropout rate and no token types or
# absolute positions.
XLNET_FIELD_NAMES = dict(
    vocab_size="vocab_size", hidden_size="d_model", num_layers="n_layer",
    num_heads="n_head", intermediate_size="d_inner", hidden_act="ff_activation",
    hidden_dropout="dropout", layer_norm_eps="layer_norm_eps",
    initializer_range="initializer_range", clamp_len="clamp_len")
# The encoderx fields of every XLNet (what XLNET_FIELD_NAMES does not cover).
XLNET_MODEL = dict(attention="two_stream_relative", position_embedding="none",
                   type_vocab_size=0, embedding_layer_norm=False)


def hf_config(config: common.ModelConfig, family: str = "bert", **overrides):
  """The family's `transformers` config with the sizes of an encoderx ModelConfig.

  RoBERTa numbers positions from its padding id + 1, so its pad_token_id is
  position_offset - 1; ALBERT shares its layers in one group when layer_sharing='all';
  DeBERTa's relative attention fields come from the disentangled attention's; ALBERT and
  ELECTRA name their embedding width. ELECTRA's generator is ElectraForMaskedLM of its own
  config (the generator's sizes). XLNet names its fields its own way (XLNET_FIELD_NAMES).
  """
  import transformers  # pylint: disable=g-import-not-at-top
  names = XLNET_FIELD_NAMES if family == "xlnet" else HF_FIELD_NAMES
  fields = {hf_name: getattr(config, name) for name, hf_name in names.items()}
  if family == "xlnet":
    # untie_r: every layer has its own r_w / r_r / r_s biases (XLNet's released models).
    fields.update(d_head=config.head_dim, attn_type="bi", untie_r=True, bi_data=False,
                  mem_len=None, reuse_len=None)
  elif family == "roberta":
    fields.update(pad_token_id=config.position_offset - 1, bos_token_id=0, eos_token_id=2)
  elif family == "albert":
    fields.update(embedding_size=config.embedding_size, num_hidden_groups=(
        1 if config.layer_sharing == "all" else config.num_layers))
  elif family == "deberta-v2":
    fields.update(_deberta_hf_fields(config))
  elif family == "electra":
    fields.update(embedding_size=config.embedding_size)
  fields.update(overrides)
  return getattr(transformers, HF_CLASSES[family][0])(**fields)


def model_fields(hf_config_dict: Mapping[str, object]) -> tuple[str, dict]:
  """(family, encoderx model fields) of a Hugging Face config.json; the inverse of
  hf_config. Raises ValueError for what encoderx cannot represent."""
  family = hf_config_dict.get("model_type")
  if family not in HF_CLASSES:
    raise ValueError(f"model_type {family!r} has no conversion rules here; known: "
                     f"{', '.join(HF_CLASSES)}.")
  if family == "xlnet":
    return family, _xlnet_model_fields(hf_config_dict)
  fields = {name: hf_config_dict[hf_name] for name, hf_name in HF_FIELD_NAMES.items()
            if hf_name in hf_config_dict}
  position_type = hf_config_dict.get("position_embedding_type", "absolute")
  if position_type != "absolute":
    raise ValueError(f"position_embedding_type {position_type!r} is not supported "
                     "(only 'absolute').")
  if family == "roberta":
    fields["position_offset"] = int(hf_config_dict.get("pad_token_id", 1)) + 1
  elif family == "albert":
    groups = hf_config_dict.get("num_hidden_groups", 1)
    if hf_config_dict.get("inner_group_num", 1) != 1 or groups not in (
        1, hf_config_dict["num_hidden_layers"]):
      raise ValueError("ALBERT with inner_group_num != 1 or num_hidden_groups other "
                       "than 1 or num_hidden_layers is not supported.")
    fields["embedding_size"] = hf_config_dict["embedding_size"]
    fields["layer_sharing"] = "all" if groups == 1 else "none"
  elif family == "deberta-v2":
    fields.update(_deberta_model_fields(hf_config_dict))
  elif family == "electra":
    fields["embedding_size"] = hf_config_dict.get("embedding_size",
                                                  hf_config_dict["hidden_size"])
  return family, fields


def _deberta_hf_fields(config: common.ModelConfig) -> dict:
  """DebertaV2Config's fields for an encoderx model (see _deberta_model_fields)."""
  relative = config.attention == "disentangled"
  return dict(relative_attention=relative, pos_att_type=list(config.relative_attention_terms),
              position_buckets=config.position_buckets or -1,
              max_relative_positions=config.max_relative_positions,
              share_att_key=config.share_att_key,
              norm_rel_ebd="layer_norm" if relative else "none",
              position_biased_input=config.position_embedding == "absolute",
              legacy=False)  # the MLM head named as DeBERTa's checkpoints name it


def _deberta_model_fields(hf_config_dict: Mapping[str, object]) -> dict:
  """encoderx fields of a DebertaV2Config: disentangled attention when
  relative_attention (BERT's attention otherwise), absolute positions in the input when
  position_biased_input; no enhanced mask decoder (Hugging Face's models have none)."""
  get = hf_config_dict.get
  if get("conv_kernel_size", 0):
    raise ValueError("DeBERTa's convolution layer (conv_kernel_size, DeBERTa-v2 xlarge "
                     "and larger) is not supported.")
  hidden, heads = hf_config_dict["hidden_size"], hf_config_dict["num_attention_heads"]
  if get("embedding_size", hidden) != hidden:
    raise ValueError("DeBERTa with embedding_size != hidden_size is not supported.")
  if get("attention_head_size", hidden // heads) != hidden // heads:
    raise ValueError("attention_head_size must be hidden_size / num_attention_heads.")
  terms = get("pos_att_type") or ()
  terms = [t.strip() for t in (terms.lower().split("|") if isinstance(terms, str)
                               else terms)]
  if set(terms) - {"c2p", "p2c"}:
    raise ValueError(f"pos_att_type {terms}: only 'c2p' and 'p2c' are supported.")
  fields = dict(position_embedding="absolute" if get("position_biased_input", True)
                else "none", attention="standard", type_vocab_size=get("type_vocab_size", 0),
                layer_norm_eps=get("layer_norm_eps", 1e-7), enhanced_mask_decoder=False)
  if get("relative_attention", False):
    norm = [n.strip() for n in str(get("norm_rel_ebd", "none")).lower().split("|")]
    if "layer_norm" not in norm:
      raise ValueError("relative attention without norm_rel_ebd='layer_norm' (DeBERTa "
                       "v1's) is not supported.")
    max_relative = get("max_relative_positions", -1)
    fields.update(
        attention="disentangled",
        relative_attention_terms=tuple(t for t in ("c2p", "p2c") if t in terms),
        position_buckets=max(get("position_buckets", -1), 0),
        max_relative_positions=(max_relative if max_relative >= 1
                                else hf_config_dict["max_position_embeddings"]),
        share_att_key=bool(get("share_att_key", False)))
  return fields


def _xlnet_model_fields(hf_config_dict: Mapping[str, object]) -> dict:
  if hf_config_dict.get("attn_type", "bi") != "bi":
    raise ValueError("XLNet with attn_type 'uni' (Transformer-XL's causal attention) is "
                     "not supported; encoderx's XLNet attends bidirectionally ('bi').")
  d_head = hf_config_dict.get("d_head")
  if d_head is not None and d_head * hf_config_dict["n_head"] != hf_config_dict["d_model"]:
    raise ValueError(f"XLNet with d_head={d_head} and n_head={hf_config_dict['n_head']} "
                     f"(not d_model={hf_config_dict['d_model']}) is not supported.")
  fields = {name: hf_config_dict[hf_name] for name, hf_name in XLNET_FIELD_NAMES.items()
            if hf_name in hf_config_dict}
  fields["attention_dropout"] = fields.get("hidden_dropout", 0.1)
  return {**fields, **XLNET_MODEL}


def hf_pretraining_model(config: common.ModelConfig, family: str = "bert", **overrides):
  """A freshly initialized PyTorch pretraining model of the family with these sizes."""
  import transformers  # pylint: disable=g-import-not-at-top
  return getattr(transformers, HF_CLASSES[family][1])(hf_config(config, family, **overrides))


def _numpy(value) -> np.ndarray:
  if hasattr(value, "detach"):  # a torch tensor
    value = value.detach().cpu().float().numpy()
  return np.asarray(value)


def from_hf(state_dict: Mapping[str, object], config: common.ModelConfig,
            family: str = "bert", expected=None, rules=None) -> dict:
  """HF state dict -> encoderx params (nested dict of numpy arrays).

  `family` picks the rule table (RULES); `rules` replaces it (e.g. `bert_rules(config,
  prefix='')` for a BertModel). Only rules whose HF name is present are used, so a
  model without a head converts to params without it. `expected` (an encoderx param
  tree, e.g. from `jax.eval_shape(model.init, ...)`) makes every missing or misshapen
  weight an error.
  """
  rules = rules if rules is not None else rules_for(family, config)
  flat = {}
  for hf_name, path, transform in rules:
    if hf_name in state_dict:
      flat[tuple(path.split("/"))] = transform.to_flax(_numpy(state_dict[hf_name]), config)
  params = flax.traverse_util.unflatten_dict(flat)
  if config.scan_layers:
    params = stack_layers(params)
  if expected is not None:
    check_tree(params, expected)
  return params


def to_hf(params, config: common.ModelConfig, family: str = "bert",
          rules=None) -> dict[str, np.ndarray]:
  """encoderx params -> HF state dict (numpy arrays); inverse of `from_hf`."""
  rules = rules if rules is not None else rules_for(family, config)
  params = nn.unbox(params)
  if config.scan_layers:
    params = unstack_layers(params, config.num_layers)
  flat = flax.traverse_util.flatten_dict(jax.device_get(params))
  state_dict, written = {}, set()
  for hf_name, path, transform in rules:
    key = tuple(path.split("/"))
    if key in flat and key not in written:  # a parameter's first name in the rules wins
      state_dict[hf_name] = transform.to_hf(np.asarray(flat[key], np.float32), config)
      written.add(key)
  return state_dict


_LAYER = re.compile(r"^layer_(\d+)$")


def stack_layers(params: dict) -> dict:
  """Per-layer params (layer_0, layer_1, ...) -> the nn.scan layout (layers/layer); the
  encoder's other parameters (e.g. DeBERTa's relative table) stay as they are."""
  encoder = params["encoder_model"]["encoder"]
  layers = sorted((int(_LAYER.match(k).group(1)), v) for k, v in encoder.items()
                  if _LAYER.match(k))
  stacked = jax.tree_util.tree_map(lambda *xs: np.stack(xs), *[v for _, v in layers])
  others = {k: v for k, v in encoder.items() if not _LAYER.match(k)}
  return {**params, "encoder_model": {**params["encoder_model"],
                                      "encoder": {**others, "layers": {"layer": stacked}}}}


def unstack_layers(params: dict, num_layers: int) -> dict:
  encoder = params["encoder_model"]["encoder"]
  layers = {f"layer_{i}": jax.tree_util.tree_map(lambda x, i=i: x[i], encoder["layers"]["layer"])
            for i in range(num_layers)}
  others = {k: v for k, v in encoder.items() if k != "layers"}
  return {**params, "encoder_model": {**params["encoder_model"],
                                      "encoder": {**others, **layers}}}


def check_tree(params, expected) -> None:
  """Raises ValueError listing missing, unexpected and misshapen parameters."""
  got = {k: np.shape(v) for k, v in flax.traverse_util.flatten_dict(params).items()}
  want = {k: tuple(v.shape) for k, v in
          flax.traverse_util.flatten_dict(nn.unbox(expected)).items()}
  problems = [f"missing {'/'.join(k)}" for k in want.keys() - got.keys()]
  problems += [f"unexpected {'/'.join(k)}" for k in got.keys() - want.keys()]
  problems += [f"{'/'.join(k)}: shape {got[k]} != {want[k]}"
               for k in want.keys() & got.keys() if got[k] != want[k]]
  if problems:
    raise ValueError("converted weights do not fit the model: " + "; ".join(sorted(problems)))

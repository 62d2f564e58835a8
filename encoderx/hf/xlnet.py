"""XLNet (zihangdai/xlnet; transformers models/xlnet/modeling_xlnet.py): two-stream
relative attention, its own config field names, and the PLM head's query-stream start
(`mask_emb`), which Hugging Face keeps in the encoder."""
from __future__ import annotations

from typing import Mapping

from encoderx.hf import base, rules
from encoderx.models import model_config

# XLNet stores its output projection as [hidden, heads, dim]; ours is [heads, dim, hidden].
HEADS_OUT = base.Transform(lambda x, c: x.transpose(1, 2, 0),
                           lambda x, c: x.transpose(2, 0, 1))
MASK_EMB = base.Transform(lambda x, c: x.reshape(-1),  # [1, 1, hidden] -> [hidden]
                          lambda x, c: x.reshape(1, 1, -1))


def encoder(config: model_config.ModelConfig, hf: str) -> list[base.Rule]:
  """The word embedding and, per layer, the relative attention (q, k, v, o, r kernels
  [hidden, heads, dim], no biases; the r_w / r_r / r_s biases and seg_embed of every
  layer: untie_r) with its LayerNorm, and the feed-forward."""
  encoder_rules = [(f"{hf}word_embedding.weight",
                    "encoder_model/embeddings/word_embeddings/embedding", rules.COPY)]
  for i in range(config.num_layers):
    layer, flax_layer = f"{hf}layer.{i}", f"encoder_model/encoder/layer_{i}"
    attention = f"{flax_layer}/attention/self_attention"
    encoder_rules += [(f"{layer}.rel_attn.{name}", f"{attention}/{ours}/kernel", rules.COPY)
                      for name, ours in (("q", "query"), ("k", "key"), ("v", "value"),
                                         ("r", "relative"))]
    encoder_rules += [(f"{layer}.rel_attn.o", f"{attention}/out/kernel", HEADS_OUT)]
    encoder_rules += [(f"{layer}.rel_attn.{name}", f"{attention}/{name}", rules.COPY)
                      for name in ("r_w_bias", "r_r_bias", "r_s_bias", "seg_embed")]
    encoder_rules += (
        rules.layer_norm(f"{layer}.rel_attn.layer_norm", f"{flax_layer}/attention/layer_norm")
        + rules.dense(f"{layer}.ff.layer_1", f"{flax_layer}/ffn/intermediate")
        + rules.dense(f"{layer}.ff.layer_2", f"{flax_layer}/ffn/output")
        + rules.layer_norm(f"{layer}.ff.layer_norm", f"{flax_layer}/ffn/layer_norm"))
  return encoder_rules


# XLNet's config names its fields its own way, has one dropout rate and no token types or
# absolute positions.
FIELD_NAMES = {
    "vocab_size": "vocab_size",
    "hidden_size": "d_model",
    "num_layers": "n_layer",
    "num_heads": "n_head",
    "intermediate_size": "d_inner",
    "hidden_act": "ff_activation",
    "hidden_dropout": "dropout",
    "norm.eps": "layer_norm_eps",
    "init.range": "initializer_range",
    "attention.clamp_len": "clamp_len"}
# The encoderx fields of every XLNet (what FIELD_NAMES does not cover).
MODEL = {
    "attention.variant": "two_stream_relative",
    "embeddings.position": "none",
    "embeddings.type_vocab_size": 0,
    "embeddings.layer_norm": False}


def _check(config: model_config.ModelConfig) -> None:
  differ = {name: config.field(name) for name, value in MODEL.items()
            if config.field(name) != value}
  if differ or config.layout.sharing != "none":
    raise base.ConversionError(
        f"model fields {differ or {'layout.sharing': config.layout.sharing}}"
        f" have no Hugging Face XLNet equivalent (it has {MODEL}, distinct layers).")


def _model_fields(hf_config: Mapping) -> dict:
  if hf_config.get("attn_type", "bi") != "bi":
    raise base.ConversionError("XLNet with attn_type 'uni' (Transformer-XL's causal "
                               "attention) is not supported; encoderx's XLNet attends "
                               "bidirectionally.")
  d_head = hf_config.get("d_head")
  if d_head is not None and d_head * hf_config["n_head"] != hf_config["d_model"]:
    raise base.ConversionError(f"XLNet with d_head={d_head} and n_head="
                               f"{hf_config['n_head']} (not d_model="
                               f"{hf_config['d_model']}) is not supported.")
  if not hf_config.get("untie_r", True):
    raise base.ConversionError("XLNet with untie_r=False (one set of attention biases for "
                               "all layers) is not supported.")
  return {"attention.dropout": hf_config.get("dropout", 0.1), **MODEL}


# mask_emb (the query stream's start) sits in the encoder of Hugging Face's classes and
# in the PLM head here; lm_loss's weight is tied to the word embedding.
FAMILY = base.Family(
    name="xlnet", config_class="XLNetConfig", prefix="transformer", encoder=encoder,
    pooler="", tokenizer_class="XLNetTokenizer", vocab_kind="sentencepiece",
    vocab_layout="albert", field_names=FIELD_NAMES,
    heads={
        "pretraining": base.Head("XLNetLMHeadModel", lambda config: [
            ("transformer.mask_emb", "plm_head/mask_emb", MASK_EMB),
            ("lm_loss.bias", "plm_head/output_bias", rules.COPY)], pooler=False,
                                 tied=("lm_loss.weight",)),
        "base": base.Head("XLNetModel", lambda config: [
            ("mask_emb", "plm_head/mask_emb", MASK_EMB)], base_prefix=False,
                          pooler=False),
    },
    # untie_r: every layer has its own r_w / r_r / r_s biases (XLNet's released models).
    hf_fields=lambda config: dict(d_head=config.head_dim, attn_type="bi", untie_r=True,
                                  bi_data=False, mem_len=None, reuse_len=None),
    model_fields=_model_fields, check=_check)

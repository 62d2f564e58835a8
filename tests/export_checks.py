"""What every family's export and import must do; tests/test_export.py runs it per family.

A family (encoderx/hf/) adds a `FamilyCase` to CASES here: the checks then run
for it. Each check is a plain function, to be reused by a family's own tests too:

  check_hf_round_trip(case, tmp_path)   every class of the family: HF weights saved by
                                        transformers -> import -> export: byte-identical,
                                        the class found from the weights (and
                                        config.json's architectures), nothing unused;
                                        --init_from's reading (safetensors and
                                        pytorch_model.bin) gives the same parameters
  make_run(config, workdir)             a run directory (config.json and a checkpoint)
                                        with perturbed random parameters
  check_export_parity(workdir, output)  export -> AutoModel and the family's class load it
                                        -> the same outputs as encoderx on padded batches
  check_tokenizer(output, vocabulary, lines)  AutoTokenizer gives encoderx's ids
  check_special_token_ids(output)       config.json's special-token ids are the
                                        tokenizer's beside it
"""
from __future__ import annotations

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers

from encoderx import checkpoint as checkpoint_lib
from encoderx import files as files_lib
from encoderx.train import trainer as trainer_lib
from encoderx.export import writer
from encoderx.hf import engine, families
from encoderx.hf import eurobert as hf_eurobert
from encoderx.hf import modernbert as hf_modernbert
from encoderx.hf import directory as hf_directory
from encoderx.models import pretraining

from reference_models import (  # pylint: disable=g-bad-import-order  (tests/ is on sys.path)
    mlm_logits, padded_batch, perturb, small_model)

ATOL = 1e-4


@dataclasses.dataclass(frozen=True)
class FamilyCase:
  """One family under test. `model`: changes to reference_models.SMALL (model fields by
  path, 'attention.window') that make it a
  model of the family; `config`: the configs/ module whose shrunk copy (conftest's
  tiny_config) is the family's run; `refused`: model changes the family's classes cannot
  represent, and a regex of the error; `run`: model changes to the configs/ module's run
  that make it exportable (DeBERTa's without the enhanced mask decoder); `flax_model`:
  the method's model that computes what the exported class does (ELECTRA's
  discriminator; None: the class's logits are the LM head's on the content stream, as
  XLNetLMHeadModel's without a target mapping)."""
  name: str
  family: str
  config: str
  model: dict
  refused: dict
  refused_match: str
  run: dict = dataclasses.field(default_factory=dict)
  flax_model: str | None = "model"


CASES = [
    FamilyCase("bert", "bert", "bert:tiny", {}, {"layout.sharing": "all"},
               r"layout.sharing='all' has no Hugging Face BERT equivalent"),
    # SpanBERT is a BERT without NSP: it exports as BertForMaskedLM, its SBO head left out.
    FamilyCase("spanbert", "bert", "spanbert:tiny", {}, {"embeddings.size": 16},
               r"embeddings.size=16 != hidden_size"),
    FamilyCase("roberta", "roberta", "roberta:tiny",
               {"embeddings.position_offset": 2, "embeddings.type_vocab_size": 1,
                "norm.eps": 1e-5, "embeddings.max_positions": 42},
               {"layout.sharing": "ffn"}, r"layout.sharing='ffn' has no Hugging Face RoBERTa"),
    FamilyCase("albert", "albert", "albert:tiny",
               {"embeddings.size": 16, "layout.sharing": "all", "hidden_act": "gelu_new"},
               {"layout.sharing": "attention"},
               r"layout.sharing='attention' has no Hugging Face ALBERT equivalent"),
    # DeBERTa v2/v3 (tests/test_deberta.py's sizes): disentangled attention in log
    # buckets, no absolute positions, no token types. Hugging Face has no enhanced mask
    # decoder: the run exported is deberta_tiny without it.
    FamilyCase("deberta-v2", "deberta-v2", "deberta:tiny",
               {"attention.variant": "disentangled", "embeddings.position": "none",
                "embeddings.type_vocab_size": 0, "norm.eps": 1e-7,
                "attention.position_buckets": 8, "attention.max_relative_positions": 24,
                "embeddings.max_positions": 64, "attention.share_att_key": False},
               {"embeddings.size": 16}, r"embeddings.size=16 != hidden_size: Hugging Face "
               r"DeBERTa", run={"heads.enhanced_mask_decoder": False}),
    # ELECTRA's discriminator (the electra method's run), embeddings projected to the
    # hidden size; the generator's class (ElectraForMaskedLM) in the round trip.
    FamilyCase("electra", "electra", "electra:tiny",
               {"embeddings.size": 32, "heads.pooler_act": "gelu"},
               {"layout.sharing": "all"}, r"layout.sharing='all' has no Hugging Face ELECTRA",
               flax_model="discriminator"),
    # XLNet: relative two-stream attention, segments in the attention only; the export
    # parity compares the content stream (the query stream's is tests/test_xlnet.py's).
    FamilyCase("xlnet", "xlnet", "xlnet:tiny",
               {"attention.variant": "two_stream_relative", "embeddings.position": "none",
                "embeddings.type_vocab_size": 0, "embeddings.layer_norm": False,
                "embeddings.max_positions": 0},
               {"layout.sharing": "all"}, r"have no Hugging Face XLNet equivalent",
               flax_model=None),
    # ModernBERT (tests/test_modernbert.py's model): rotary positions with a theta per
    # layer kind, a local window of 8 in every second layer, pre-norm, GeGLU, every bias on.
    FamilyCase("modernbert", "modernbert", "modernbert:tiny", {
        "family": "modernbert", **hf_modernbert.MODEL, "heads.pooler_act": "gelu",
        "attention.window": 8, "attention.global_every": 2,
        "embeddings.rope_theta": 160_000.0, "embeddings.local_rope_theta": 10_000.0,
        "init.scheme": "megatron", "attention.bias": True, "feed_forward.bias": True,
        "norm.bias": True, "heads.classifier_bias": True},
        {"norm.kind": "rms_norm"}, r"\{'norm.kind': 'rms_norm'"),
    # EuroBERT (tests/test_eurobert.py's): RMSNorm, grouped-query attention, SwiGLU, no
    # biases, an untied decoder.
    FamilyCase("eurobert", "eurobert", "eurobert:tiny", {
        "family": "eurobert", **hf_eurobert.MODEL, "attention.num_kv_heads": 2,
        "embeddings.rope_theta": 250_000.0, "init.cutoff": 0.0,
        "heads.tie_word_embeddings": False, "attention.bias": False,
        "feed_forward.bias": False, "heads.decoder_bias": False},
        {"attention.window": 8}, r"\{'attention.window': 8\} have no Hugging Face EuroBERT"),
]


def case_named(name: str) -> FamilyCase:
  return next(case for case in CASES if case.name == name)


def perturbed(model: torch.nn.Module) -> torch.nn.Module:
  """Biases and norms moved off Hugging Face's 0 and 1, which hide mix-ups."""
  return perturb(model)


def check_hf_round_trip(case: FamilyCase, directory) -> None:
  config = small_model().with_fields(case.model)
  fam = families.family_named(case.family)
  for head, spec in fam.heads.items():
    torch.manual_seed(1)
    model = perturbed(engine.hf_model(config, case.family, head,
                                      **({"num_labels": 3} if spec.labels else {})))
    saved = os.path.join(directory, head)
    model.save_pretrained(saved)
    state_dict = hf_directory.read_state_dict(saved)
    # The class from the weights; config.json's architectures breaks ties, as
    # --init_from reads it (ModernBERT's task classes hold the same names).
    params, found, unused = engine.import_state_dict(
        state_dict, config, case.family,
        prefer=engine.head_of_class(case.family, hf_directory.architecture(saved)))
    assert (found, unused) == (head, []), (spec.hf_class, found, unused)
    back = engine.to_hf(params, config, case.family, head)
    assert set(back) == {n for n in state_dict if not engine.is_buffer(n)} - set(spec.tied_names(config)), (
        spec.hf_class, set(back) ^ set(state_dict))
    for name, value in back.items():
      assert value.dtype == state_dict[name].dtype and value.tobytes() == state_dict[
          name].tobytes(), (spec.hf_class, name)
    # --init_from=hf: reads the same directory to the same parameters.
    converted, unused = hf_directory.convert(state_dict, config, case.family,
                                             hf_directory.architecture(saved))
    assert not unused
    jax.tree_util.tree_map(np.testing.assert_array_equal, converted, params)
    if head == next(iter(fam.heads)):  # PyTorch's own format reads the same
      saved_bin = os.path.join(directory, f"{head}-bin")  # as older releases ship
      os.makedirs(saved_bin)
      torch.save(model.state_dict(), os.path.join(saved_bin, "pytorch_model.bin"))
      converted, unused = hf_directory.convert(hf_directory.read_state_dict(saved_bin),
                                               config, case.family)
      assert not unused
      jax.tree_util.tree_map(np.testing.assert_array_equal, converted, params)


def _perturb(params, seed: int = 0):
  """Every parameter + N(0, 0.1): biases and LayerNorm scales off 0 and 1."""
  leaves, tree = jax.tree_util.tree_flatten(params)
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_unflatten(tree, [
      np.asarray(x) + rng.normal(0, 0.1, np.shape(x)).astype(np.float32) for x in leaves])


def make_run(config, workdir: str, step: int = 3, params=None):
  """A run directory as train.run writes one (config.json, a checkpoint of `step`) with
  `params`, or initialized parameters perturbed; returns (the trainer's method, params)."""
  trainer = trainer_lib.Trainer(config, devices=jax.devices()[:1])
  if params is None:
    params = _perturb(jax.device_get(trainer.init_params()))
  state = trainer.init_state(params)
  os.makedirs(workdir, exist_ok=True)
  files_lib.write_atomically(os.path.join(workdir, "config.json"),
                             config.to_json_best_effort(indent=2))
  checkpoints = checkpoint_lib.Checkpoints(os.path.join(workdir, "checkpoints"),
                                           async_save=False)
  checkpoints.save(step, state, {"phase": 0}, trainer.describe())
  checkpoints.close()
  return trainer.method, params


def _hf_outputs(model, batch):
  with torch.no_grad():
    arguments = dict(input_ids=torch.tensor(batch["input_ids"], dtype=torch.long),
                     attention_mask=torch.tensor(batch["segment_ids"], dtype=torch.long))
    # XLNet (no type_vocab_size) takes segments into its attention.
    if getattr(model.config, "type_vocab_size", 2) > 1:
      arguments["token_type_ids"] = torch.tensor(batch["token_type_ids"], dtype=torch.long)
    return model(**arguments)


def check_export_parity(method, params, exported: writer.Exported, pad_id: int,
                        flax_model: str = "model") -> dict:
  """The exported directory, loaded by AutoModel and by its class, computes what encoderx
  computes (fp32, ATOL) on a padded batch; returns the max abs differences. `params`:
  the method's transferable ones; `flax_model`: the method's model that computes them."""
  model_config = method.model_config
  real, batch = padded_batch(model_config.vocab_size, pad_id=pad_id, two_segments=(
      model_config.embeddings.type_vocab_size > 1 or model_config.family == "xlnet"))
  batch = {k: jnp.asarray(v) for k, v in batch.items()}
  encoder = pretraining.EncoderModel(model_config, with_pooler=False)
  # Under jit: eagerly, each of the model's operations would compile on its own.
  hidden = np.asarray(jax.jit(encoder.apply)({"params": {
      k: v for k, v in params["encoder_model"].items() if k != "pooler"}}, batch)["hidden"])
  base = transformers.AutoModel.from_pretrained(exported.output).eval()
  diffs = {"hidden": np.abs(_hf_outputs(base, batch).last_hidden_state.numpy()[real]
                            - hidden[real]).max()}
  if exported.hf_class.endswith("Model"):  # the bare encoder: its hidden states are all
    assert diffs["hidden"] <= ATOL, diffs
    return diffs
  full = getattr(transformers, exported.hf_class).from_pretrained(exported.output).eval()
  theirs = _hf_outputs(full, batch)
  vocab = model_config.vocab_size  # scores of the real rows (none of the padding's)
  if flax_model is None:  # the LM head on the content stream, its weights tied
    embedding = params["encoder_model"]["embeddings"]["word_embeddings"]["embedding"]
    ours = {"lm_logits": hidden @ np.asarray(embedding).T + params["plm_head"]["output_bias"]}
  else:
    ours = jax.jit(getattr(method, flax_model).apply)({"params": params}, batch)
  if isinstance(ours, dict) and "lm_logits" in ours:
    diffs["lm"] = np.abs(theirs.logits.numpy()[real] - ours["lm_logits"][real][:, :vocab]
                         ).max()
  elif isinstance(ours, dict) and "rtd_logits" in ours:  # ELECTRA's discriminator
    diffs["rtd"] = np.abs(theirs.logits.numpy()[real] - np.asarray(ours["rtd_logits"])[real]
                          ).max()
  elif isinstance(ours, dict):  # a pretraining model
    diffs["mlm"] = np.abs(mlm_logits(theirs)[real]
                          - np.asarray(ours["mlm_logits"])[real][:, :vocab]).max()
    sentence = getattr(theirs, "seq_relationship_logits", getattr(theirs, "sop_logits", None))
    if "sentence_logits" in ours:
      diffs["sentence"] = np.abs(sentence.numpy() - np.asarray(ours["sentence_logits"])).max()
  elif isinstance(ours, tuple):  # extractive QA's start and end logits
    diffs["span"] = max(np.abs(getattr(theirs, f"{end}_logits").numpy()[real]
                               - np.asarray(mine)[real]).max()
                        for end, mine in zip(("start", "end"), ours))
  elif np.ndim(ours) == 3:  # a tagger's logits per token
    diffs["tags"] = np.abs(theirs.logits.numpy()[real] - np.asarray(ours)[real]).max()
  else:  # a classifier's logits
    diffs["logits"] = np.abs(theirs.logits.numpy() - np.asarray(ours)).max()
  assert max(diffs.values()) <= ATOL, diffs
  return diffs


def check_tokenizer(directory: str, vocabulary, lines: list[str]) -> None:
  """AutoTokenizer on the exported directory gives encoderx's ids, special tokens too."""
  tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
  ours = [vocabulary.encode(line) for line in lines]
  theirs = [tokenizer.encode(line, add_special_tokens=False) for line in lines]
  mismatches = [(line, a, b) for line, a, b in zip(lines, ours, theirs) if a != b]
  assert not mismatches, mismatches[:2]
  assert sum(map(len, ours)) > 1000
  special = ([vocabulary.sep_id, vocabulary.cls_id] if tokenizer.padding_side == "left"
             else [])  # XLNet's layout: A [SEP] [CLS], padded on the left
  assert tokenizer(lines[0])["input_ids"] == (
      ours[0] + special if special else [vocabulary.cls_id] + ours[0] + [vocabulary.sep_id])
  assert (tokenizer.pad_token_id, tokenizer.mask_token_id) == (vocabulary.pad_id,
                                                              vocabulary.mask_id)
  path = os.path.join(directory, "special_tokens_map.json")
  if not os.path.isfile(path):  # encoderx writes one; transformers 5's save_pretrained not
    return
  with open(path, encoding="utf-8") as f:
    special = json.load(f)
  if "cls_token" in special:
    assert special["cls_token"] == tokenizer.cls_token
  else:  # EuroBERT's (Llama 3's) names: the sequence starts with bos
    assert special["bos_token"] == tokenizer.bos_token == vocabulary.id_to_token(
        vocabulary.cls_id)


def check_special_token_ids(directory: str) -> None:
  """Every special-token id of config.json (pad_token_id, bos_token_id, ...) is the id
  of that token in the tokenizer saved beside it (None where it has none), inside the
  vocabulary: not the released model's, of which transformers warns on every load."""
  with open(os.path.join(directory, "config.json"), encoding="utf-8") as f:
    config = json.load(f)
  tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
  ids = {name: value for name, value in config.items() if name.endswith("_token_id")}
  assert "pad_token_id" in ids, config
  wrong = {name: (value, getattr(tokenizer, name)) for name, value in ids.items()
           if value != getattr(tokenizer, name)}
  assert not wrong, f"config.json's id, the tokenizer's: {wrong}"
  outside = {name: value for name, value in ids.items()
             if value is not None and not 0 <= value < config["vocab_size"]}
  assert not outside, (outside, config["vocab_size"])

"""EuroBERT: the encoder with EuroBERT's fields (RMSNorm pre-norm, grouped-query
attention, SwiGLU, rotary theta 250,000, no biases, untied decoder) against Hugging
Face's EuroBertForMaskedLM (logits and every hidden state) on padded batches and packed
documents; its task classes; conversion both ways; scan == loop; a train step; the
init's statistics; the one-line errors; and the new fields on a post-norm BERT.

The models are Hugging Face's own tiny configs (EuroBertConfig), read into encoderx
fields as --init_from reads a config.json (engine.model_fields)."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from encoderx import config as config_lib
from encoderx import errors
from encoderx.hf import base as hf_base
from encoderx.hf import engine
from encoderx.hf import eurobert as hf_eurobert
from encoderx.models import encoder as encoder_lib
from encoderx.models import attention, finetuning, masks, model_config, pretraining

import export_checks  # pylint: disable=g-bad-import-order  (tests/ is on sys.path)
from reference_models import (  # pylint: disable=g-bad-import-order
    check_init_statistics, fresh_params, hf_forward, max_diffs, mlm_and_hidden_states,
    mlm_train_step_gradients, model_config_from_hf, packed_batch, packed_diffs,
    padded_batch, perturb, small_model)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

FAMILY = "eurobert"
ATOL = 1e-4
VOCAB = 99
# Four query heads sharing two key-value heads; EuroBERT-210m's theta.
TINY = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
            initializer_range=0.2, rope_theta=250_000.0, pad_token_id=0, bos_token_id=1,
            eos_token_id=2, mask_token_id=3)
BIASES = dict(attention_bias=True, mlp_bias=True)


def hf_config(attn_implementation="eager", **changes):
  return transformers.EuroBertConfig(**{**TINY, **changes},
                                     attn_implementation=attn_implementation)


def reference(hf_class="EuroBertForMaskedLM", seed=0, **changes):
  """(Hugging Face model of `hf_class`, perturbed, eval; its encoderx ModelConfig)."""
  config = hf_config(**changes)
  torch.manual_seed(seed)
  model = perturb(getattr(transformers, hf_class)(config))
  return model, model_config_from_hf(config)


def converted(model, config, head=None):
  return engine.from_hf(model.state_dict(), config, FAMILY, head=head)


# --- parity with EuroBertForMaskedLM -------------------------------------------------------
@pytest.mark.parametrize("changes, scan", [
    ({}, False), ({**BIASES, "num_key_value_heads": 4}, True),
    (dict(num_key_value_heads=1, attn_implementation="sdpa"), False),
    (dict(tie_word_embeddings=True), False)],
    ids=["gqa-2", "mha-biases-scanned", "mqa-sdpa", "tied"])
def test_mlm_logits_and_hidden_states_match_on_padded_batches(changes, scan):
  torch_model, config = reference(**changes)
  config = config.replace(layout=dict(scan=scan))
  real, batch = padded_batch(VOCAB, two_segments=False)
  logits, hidden = mlm_and_hidden_states(config, converted(torch_model, config), batch)
  theirs = hf_forward(torch_model, batch["input_ids"], batch["segment_ids"])
  diffs = max_diffs(logits, hidden, theirs, real)
  print(f"EuroBertForMaskedLM padded {changes} scan={scan}: max abs {diffs}")
  assert max(diffs.values()) <= ATOL, diffs
  assert np.abs(theirs.logits.numpy()).max() > 1.0  # not trivially small


def test_packed_documents_equal_each_document_alone():
  torch_model, config = reference()
  documents, batch = packed_batch(VOCAB, rows=((12, 20, 7), (30, 9)), length=48)
  logits, hidden = mlm_and_hidden_states(config, converted(torch_model, config), batch)
  worst = packed_diffs(logits, hidden, documents, torch_model)
  print(f"EuroBertForMaskedLM packed documents alone: max abs {worst}")
  assert max(worst.values()) <= ATOL, worst


# --- the task classes ---------------------------------------------------------------------
@pytest.mark.parametrize("pooling", ["bos", "mean", "late"])
def test_sequence_classification_matches(pooling):
  torch_model, config = reference("EuroBertForSequenceClassification", num_labels=3,
                                  classifier_pooling=pooling)
  _, batch = padded_batch(VOCAB, two_segments=False)
  theirs = hf_forward(torch_model, batch["input_ids"], batch["segment_ids"])
  params = converted(torch_model, config, "sequence_classification")
  model = finetuning.SequenceClassifier(config, num_labels=3, pooling="pooler", dropout=0.0)
  diff = float(np.abs(np.asarray(model.apply({"params": params}, batch))
                      - theirs.logits.numpy()).max())
  print(f"EuroBertForSequenceClassification ({pooling}): max abs {diff:.2e}")
  assert diff <= ATOL


def test_token_classification_matches():
  torch_model, config = reference("EuroBertForTokenClassification", num_labels=3, **BIASES)
  real, batch = padded_batch(VOCAB, two_segments=False)
  theirs = hf_forward(torch_model, batch["input_ids"], batch["segment_ids"])
  params = converted(torch_model, config, "token_classification")
  tags = finetuning.TokenClassifier(config, num_labels=3, dropout=0.0)
  diff = float(np.abs(np.asarray(tags.apply({"params": params}, batch))[real]
                      - theirs.logits.numpy()[real]).max())
  print(f"EuroBertForTokenClassification: max abs {diff:.2e}")
  assert diff <= ATOL
  assert not hasattr(transformers, "EuroBertForQuestionAnswering")  # none to compare


# --- conversion -----------------------------------------------------------------------------
# The family's case of the export checks (its default model: tests/test_export.py runs
# its round trip, export and refusals); here the variant with biases and tied tables.
CASE = export_checks.case_named(FAMILY)


@pytest.mark.parametrize("changes", [{
    "heads.tie_word_embeddings": True, "attention.num_kv_heads": 0, "attention.bias": True,
    "feed_forward.bias": True, "heads.decoder_bias": True}], ids=["tied-mha-biases"])
def test_every_class_round_trips_byte_identical(changes, tmp_path):
  """EuroBertModel, ForMaskedLM, For{Sequence,Token}Classification saved by
  transformers -> encoderx -> identical bytes, the class recognized."""
  case = dataclasses.replace(CASE, model={**CASE.model, **changes})
  export_checks.check_hf_round_trip(case, tmp_path)


def test_hf_config_round_trips():
  config = small_model().with_fields(CASE.model)
  fields = engine.hf_config(config, FAMILY).to_dict()
  assert (fields["num_key_value_heads"], fields["rope_parameters"]["rope_theta"],
          fields["classifier_pooling"]) == (2, 250_000.0, "bos")
  _, back = engine.model_fields(fields)
  assert back["hidden_dropout"] == 0.0  # EuroBERT has no dropout but attention_dropout
  assert config.with_fields({**back, "hidden_dropout": 0.1}) == config
  # The released checkpoints' config.json: rope_theta and clf_pooling at the top.
  legacy = {k: v for k, v in fields.items() if k not in ("rope_parameters",
                                                         "classifier_pooling")}
  _, old = engine.model_fields({**legacy, "rope_theta": 250_000, "clf_pooling": "late"})
  assert (old["embeddings.rope_theta"], old["heads.pooling"]) == (250_000.0, "late")


# --- scan, training, init --------------------------------------------------------------------
def test_scanned_stack_equals_the_loop():
  torch_model, config = reference(**BIASES)
  params = converted(torch_model, config)
  scanned = config.replace(layout=dict(scan=True, remat=True))
  stacked = encoder_lib.stack_layers(params)
  assert set(stacked["encoder_model"]["encoder"]) == {"layers", "final_layer_norm"}
  real, batch = padded_batch(VOCAB, two_segments=False)
  loop, loop_hidden = mlm_and_hidden_states(config, params, batch)
  scan, scan_hidden = mlm_and_hidden_states(scanned, stacked, batch)
  np.testing.assert_allclose(scan[real], loop[real], atol=1e-5)
  for ours, theirs in zip(scan_hidden, loop_hidden, strict=True):
    np.testing.assert_allclose(ours[real], theirs[real], atol=1e-5)


@pytest.mark.parametrize("scan", [False, True])
def test_a_train_step_gives_finite_gradients_to_every_parameter(scan):
  _, config = reference(**BIASES)
  config = config.replace(hidden_dropout=0.1, attention=dict(dropout=0.1), layout=dict(scan=scan))
  _, batch = packed_batch(VOCAB, rows=((12, 20), (10, 9, 7)), length=32)
  value, grads = mlm_train_step_gradients(config, batch)
  assert np.isfinite(value)
  for path, grad in grads.items():
    assert np.isfinite(grad).all() and np.abs(grad).max() > 0, "/".join(path)


def test_initialization_statistics_equal_hugging_faces():
  """Per weight, encoderx's init has the standard deviation of Hugging Face's
  (PreTrainedModel._init_weights: N(0, initializer_range), not truncated; norms 1)."""
  sizes = dict(vocab_size=512, hidden_size=128, intermediate_size=192, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, initializer_range=0.02,
               num_labels=64)
  hf_cfg = hf_config(**sizes)
  config = model_config_from_hf(hf_cfg)
  for hf_class, head, model in (
      ("EuroBertForMaskedLM", "mlm", pretraining.PretrainingModel(config, heads=("mlm",))),
      ("EuroBertForSequenceClassification", "sequence_classification",
       finetuning.SequenceClassifier(config, num_labels=64, pooling="pooler"))):
    torch.manual_seed(0)
    theirs = {k: v.numpy() for k, v in getattr(transformers, hf_class)(hf_cfg)
              .state_dict().items()}
    params = fresh_params(model)
    ratios = check_init_statistics(engine.to_hf(params, config, FAMILY, head), theirs)
    print(f"{hf_class} init std ratios to Hugging Face's: "
          f"{min(ratios.values()):.3f}..{max(ratios.values()):.3f} over {len(ratios)} weights")


# --- errors ------------------------------------------------------------------------------------
def test_key_value_heads_that_do_not_divide_the_heads_are_refused():
  config = config_lib.default_config()
  config.model.attention.num_kv_heads = 5  # of 12 heads
  with pytest.raises(errors.ConfigError, match=r"^config field 'model.attention.num_kv_heads': 5: "
                     r"model.num_heads=12 must be a multiple of it"):
    config_lib.validate(config)
  config.model.update(attention=dict(num_kv_heads=4), norm=dict(kind="rms_norm"))
  with pytest.raises(errors.ConfigError, match=r"model.norm.bias'?: RMSNorm has no bias"):
    config_lib.validate(config)


def test_conversion_refuses_other_families_and_unrepresentable_configs():
  modernbert = transformers.ModernBertConfig(
      vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
      intermediate_size=48, pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1,
      sep_token_id=2).to_dict()
  with pytest.raises(hf_base.ConversionError, match=r"model_type 'modernbert' is not a EuroBERT's"):
    hf_eurobert.model_fields(modernbert)
  with pytest.raises(hf_base.ConversionError, match=r"head_dim 16 != hidden_size / "):
    engine.model_fields({**hf_config().to_dict(), "head_dim": 16})
  _, config = reference()
  with pytest.raises(hf_base.ConversionError, match=r"heads.decoder_bias=True != mlp_bias=False"):
    engine.to_hf({}, config.replace(heads=dict(decoder_bias=True)), FAMILY)
  with pytest.raises(hf_base.ConversionError, match=r"\{'attention.window': 8\} have no Hugging "
                     "Face EuroBERT"):
    engine.to_hf({}, config.replace(attention=dict(window=8)), FAMILY)


# --- the fields compose -----------------------------------------------------------------------
def test_the_new_fields_compose_on_a_post_norm_bert():
  """A BERT (post-norm, token types) with rotary positions, RMSNorm, SwiGLU, two
  key-value heads and local layers: no family branch, so it runs; rotary positions make
  it see distances only (a shift of every position changes nothing), packed documents
  equal the documents alone, and it trains."""
  config = small_model(
      hidden_act="silu", hidden_dropout=0.0,
      embeddings=dict(position="rotary", local_rope_theta=100.0),
      norm=dict(kind="rms_norm", bias=False), feed_forward=dict(kind="gated"),
      attention=dict(num_kv_heads=2, window=8, global_every=2, dropout=0.0))
  model_config.validate(config)
  model = pretraining.PretrainingModel(config, heads=("mlm", "sentence"))
  params = fresh_params(model)
  assert "position_embeddings" not in params["encoder_model"]["embeddings"]
  assert params["encoder_model"]["encoder"]["layer_0"]["attention"]["self_attention"][
      "key"]["kernel"].shape == (48, 2, 12)
  apply = jax.jit(lambda batch: model.apply({"params": params}, batch)["hidden"])
  documents, batch = packed_batch(config.vocab_size, rows=((12, 20, 7),), length=40)
  packed = np.asarray(apply(batch))
  shifted = np.asarray(apply({**batch, "positions": batch["positions"] + 5}))
  np.testing.assert_allclose(shifted, packed, atol=2e-5)
  for row, start, ids in documents:
    alone = {"input_ids": ids[None], "positions": np.arange(len(ids))[None],
             "segment_ids": np.ones((1, len(ids)), np.int32),
             "token_type_ids": np.zeros((1, len(ids)), np.int32)}
    np.testing.assert_allclose(packed[row, start:start + len(ids)],
                               np.asarray(apply(alone))[0], atol=2e-5)
  value, grads = mlm_train_step_gradients(config.replace(hidden_dropout=0.1),
                                          {**batch, "input_ids": batch["input_ids"][[0, 0]],
                                           **{k: batch[k][[0, 0]] for k in (
                                               "token_type_ids", "segment_ids",
                                               "positions")}})
  assert np.isfinite(value) and all(np.isfinite(g).all() for g in grads.values())


def test_the_210m_size_has_hugging_faces_parameter_count():
  """EuroBERT-210m (12 layers, 768 wide, SwiGLU of 3,072, 128,256 tokens): encoderx's MLM
  model has the parameters EuroBertForMaskedLM has, and its encoder EuroBertModel's
  (the 210m: the untied lm_head adds 98.5M)."""
  hf_cfg = transformers.EuroBertConfig(rope_theta=250_000.0)
  with torch.device("meta"):
    theirs = {hf_class: sum(p.numel() for p in getattr(transformers, hf_class)(hf_cfg)
                            .parameters())
              for hf_class in ("EuroBertForMaskedLM", "EuroBertModel")}
  config = model_config_from_hf(hf_cfg)
  shapes = jax.eval_shape(pretraining.PretrainingModel(config, heads=("mlm",)).init,
                          jax.random.key(0), pretraining.init_batch(1, 8))["params"]
  ours = {"EuroBertForMaskedLM": pretraining.count_params(shapes),
          "EuroBertModel": pretraining.count_params(shapes["encoder_model"])}
  print(f"EuroBERT-210m parameters: {ours} (Hugging Face: {theirs})")
  assert ours == theirs and 205e6 < ours["EuroBertModel"] < 215e6


def test_grouped_query_attention_groups_heads_alike_in_both_paths():
  """jax.nn.dot_product_attention's own grouping (`attend` without dropout) and
  repeat_kv's (the dropout path, the Pallas kernel's input) pair query head n with
  key-value head n // (heads / kv_heads), as Hugging Face's repeat_kv."""
  keys = jax.random.split(jax.random.key(0), 3)
  query = jax.random.normal(keys[0], (2, 10, 6, 8))
  key, value = (jax.random.normal(k, (2, 10, 2, 8)) for k in keys[1:])
  mask = masks.local_window_mask(jnp.asarray([[1] * 10, [1] * 6 + [0] * 4]), 4)
  fused = attention.attend(query, key, value, mask)
  repeated, repeated_value = masks.repeat_kv_heads(query, key, value)
  np.testing.assert_array_equal(repeated[:, :, 2], key[:, :, 0])
  np.testing.assert_array_equal(repeated[:, :, 3], key[:, :, 1])
  probabilities = masks.attention_probabilities(query, repeated, mask)
  explicit = jnp.einsum("bnqk,bknd->bqnd", probabilities, repeated_value)
  np.testing.assert_allclose(np.asarray(fused), np.asarray(explicit), atol=1e-5)

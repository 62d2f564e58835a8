"""ModernBERT: the encoder with ModernBERT's fields against Hugging Face's
ModernBertForMaskedLM (logits and every hidden state) on padded batches, packed
documents and rows longer than the local window; its task classes; conversion both
ways; scan == loop; a train step; the init's statistics; the one-line errors.

The models are Hugging Face's own tiny configs (ModernBertConfig), read into encoderx
fields as --init_from reads a config.json (engine.model_fields)."""
import dataclasses

import jax
import numpy as np
import pytest

from encoderx import config as config_lib
from encoderx import errors
from encoderx.hf import base as hf_base
from encoderx.hf import engine
from encoderx.hf import modernbert as hf_modernbert
from encoderx.models import encoder as encoder_lib
from encoderx.models import finetuning, pretraining

import export_checks  # pylint: disable=g-bad-import-order  (tests/ is on sys.path)
from reference_models import (  # pylint: disable=g-bad-import-order
    check_init_statistics, fresh_params, hf_forward, max_diffs,
    mlm_and_hidden_states as mlm_outputs, mlm_train_step_gradients, model_config_from_hf,
    packed_batch, packed_diffs, padded_batch, perturb, small_model)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

FAMILY = "modernbert"
ATOL = 1e-4
VOCAB = 99
# Three layers, the first and the third global (global_attn_every_n_layers 2), the
# second local with a window of 8 tokens (4 each side), so that the padded batch's
# 40-token rows reach past it; the family's thetas (160,000 global, 10,000 local).
TINY = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
            num_attention_heads=4, local_attention=8, global_attn_every_n_layers=2,
            max_position_embeddings=128, initializer_range=0.2, pad_token_id=0,
            bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)
ALL_BIASES = dict(attention_bias=True, mlp_bias=True, norm_bias=True, classifier_bias=True)


def hf_config(attn_implementation="eager", **changes):
  return transformers.ModernBertConfig(**{**TINY, **changes},
                                       attn_implementation=attn_implementation)


def reference(hf_class="ModernBertForMaskedLM", seed=0, **changes):
  """(Hugging Face model of `hf_class`, perturbed, eval; its encoderx ModelConfig)."""
  config = hf_config(**changes)
  torch.manual_seed(seed)
  model = perturb(getattr(transformers, hf_class)(config))
  return model, model_config_from_hf(config)


def converted(model, config, head=None):
  return engine.from_hf(model.state_dict(), config, FAMILY, head=head)


# --- parity with ModernBertForMaskedLM ------------------------------------------------------
@pytest.mark.parametrize("changes, scan", [({}, False), (ALL_BIASES, True),
                                           (dict(attn_implementation="sdpa"), False)],
                         ids=["no-biases", "all-biases-scanned", "sdpa"])
def test_mlm_logits_and_hidden_states_match_on_padded_batches(changes, scan):
  torch_model, config = reference(**changes)
  config = config.replace(layout=dict(scan=scan))
  real, batch = padded_batch(VOCAB, two_segments=False)
  logits, hidden = mlm_outputs(config, converted(torch_model, config), batch)
  theirs = hf_forward(torch_model, batch["input_ids"], batch["segment_ids"])
  diffs = max_diffs(logits, hidden, theirs, real)
  print(f"ModernBertForMaskedLM padded {changes} scan={scan}: max abs {diffs}")
  assert max(diffs.values()) <= ATOL, diffs
  assert np.abs(theirs.logits.numpy()).max() > 1.0  # not trivially small


def test_packed_documents_equal_each_document_alone():
  """Documents packed in a row (segment ids 1, 2, ..., positions restarting) give what
  Hugging Face gives each document alone: attention stays inside the document, the
  local window and the rotary positions count from its start."""
  torch_model, config = reference()
  documents, batch = packed_batch(VOCAB, rows=((12, 20, 7), (30, 9)), length=48)
  logits, hidden = mlm_outputs(config, converted(torch_model, config), batch)
  worst = packed_diffs(logits, hidden, documents, torch_model)
  print(f"ModernBertForMaskedLM packed documents alone: max abs {worst}")
  assert max(worst.values()) <= ATOL, worst


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_rows_longer_than_the_local_window(attn_implementation):
  """A window of 16 tokens over rows of 64: the local layers see 8 tokens each side."""
  torch_model, config = reference(local_attention=16, attn_implementation=attn_implementation)
  real, batch = padded_batch(VOCAB, lengths=(64, 50, 23), two_segments=False)
  params = converted(torch_model, config)
  logits, hidden = mlm_outputs(config, params, batch)
  theirs = hf_forward(torch_model, batch["input_ids"], batch["segment_ids"])
  diffs = max_diffs(logits, hidden, theirs, real)
  print(f"ModernBertForMaskedLM window 16, rows of 64 ({attn_implementation}): max abs "
        f"{diffs}")
  assert max(diffs.values()) <= ATOL, diffs
  # The window matters here: without it (every layer global) the logits differ.
  unwindowed, _ = mlm_outputs(config.replace(attention=dict(window=0)), params, batch)
  assert np.abs(unwindowed[real] - theirs.logits.numpy()[real]).max() > 1e-2


# --- the task classes ---------------------------------------------------------------------
def _task_case(hf_class, **changes):
  torch_model, config = reference(hf_class, num_labels=3, **changes)
  real, batch = padded_batch(VOCAB, two_segments=False)
  theirs = hf_forward(torch_model, batch["input_ids"], batch["segment_ids"])
  return torch_model, config, real, batch, theirs


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_sequence_classification_matches(pooling):
  torch_model, config, _, batch, theirs = _task_case(
      "ModernBertForSequenceClassification", classifier_pooling=pooling, **ALL_BIASES)
  params = converted(torch_model, config, "sequence_classification")
  model = finetuning.SequenceClassifier(config, num_labels=3, pooling="pooler", dropout=0.0)
  diff = float(np.abs(np.asarray(model.apply({"params": params}, batch))
                      - theirs.logits.numpy()).max())
  print(f"ModernBertForSequenceClassification ({pooling}): max abs {diff:.2e}")
  assert diff <= ATOL


def test_token_classification_and_question_answering_match():
  torch_model, config, real, batch, theirs = _task_case("ModernBertForTokenClassification")
  params = converted(torch_model, config, "token_classification")
  tags = finetuning.TokenClassifier(config, num_labels=3, dropout=0.0)
  tag_diff = float(np.abs(np.asarray(tags.apply({"params": params}, batch))[real]
                          - theirs.logits.numpy()[real]).max())
  torch_model, config = reference("ModernBertForQuestionAnswering", num_labels=2)
  theirs = hf_forward(torch_model, batch["input_ids"], batch["segment_ids"])
  params = converted(torch_model, config, "question_answering")
  start, end = finetuning.SpanExtractor(config).apply({"params": params}, batch)
  span_diff = max(float(np.abs(np.asarray(ours)[real] - t.numpy()[real]).max())
                  for ours, t in ((start, theirs.start_logits), (end, theirs.end_logits)))
  print(f"ModernBertForTokenClassification: max abs {tag_diff:.2e}; "
        f"ModernBertForQuestionAnswering: max abs {span_diff:.2e}")
  assert tag_diff <= ATOL and span_diff <= ATOL


# --- conversion -----------------------------------------------------------------------------
# The family's case of the export checks (its default model: tests/test_export.py runs
# its round trip, export and refusals); here the variant without biases.
CASE = export_checks.case_named(FAMILY)


@pytest.mark.parametrize("changes", [{"heads.tie_word_embeddings": False,
                                      "heads.decoder_bias": False, "attention.bias": False,
                                      "norm.bias": False}],
                         ids=["untied-no-biases"])
def test_every_class_round_trips_byte_identical(changes, tmp_path):
  """Each class saved by transformers -> encoderx -> a state dict identical in bytes,
  the class recognized (ModernBertModel, ForMaskedLM, For{Sequence,Token}Classification,
  ForQuestionAnswering)."""
  case = dataclasses.replace(CASE, model={**CASE.model, **changes})
  export_checks.check_hf_round_trip(case, tmp_path)


def test_hf_config_round_trips():
  config = small_model().with_fields(CASE.model)
  fields = engine.hf_config(config, FAMILY).to_dict()
  assert fields["layer_types"] == ["full_attention", "sliding_attention", "full_attention"]
  assert fields["rope_parameters"]["sliding_attention"]["rope_theta"] == 10_000.0
  _, back = engine.model_fields(fields)
  assert config.with_fields(back) == config
  # A config.json of transformers 4 (global_attn_every_n_layers, global/local_rope_theta).
  legacy = {k: v for k, v in fields.items() if k not in ("layer_types", "rope_parameters")}
  _, old = engine.model_fields({**legacy, "global_attn_every_n_layers": 2,
                            "global_rope_theta": 160_000.0, "local_rope_theta": 10_000.0})
  assert config.with_fields(old) == config


# --- scan, training, init --------------------------------------------------------------------
def test_scanned_stack_equals_the_loop_and_keeps_the_first_layer_apart():
  torch_model, config = reference(**ALL_BIASES)
  params = converted(torch_model, config)
  scanned = config.replace(layout=dict(scan=True, remat=True))
  stacked = encoder_lib.stack_layers(params)
  encoder = stacked["encoder_model"]["encoder"]
  # Layer 0 has no attention norm: it stays out of the scan, the two others are stacked.
  assert set(encoder) == {"layer_0", "layers", "final_layer_norm"}
  assert encoder["layers"]["layer"]["attention"]["layer_norm"]["scale"].shape == (2, 32)
  expected = jax.eval_shape(pretraining.PretrainingModel(scanned, heads=("mlm",)).init,
                            jax.random.key(0), pretraining.init_batch(1, 8))["params"]
  engine.check_tree(stacked, expected)
  real, batch = padded_batch(VOCAB, two_segments=False)
  loop, loop_hidden = mlm_outputs(config, params, batch)
  scan, scan_hidden = mlm_outputs(scanned, stacked, batch)
  np.testing.assert_allclose(scan[real], loop[real], atol=1e-5)
  for ours, theirs in zip(scan_hidden, loop_hidden, strict=True):
    np.testing.assert_allclose(ours[real], theirs[real], atol=1e-5)
  unstacked = encoder_lib.unstack_layers(stacked, config.num_layers)
  jax.tree_util.tree_map(np.testing.assert_array_equal, unstacked, params)


@pytest.mark.parametrize("scan", [False, True])
def test_a_train_step_gives_finite_gradients_to_every_parameter(scan):
  _, config = reference(**ALL_BIASES)
  config = config.replace(hidden_dropout=0.1, attention=dict(dropout=0.1), layout=dict(scan=scan))
  _, batch = packed_batch(VOCAB, rows=((12, 20), (10, 9, 7)), length=32)
  value, grads = mlm_train_step_gradients(config, batch)
  assert np.isfinite(value)
  for path, grad in grads.items():
    assert np.isfinite(grad).all() and np.abs(grad).max() > 0, "/".join(path)


def test_initialization_statistics_equal_hugging_faces():
  """Per weight, encoderx's init has the standard deviation and truncation of Hugging
  Face's ModernBertPreTrainedModel._init_weights (truncated at initializer_cutoff_factor
  = 2 standard deviations; 'in' 0.02, 'out' 0.02 / sqrt(2 layers), classifier
  hidden^-0.5; norms 1, biases 0)."""
  sizes = dict(vocab_size=512, hidden_size=128, intermediate_size=192, num_hidden_layers=4,
               num_attention_heads=4, initializer_range=0.02, num_labels=64, **ALL_BIASES)
  hf_cfg = hf_config(**{**TINY, **sizes})
  config = model_config_from_hf(hf_cfg)
  for hf_class, head, model in (
      ("ModernBertForMaskedLM", "mlm", pretraining.PretrainingModel(config, heads=("mlm",))),
      ("ModernBertForSequenceClassification", "sequence_classification",
       finetuning.SequenceClassifier(config, num_labels=64, pooling="pooler"))):
    torch.manual_seed(0)
    theirs = {k: v.numpy() for k, v in getattr(transformers, hf_class)(hf_cfg)
              .state_dict().items()}
    params = fresh_params(model)
    ratios = check_init_statistics(engine.to_hf(params, config, FAMILY, head), theirs)
    print(f"{hf_class} init std ratios to Hugging Face's: "
          f"{min(ratios.values()):.3f}..{max(ratios.values()):.3f} over {len(ratios)} weights")


# --- errors ------------------------------------------------------------------------------------
@pytest.mark.parametrize("changes, message", [
    (dict(attention=dict(window=7)), r"model.attention.window'?: must be an even number"),
    (dict(attention=dict(window=-2)), r"model.attention.window'?: must be an even number"),
    (dict(attention=dict(num_kv_heads=3)),
     r"model.attention.num_kv_heads'?: 3: model.num_heads=4 must be a multiple"),
    (dict(embeddings=dict(rope_theta=0.0)),
     r"model.embeddings.rope_theta'?: must be positive, got 0.0"),
    (dict(embeddings=dict(local_rope_theta=-1.0)),
     r"model.embeddings.local_rope_theta'?: must be positive"),
    (dict(norm=dict(position="middle")), r"model.norm.position'?: 'middle' is not one of"),
    (dict(norm=dict(first_attention=False)),
     r"model.norm.first_attention'?: False is for pre-norm"),
    (dict(feed_forward=dict(kind="swiglu")),
     r"model.feed_forward.kind'?: 'swiglu' is not one of"),
])
def test_bad_fields_are_refused_in_one_line(changes, message):
  config = config_lib.default_config()
  config.model.num_heads, config.model.hidden_size = 4, 64
  config.model.update(changes)
  with pytest.raises(errors.ConfigError, match=message) as error:
    config_lib.validate(config)
  assert "\n" not in str(error.value)


def test_conversion_refuses_other_families_and_unrepresentable_configs():
  bert = transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                 num_attention_heads=4, intermediate_size=48).to_dict()
  with pytest.raises(hf_base.ConversionError, match=r"model_type 'bert' is not a ModernBERT's"):
    hf_modernbert.model_fields(bert)
  _, config = reference()
  bert_weights = engine.hf_model(small_model(), "bert", "mlm").state_dict()
  with pytest.raises(hf_base.ConversionError, match=r"the weights lack what ModernBert\w* has: "):
    engine.from_hf(bert_weights, config, FAMILY)
  with pytest.raises(hf_base.ConversionError, match=r"\{'norm.kind': 'rms_norm'"):
    engine.to_hf({}, config.replace(norm=dict(kind="rms_norm")), FAMILY)
  with pytest.raises(hf_base.ConversionError, match=r"classifier_activation 'silu' != "
                     "hidden_activation 'gelu'"):
    engine.model_fields(hf_config(classifier_activation="silu").to_dict())
  layer_types = ["full_attention", "sliding_attention", "sliding_attention"]
  with pytest.raises(hf_base.ConversionError, match=r"layer_types .* not every n-th"):
    engine.model_fields({**hf_config().to_dict(), "layer_types": layer_types[::-1]})


# --- sizes ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, sizes", [
    ("base", {}),  # ModernBertConfig's defaults: answerdotai/ModernBERT-base
    ("large", dict(hidden_size=1024, intermediate_size=2624, num_hidden_layers=28,
                   num_attention_heads=16)),
])
def test_the_released_sizes_have_hugging_faces_parameter_counts(name, sizes):
  """ModernBERT-base (22 layers, 768 wide, GeGLU of 1,152) and -large (28 layers, 1,024
  wide, 2,624): encoderx's MLM model has the parameters ModernBertForMaskedLM has."""
  hf_cfg = transformers.ModernBertConfig(**sizes)
  with torch.device("meta"):
    theirs = sum(p.numel() for p in transformers.ModernBertForMaskedLM(hf_cfg).parameters())
  config = model_config_from_hf(hf_cfg)
  shapes = jax.eval_shape(pretraining.PretrainingModel(config, heads=("mlm",)).init,
                          jax.random.key(0), pretraining.init_batch(1, 8))["params"]
  ours = pretraining.count_params(shapes)
  print(f"ModernBERT-{name}: {ours:,} parameters (ModernBertForMaskedLM: {theirs:,})")
  assert ours == theirs

"""DeBERTa: disentangled attention against Hugging Face DebertaV2ForMaskedLM, the
enhanced mask decoder against DeBERTa's own (built from Hugging Face's layers) and on
its own terms, log buckets, conversion both ways, Hugging Face directories, the
SentencePiece layout against DebertaV2Tokenizer, configs and a tiny pretraining run."""
import shutil
import unicodedata

import flax
import jax
import numpy as np
import pytest
import tensorflow as tf

from encoderx import config as config_lib
from encoderx import initialize, train
from encoderx import configs
from encoderx.data import sentencepiece_vocabulary as spm_lib
from encoderx.data import resources
from encoderx.data.vocabulary import VocabularyError
from encoderx.hf import engine
from encoderx.hf import directory as hf_directory
from encoderx.models import model_config
from encoderx.models import disentangled, finetuning, pretraining
from encoderx.train import trainer as trainer_lib

from reference_models import (  # pylint: disable=g-bad-import-order  (tests/ is on sys.path)
    check_round_trip, flax_from_torch, mlm_logits, padded_batch, small_model,
    torch_outputs, torch_reference)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from transformers.models.deberta_v2 import modeling_deberta_v2  # noqa: E402

FAMILY = "deberta-v2"
ONE_DEVICE = jax.devices()[:1]
# DeBERTa's model fields at the reference models' sizes. Buckets of 8 (exact distances
# up to 4, log-shrunk up to 24) so that the padded batch's 40-token rows reach far past
# both the bucket boundary and max_relative_positions.
MODEL = small_model(
    attention=dict(variant="disentangled", position_buckets=8, max_relative_positions=24),
    embeddings=dict(position="none", type_vocab_size=0, max_positions=64),
    norm=dict(eps=1e-7))
V3_DEFAULTS = dict(attention=dict(position_buckets=256, max_relative_positions=512),
                   embeddings=dict(max_positions=512))


def _reference(config):
  return torch_reference(config, FAMILY)


def _max_diff(ours, theirs, real):
  return float(np.abs(np.asarray(ours)[real] - theirs[real]).max())


# --- relative positions -------------------------------------------------------------------
@pytest.mark.parametrize("buckets, max_position", [(256, 512), (64, 128), (8, 24)])
def test_log_buckets_equal_hugging_face(buckets, max_position):
  distance = np.arange(-3000, 3001)
  theirs = modeling_deberta_v2.make_log_bucket_position(torch.tensor(distance), buckets,
                                                        max_position).long().numpy()
  np.testing.assert_array_equal(disentangled.log_buckets(distance, buckets, max_position),
                                theirs)
  # Each row of a 600-token input reads the table row Hugging Face's c2p gathers.
  config = MODEL.replace(attention=dict(position_buckets=buckets,
                                        max_relative_positions=max_position))
  relative = modeling_deberta_v2.build_relative_position(
      torch.zeros(600, 1), torch.zeros(600, 1), buckets, max_position)
  their_rows = torch.clamp(relative + buckets, 0, 2 * buckets - 1)[0].numpy()
  ours = disentangled.relative_rows(np.arange(600, dtype=np.int32)[None], config)[0]
  np.testing.assert_array_equal(ours, their_rows)


def test_relative_distances_restart_with_each_packed_sequence():
  positions = np.array([[0, 1, 2, 3, 0, 1, 2, 0, 1, 0]], np.int32)  # 4, 3, 2 and 1 tokens
  rows = np.asarray(disentangled.relative_rows(positions, MODEL))[0]
  alone = np.asarray(disentangled.relative_rows(np.arange(4, dtype=np.int32)[None], MODEL))[0]
  for start, length in ((0, 4), (4, 3), (7, 2), (9, 1)):
    block = rows[start:start + length, start:start + length]
    np.testing.assert_array_equal(block, alone[:length, :length])


# --- parity with DebertaV2ForMaskedLM ------------------------------------------------------
@pytest.mark.parametrize("changes, lengths", [
    (dict(), (40, 31, 17, 6)),
    (dict(attention=dict(share_att_key=False), layout=dict(scan=True)), (40, 31, 17, 6)),
    (dict(attention=dict(relative_terms=("c2p",))), (40, 31, 17, 6)),
    (dict(attention=dict(share_att_key=False, relative_terms=("p2c",))), (40, 31, 17, 6)),
    (V3_DEFAULTS, (160, 131, 40, 6)),  # v2/v3's buckets, rows past the 128 boundary
], ids=["shared", "own-projections-scanned", "c2p", "p2c", "v3-defaults-160"])
def test_mlm_logits_match_pytorch_on_padded_batches(changes, lengths):
  config = MODEL.replace(**changes)
  torch_model = _reference(config.replace(layout=dict(scan=False)))
  model, params = flax_from_torch(config, torch_model, family=FAMILY, heads=("mlm",))
  real, batch = padded_batch(config.vocab_size, lengths=lengths, two_segments=False)
  theirs = mlm_logits(torch_outputs(torch_model, batch))
  diff = _max_diff(model.apply({"params": params}, batch)["mlm_logits"], theirs, real)
  print(f"DebertaV2ForMaskedLM parity {changes}: max abs diff {diff:.2e}")
  assert diff <= 1e-4, diff
  assert np.abs(theirs).max() > 1.0  # not trivially small


def test_conversion_round_trips_exactly():
  config = MODEL.replace(attention=dict(share_att_key=False), layout=dict(scan=True))
  unscanned = config.replace(layout=dict(scan=False))
  torch_model = _reference(unscanned)
  _, params = flax_from_torch(config, torch_model, family=FAMILY, heads=("mlm",))
  state_dict = engine.to_hf(params, config, family=FAMILY)
  assert "deberta.encoder.layer.2.attention.self.pos_key_proj.weight" in state_dict
  check_round_trip(state_dict, torch_model, unscanned, FAMILY, tied=set())


def test_hugging_face_legacy_head_converts_to_the_same_parameters():
  torch_model = _reference(MODEL)
  legacy = engine.hf_pretraining_model(MODEL, FAMILY, legacy=True).eval()
  renamed = {name.replace("lm_predictions.lm_head.dense", "cls.predictions.transform.dense")
             .replace("lm_predictions.lm_head.LayerNorm", "cls.predictions.transform.LayerNorm")
             .replace("lm_predictions.lm_head.bias", "cls.predictions.bias"): value
             for name, value in torch_model.state_dict().items()}
  missing, unexpected = legacy.load_state_dict(renamed, strict=False)
  assert not unexpected and set(missing) <= {"cls.predictions.decoder.weight",
                                             "cls.predictions.decoder.bias"}
  legacy.tie_weights()
  real, batch = padded_batch(MODEL.vocab_size, two_segments=False)
  _, params = flax_from_torch(MODEL, legacy, family=FAMILY, heads=("mlm",))
  model = pretraining.PretrainingModel(MODEL, heads=("mlm",))
  assert _max_diff(model.apply({"params": params}, batch)["mlm_logits"],
                   mlm_logits(torch_outputs(legacy, batch)), real) <= 1e-4


# --- the enhanced mask decoder -------------------------------------------------------------
def _with_position_table(params, rows=64, seed=0):
  table = np.random.default_rng(seed).normal(0, 0.2, (rows, MODEL.hidden_size))
  params = jax.tree_util.tree_map(np.asarray, params)
  params["encoder_model"]["embeddings"]["position_embeddings"] = {
      "embedding": table.astype(np.float32)}
  return params


def _debertas_mask_decoder(torch_model, batch, table):
  """microsoft/DeBERTa's EnhancedMaskDecoder.emd_context_layer on Hugging Face's layers:
  queries = encoder_layers[-2] + absolute position embeddings, then encoder.layer[-1]
  twice (keys and values encoder_layers[-2]), then the MLM head."""
  ids = torch.tensor(batch["input_ids"], dtype=torch.long)
  mask = torch.tensor(batch["segment_ids"], dtype=torch.long)
  with torch.no_grad():
    last_input = torch_model.deberta(ids, attention_mask=mask,
                                     output_hidden_states=True).hidden_states[-2]
    encoder = torch_model.deberta.encoder
    query = last_input + torch.tensor(table)[torch.tensor(batch["positions"]).long()]
    for _ in range(2):
      query = encoder.layer[-1](
          last_input, encoder.get_attention_mask(mask), query_states=query,
          relative_pos=encoder.get_rel_pos(last_input),
          rel_embeddings=encoder.get_rel_embedding())[0]
    return torch_model.lm_predictions(query, torch_model.deberta.embeddings.word_embeddings
                                      ).numpy()


@pytest.mark.parametrize("scan_layers", [False, True])
def test_enhanced_mask_decoder_equals_debertas_on_hugging_face_layers(scan_layers):
  torch_model = _reference(MODEL)
  config = MODEL.replace(heads=dict(enhanced_mask_decoder=True), layout=dict(scan=scan_layers))
  model = pretraining.PretrainingModel(config, heads=("mlm",))
  params = _with_position_table(engine.from_hf(torch_model.state_dict(), config,
                                               family=FAMILY))
  engine.check_tree(params, jax.eval_shape(model.init, jax.random.key(0),
                                           pretraining.init_batch(1, 8))["params"])
  real, batch = padded_batch(MODEL.vocab_size, two_segments=False)
  theirs = _debertas_mask_decoder(
      torch_model, batch, params["encoder_model"]["embeddings"]["position_embeddings"][
          "embedding"])
  ours = np.asarray(model.apply({"params": params}, batch)["mlm_logits"])
  diff = _max_diff(ours, theirs, real)
  print(f"enhanced mask decoder (scan={scan_layers}): max abs diff {diff:.2e}")
  assert diff <= 1e-4
  assert _max_diff(ours, mlm_logits(torch_outputs(torch_model, batch)), real) > 0.1
  # Only the masked positions are decoded; they are what decoding every position gives.
  rows = np.array([[1, 5, 39], [0, 2, 30], [3, 4, 16], [1, 2, 5]], np.int32)
  gathered = model.apply({"params": params}, {**batch, "masked_positions": rows})
  np.testing.assert_allclose(np.asarray(gathered["mlm_logits"]),
                             np.take_along_axis(ours, rows[..., None], axis=1), atol=1e-5)


@pytest.mark.parametrize("decoder", [False, True])
def test_absolute_positions_reach_the_mlm_logits_only_through_the_decoder(decoder):
  """Shifting every absolute position (relative distances unchanged), or redrawing the
  position table, never changes the encoder's outputs; the MLM logits change exactly
  when the enhanced mask decoder is on."""
  config = MODEL.replace(heads=dict(enhanced_mask_decoder=decoder))
  model = pretraining.PretrainingModel(config, heads=("mlm",))
  params = flax.linen.unbox(model.init(jax.random.key(0),
                                       pretraining.init_batch(1, 8))["params"])
  apply = jax.jit(lambda params, batch: model.apply({"params": params}, batch))
  _, batch = padded_batch(MODEL.vocab_size, two_segments=False)
  shifted = {**batch, "positions": batch["positions"] + 7}
  outputs = [apply(params, batch), apply(params, shifted)]
  if decoder:
    outputs.append(apply(_with_position_table(params, seed=1), batch))
  else:
    assert "position_embeddings" not in params["encoder_model"]["embeddings"]
  for other in outputs[1:]:
    np.testing.assert_array_equal(np.asarray(other["hidden"]), np.asarray(outputs[0]["hidden"]))
    change = np.abs(np.asarray(other["mlm_logits"]) - np.asarray(outputs[0]["mlm_logits"]))
    assert (change.max() > 1e-2) if decoder else (change.max() == 0.0), change.max()


def test_fine_tuning_models_keep_the_decoders_position_table():
  """The table is the encoder's: a classifier built from an EMD model's fields has it,
  so that --init_from takes the whole encoder."""
  config = MODEL.replace(heads=dict(enhanced_mask_decoder=True))
  classifier = finetuning.SequenceClassifier(config, num_labels=2, pooling="first_token")
  params = flax.linen.unbox(classifier.init(jax.random.key(0),
                                            pretraining.init_batch(1, 8))["params"])
  assert params["encoder_model"]["embeddings"]["position_embeddings"]["embedding"].shape == (
      64, MODEL.hidden_size)


# --- SentencePiece with DeBERTa's layout ---------------------------------------------------
def _deberta_tokenizer(model_file, directory, lower_case=False):
  """DebertaV2Tokenizer reading `model_file` (from a directory, as AlbertTokenizer must)."""
  shutil.copy(model_file, directory / "spm.model")
  (directory / "tokenizer_config.json").write_text(
      f'{{"do_lower_case": {str(lower_case).lower()}}}')
  return transformers.DebertaV2Tokenizer.from_pretrained(str(directory))


def test_deberta_sentencepiece_ids_equal_debertav2tokenizer(austen_lines, tmp_path):
  vocabulary = spm_lib.SentencePieceVocabulary(
      resources.BUNDLED_DEBERTA_SENTENCEPIECE_VOCAB, lower_case=False,
      strip_accents=False, layout="deberta")
  tokenizer = _deberta_tokenizer(vocabulary.path, tmp_path)
  assert (vocabulary.pad_id, vocabulary.cls_id, vocabulary.sep_id, vocabulary.unk_id,
          vocabulary.mask_id) == (0, 1, 2, 3, 8000)
  assert (tokenizer.pad_token_id, tokenizer.cls_token_id, tokenizer.sep_token_id,
          tokenizer.unk_token_id, tokenizer.mask_token_id) == (0, 1, 2, 3, 8000)
  assert vocabulary.vocab_size == len(tokenizer) == 8001
  assert vocabulary.id_to_token(8000) == "[MASK]" and 8000 in vocabulary.special_ids
  assert set(vocabulary.special_ids) == {0, 1, 2, 3, 8000}
  edge_cases = ["Héllo WÖRLD, naïve café!", "``Quoted'' and “curly” text",
                "ß İstanbul ǅ ﬁ ①", "Ｆｕｌｌ－ｗｉｄｔｈ\tand  spaces",
                "in 1811, £10,000 a year", "中文 and 日本", "  lead and  trail  "]
  lines = austen_lines(2000) + edge_cases
  ours = vocabulary.encode_tf(tf.constant(lines)).to_list()
  theirs = [tokenizer.encode(line, add_special_tokens=False) for line in lines]
  differ = [line for line, a, b in zip(lines, ours, theirs) if a != b]
  # transformers 5 skips the model's NFKC normalizer (module docstring): only lines that
  # NFKC changes may differ, and they do.
  assert differ == [line for line in edge_cases if unicodedata.normalize("NFKC", line)
                    != unicodedata.normalize("NFC", line)], differ
  assert sum(map(len, ours)) > 20_000


def test_sentencepiece_layouts_are_checked_and_trained(austen_files, tmp_path):
  with pytest.raises(VocabularyError, match=r"lacks the special pieces \['\[MASK\]'\] of "
                     r"the 'albert' layout.*data\.vocab\.layout"):
    spm_lib.SentencePieceVocabulary(resources.BUNDLED_DEBERTA_SENTENCEPIECE_VOCAB)
  prefix = tmp_path / "spm"
  spm_lib.main(["--files", austen_files[0], "--size", "1000", "--layout", "deberta",
                "--output", str(prefix)])
  trained = spm_lib.SentencePieceVocabulary(f"{prefix}.model", layout="deberta")
  assert trained.vocab_size == 1001 and trained.mask_id == 1000
  assert [trained.id_to_token(i) for i in range(4)] == ["[PAD]", "[CLS]", "[SEP]", "[UNK]"]


# --- Hugging Face directories ---------------------------------------------------------------
def _hf_directory(directory, config):
  """A DebertaV2ForMaskedLM saved as Hugging Face saves one, with the bundled
  DeBERTa-layout SentencePiece model as its spm.model."""
  torch_model = _reference(config)
  torch_model.save_pretrained(directory)
  _deberta_tokenizer(resources.resolve(resources.BUNDLED_DEBERTA_SENTENCEPIECE_VOCAB),
                     directory)
  return torch_model


def test_pretraining_starts_from_a_hugging_face_deberta_directory(tiny_config, tmp_path,
                                                                 caplog):
  directory = tmp_path / "hf"
  source = MODEL.replace(vocab_size=8001, hidden_size=32, intermediate_size=64, num_layers=2,
                         num_heads=2, embeddings=dict(size=32, max_positions=128))
  torch_model = _hf_directory(directory, source)
  config = tiny_config("deberta:tiny")
  config.init_from = f"hf:{directory}"
  config = initialize.resolve_config(config)
  assert (config.model.attention.variant, config.model.embeddings.position,
          config.model.heads.enhanced_mask_decoder, config.model.attention.position_buckets,
          config.model.attention.max_relative_positions, config.model.embeddings.type_vocab_size) == (
              "disentangled", "none", False, 8, 24, 0)
  assert (config.data.vocab.layout, config.data.vocab.lower_case,
          config.data.vocab.path) == ("deberta", False, str(directory / "spm.model"))
  trainer = trainer_lib.Trainer(config, devices=ONE_DEVICE)
  with caplog.at_level("INFO", logger="encoderx"):
    state = initialize.initial_state(trainer)
  assert "initialized fresh: -; unused from the source: -" in caplog.text
  real, batch = padded_batch(8001, two_segments=False)
  ours = trainer.method.model.apply({"params": jax.device_get(state.params)}, batch)
  assert _max_diff(ours["mlm_logits"], mlm_logits(torch_outputs(torch_model, batch)),
                   real) <= 1e-4


def test_the_decoders_position_table_of_released_checkpoints_is_skipped():
  """DeBERTa's v3 checkpoints keep the enhanced mask decoder's table as
  embeddings.position_embeddings beside position_biased_input=False; Hugging Face does not
  read it, nor does the import (a table of a model with absolute positions is read)."""
  state_dict = {k: v.numpy() for k, v in _reference(MODEL).state_dict().items()}
  table = np.ones((MODEL.embeddings.max_positions, MODEL.hidden_size), np.float32)
  params, unused = hf_directory.convert(
      {**state_dict, "deberta.embeddings.position_embeddings.weight": table}, MODEL, FAMILY)
  assert not unused and "position_embeddings" not in params["encoder_model"]["embeddings"]
  absolute = MODEL.replace(embeddings=dict(position="absolute"))
  with pytest.raises(hf_directory.HfDirectoryError, match="lack what DebertaV2ForMaskedLM "
                     "has: deberta.embeddings.position_embeddings.weight"):
    hf_directory.convert(state_dict, absolute, FAMILY)


@pytest.mark.parametrize("change, message", [
    ({"conv_kernel_size": 3}, "convolution layer"),
    ({"norm_rel_ebd": "none"}, "norm_rel_ebd"),
    ({"pos_att_type": ["p2c", "p2p"]}, "only 'c2p' and 'p2c'"),
    ({"embedding_size": 64}, "embedding_size"),
])
def test_unsupported_deberta_configs_are_named(change, message):
  fields = engine.hf_config(MODEL, FAMILY).to_dict()
  assert engine.model_fields(fields)[1]["attention.variant"] == "disentangled"
  with pytest.raises(ValueError, match=message):
    engine.model_fields({**fields, **change})


# --- configs and training ---------------------------------------------------------------------
def test_deberta_configs_are_valid_with_the_papers_sizes():
  tiny, base = configs.get("deberta:tiny"), configs.get("deberta:base")
  for config in (tiny, base):
    config_lib.validate(config)
    assert (config.model.attention.variant, config.model.embeddings.position,
            config.model.heads.enhanced_mask_decoder, config.model.norm.eps,
            config.model.embeddings.type_vocab_size, config.data.vocab.layout) == (
                "disentangled", "none", True, 1e-7, 0, "deberta")
  assert (base.model.num_layers, base.model.hidden_size, base.model.num_heads,
          base.model.vocab_size, base.model.attention.position_buckets,
          base.model.attention.max_relative_positions) == (12, 768, 12, 128100, 256, 512)
  model = model_config.ModelConfig.from_config(base.model)
  shapes = jax.eval_shape(pretraining.PretrainingModel(model, heads=("mlm",)).init,
                          jax.random.key(0), pretraining.init_batch(1, 8))["params"]
  # 98M of the encoder + the 128,100 x 768 embedding (DeBERTa-v3-base: 86M + 98M).
  print(f"deberta_base parameters: {pretraining.count_params(shapes):,}")
  assert 183e6 < pretraining.count_params(shapes) < 186e6


def test_tiny_deberta_learns_on_the_bundled_corpus(tiny_config, tmp_path):
  config = tiny_config("deberta:tiny")
  config.model.hidden_size, config.model.intermediate_size = 64, 128
  config.train.steps = 40
  config.optimizer.learning_rate = 3e-3
  config.optimizer.warmup_steps = 5
  result = train.run(config, str(tmp_path), show_progress=False, devices=ONE_DEVICE)
  history = result["history"]
  first, last = history[0], np.mean([h["mlm_loss"] for h in history[-5:]])
  print(f"tiny DeBERTa: mlm_loss {first['mlm_loss']:.3f} -> {last:.3f}; held-out "
        f"{result['eval']}")
  assert last < first["mlm_loss"] - 2.0, (first["mlm_loss"], last)
  assert np.mean([h["mlm_accuracy"] for h in history[-5:]]) > first["mlm_accuracy"] + 0.05
  assert result["eval"]["mlm_accuracy"] > 0.05

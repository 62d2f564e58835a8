"""Export (python -m encoderx.export) and import (--init_from=hf:) per family.

For every family in export_checks.CASES: Hugging Face weights -> import -> export are
byte-identical for each class of the family; a run exports to a directory that
AutoModel, the family's class and AutoTokenizer load, with encoderx's outputs (fp32,
1e-4, padded batches) and ids (bundled corpus); configurations the family cannot
represent are refused; config.json's special-token ids are the exported tokenizer's.
Then the fine-tuned classifier's export, the .npz export and the command line.
"""
import os
import shutil
import subprocess
import sys

import flax
import jax
import numpy as np
import pytest

from encoderx.export import writer
from encoderx.hf import base, engine
from encoderx.hf import directory as hf_directory
from encoderx.models import model_config

from conftest import REPO, _tiny_config  # pylint: disable=g-bad-import-order
from export_checks import (  # pylint: disable=g-bad-import-order
    CASES, check_export_parity, check_hf_round_trip, check_special_token_ids,
    check_tokenizer, make_run, perturbed)
from reference_models import small_model  # pylint: disable=g-bad-import-order
import tiny_hf  # pylint: disable=g-bad-import-order

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# Lines of the bundled corpus each exported tokenizer encodes as encoderx does (100 cover
# every vocabulary's words, punctuation and casing; the sentencepiece families encode
# them one by one, which made 300 lines most of a sentencepiece case's time).
TOKENIZER_LINES = 100
FAMILIES = [case for case in CASES if case.name == case.family]
CLASSES = {"bert": "BertForPreTraining", "spanbert": "BertForMaskedLM",
           "roberta": "RobertaForMaskedLM", "albert": "AlbertForPreTraining",
           "deberta-v2": "DebertaV2ForMaskedLM", "electra": "ElectraForPreTraining",
           "xlnet": "XLNetLMHeadModel", "modernbert": "ModernBertForMaskedLM",
           "eurobert": "EuroBertForMaskedLM"}


def _config(name: str, model: dict | None = None):
  """The tiny config of `name` with `model` fields changed (by path: 'layout.sharing')."""
  config = _tiny_config(name)
  config.model.init.range = 0.2  # logits of O(1-10): 1e-4 means something
  config.model.update(model_config.nested(model or {}))
  return config


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """runs(case) -> (workdir, method, params) of the case's tiny run, made once."""
  made = {}

  def run(case):
    if case.name not in made:
      workdir = str(tmp_path_factory.mktemp(f"run_{case.name}"))
      made[case.name] = (workdir, *make_run(_config(case.config, case.run), workdir))
    return made[case.name]
  return run


@pytest.mark.parametrize("case", FAMILIES, ids=lambda case: case.name)
def test_hugging_face_weights_import_and_export_byte_identical(case, tmp_path):
  check_hf_round_trip(case, str(tmp_path))


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_exported_run_loads_in_transformers_with_the_same_outputs_and_ids(
    case, runs, tmp_path, austen_lines):
  workdir, method, params = runs(case)
  params = method.transferable_params(params)  # what export takes (ELECTRA's discriminator)
  exported = writer.export_hf(workdir, str(tmp_path / "hf"))
  assert (exported.family, exported.hf_class) == (case.family, CLASSES[case.name])
  assert exported.left_out == (["sbo_head"] if case.name == "spanbert" else [])
  assert {"config.json", "model.safetensors", "tokenizer_config.json",
          "special_tokens_map.json"} <= set(exported.files)
  diffs = check_export_parity(method, params, exported, method.vocabulary.pad_id,
                              case.flax_model)
  print(f"{case.name} export parity: " + ", ".join(f"{k} {v:.1e}" for k, v in diffs.items()))
  check_tokenizer(exported.output, method.vocabulary, austen_lines(TOKENIZER_LINES))
  check_special_token_ids(exported.output)
  # The exported directory is read back by --init_from=hf: to the same parameters.
  from encoderx import sources  # pylint: disable=g-import-not-at-top
  source = sources.open_source(f"hf:{exported.output}")
  assert source.model["family"] == case.family
  back = flax.traverse_util.flatten_dict(source.load_params())
  ours = flax.traverse_util.flatten_dict(params)
  assert back.keys() == {k for k in ours if k[0] != "sbo_head"}
  for key, value in back.items():
    np.testing.assert_array_equal(value, ours[key], err_msg="/".join(key))


def _init_from(directory: str, family: str, workdir: str):
  """A tiny run of the family's config from --init_from=hf:DIRECTORY: (method, params),
  written to `workdir` as a run."""
  from encoderx import initialize  # pylint: disable=g-import-not-at-top
  from encoderx.train import trainer as trainer_lib  # pylint: disable=g-import-not-at-top
  config = _tiny_config(f"{family}:tiny")
  config.init_from = f"hf:{directory}"
  config = initialize.resolve_config(config)
  trainer = trainer_lib.Trainer(config, devices=jax.devices()[:1])
  params = jax.device_get(initialize.initial_state(trainer).params)
  return make_run(config, workdir, params=params)


@pytest.mark.parametrize("family", tiny_hf.SAVED)
def test_init_from_a_directory_transformers_saved_and_export_round_trip(
    family, tmp_path, austen_lines, caplog):
  """A model transformers initialized and saved (save_pretrained, with a fast tokenizer
  of the family's bundled vocabulary) -> --init_from=hf: -> the run computes its logits
  and hidden states, AutoTokenizer gives the run's ids; the run exports the same weights
  (every tensor in bytes), and export -> --init_from=hf: -> export is byte-identical,
  every file."""
  hf_class = tiny_hf.SAVED[family][0]
  saved = str(tmp_path / "saved")
  vocabulary = tiny_hf.save_tiny_family(family, saved)
  with caplog.at_level("INFO", logger="encoderx"):
    method, params = _init_from(saved, family, str(tmp_path / "run"))
  assert "initialized fresh: -; unused from the source: -" in caplog.text
  as_saved = writer.Exported(saved, family, hf_class, None, [], [])
  diffs = check_export_parity(method, params, as_saved, vocabulary.pad_id)
  print(f"{family} --init_from=hf: of save_pretrained: "
        + ", ".join(f"{k} {v:.1e}" for k, v in diffs.items()))
  check_tokenizer(saved, method.vocabulary, austen_lines(TOKENIZER_LINES))

  first = writer.export_hf(str(tmp_path / "run"), str(tmp_path / "first"))
  theirs = hf_directory.read_state_dict(saved)
  ours = hf_directory.read_state_dict(first.output)
  assert ours.keys() == theirs.keys()
  assert all(ours[name].tobytes() == theirs[name].tobytes() for name in ours)
  _init_from(first.output, family, str(tmp_path / "again"))
  second = writer.export_hf(str(tmp_path / "again"), str(tmp_path / "second"))
  assert first.files == second.files
  for name in first.files:
    with open(os.path.join(first.output, name), "rb") as a, open(
        os.path.join(second.output, name), "rb") as b:
      assert a.read() == b.read(), name


def test_a_fine_tuning_config_takes_a_rotary_sources_thetas_a_rotary_run_its_own(tmp_path):
  """A released ModernBERT's thetas (160,000 global, 10,000 local) go to a fine-tuning
  config; a ModernBERT config keeps its own (a context extension sets them)."""
  from encoderx import configs, initialize  # pylint: disable=g-import-not-at-top
  saved = str(tmp_path / "saved")
  tiny_hf.save_tiny_family("modernbert", saved, global_rope_theta=160_000.0,
                           local_rope_theta=10_000.0)
  for name, thetas in (("finetune:classify", (160_000.0, 10_000.0)),
                       ("modernbert:tiny", (10_000.0, 0.0))):
    config = configs.get(name)
    config.init_from = f"hf:{saved}"
    config = initialize.resolve_config(config)
    assert (config.model.embeddings.rope_theta, config.model.embeddings.local_rope_theta) == thetas, name


def test_a_directory_of_another_family_is_refused_in_one_line(tmp_path):
  """A ModernBERT directory given to EuroBERT's config, a BERT one to ModernBERT's (on
  the command line: one line, exit 2, before anything compiles)."""
  from encoderx import initialize, sources  # pylint: disable=g-import-not-at-top
  from encoderx.data import resources  # pylint: disable=g-import-not-at-top
  modernbert = str(tmp_path / "modernbert")
  tiny_hf.save_tiny_family("modernbert", modernbert)
  config = _tiny_config("eurobert:tiny")
  config.init_from = f"hf:{modernbert}"
  with pytest.raises(sources.InitError, match=r"\(modernbert\) is a modernbert model \(a "
                     r"byte_bpe vocabulary, layout 'bert'\); this config "
                     r"\(model.family='eurobert'\) trains byte_bpe vocabularies of the "
                     r"'eurobert' layout: .*configs/modernbert.py"):
    initialize.resolve_config(config)
  bert = tmp_path / "bert"
  engine.hf_model(small_model(vocab_size=100), "bert", "mlm").save_pretrained(bert)
  shutil.copy(resources.resolve(resources.BUNDLED_WORDPIECE_VOCAB), bert / "vocab.txt")
  result = subprocess.run(
      [sys.executable, "-m", "encoderx.train", "--config=configs/modernbert.py:tiny",
       f"--workdir={tmp_path / 'run'}", f"--init_from=hf:{bert}"],
      capture_output=True, text=True, cwd=REPO, timeout=300,
      env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
  assert result.returncode == 2, result.stderr
  assert result.stderr.strip().splitlines()[-1].startswith(
      f"encoderx: error: --init_from: hf:{bert} (bert) is a bert model (a wordpiece "
      "vocabulary, layout '-'); this config (model.family='modernbert')"), result.stderr
  assert not os.path.exists(tmp_path / "run" / "checkpoints")


@pytest.mark.parametrize("case", FAMILIES, ids=lambda case: case.name)
def test_configurations_the_family_cannot_represent_are_refused(case):
  model = small_model().with_fields(case.model)
  params = engine.from_hf(engine.hf_model(model, case.family).state_dict(), model,
                          case.family)
  refused = small_model().with_fields({**case.model, **case.refused})
  with pytest.raises(base.ConversionError, match=case.refused_match):
    engine.to_hf(params, refused, case.family)
  with pytest.raises(base.ConversionError, match=case.refused_match):
    engine.from_hf(engine.hf_model(model, case.family).state_dict(), refused, case.family)


TABLE = ("encoder_model", "embeddings", "word_embeddings", "embedding")


def test_a_padded_vocabulary_exports_its_real_rows_and_imports_them_padded(tmp_path):
  """model.vocab_multiple=128: roberta_tiny's 8,000 tokens get 8,064 rows here (make_run
  perturbs the padding rows off zero too, which the mask must make moot).
  RobertaForMaskedLM gets the 8,000 real rows and computes encoderx's logits on them;
  the .npz has 8,000 rows; reading the export back pads zero rows, and exporting that
  again gives the same bytes."""
  workdir = str(tmp_path / "run")
  method, params = make_run(_config("roberta:tiny", {"vocab_multiple": 128}), workdir)
  model = method.model_config
  assert (model.vocab_size, model.padded_vocab_size) == (8000, 8064)
  ours = flax.traverse_util.flatten_dict(params)
  vocabulary_params = (TABLE, ("mlm_head", "output_bias"))
  assert all(ours[path].shape[0] == 8064 and np.abs(ours[path][8000:]).max() > 0
             for path in vocabulary_params)
  exported = writer.export_hf(workdir, str(tmp_path / "hf"))
  diffs = check_export_parity(method, params, exported, method.vocabulary.pad_id)
  print("padded roberta export parity: "
        + ", ".join(f"{k} {v:.1e}" for k, v in diffs.items()))
  assert transformers.AutoConfig.from_pretrained(exported.output).vocab_size == 8000
  state_dict = hf_directory.read_state_dict(exported.output)
  assert state_dict["roberta.embeddings.word_embeddings.weight"].shape == (8000, 32)
  assert state_dict["lm_head.bias"].shape == (8000,)
  imported, head, _ = engine.import_state_dict(state_dict, model, "roberta")
  back = flax.traverse_util.flatten_dict(imported)
  for path in vocabulary_params:
    assert back[path].shape[0] == 8064 and not np.any(back[path][8000:])
    np.testing.assert_array_equal(back[path][:8000], ours[path][:8000])
  again = engine.to_hf(imported, model, "roberta", head)
  assert all(value.tobytes() == state_dict[name].tobytes() for name, value in again.items())
  output = str(tmp_path / "params.npz")
  writer.export_npz(workdir, output)
  with np.load(output) as arrays:
    assert arrays["/".join(TABLE)].shape == (8000, 32)
    assert arrays["mlm_head/output_bias"].shape == (8000,)


def test_a_run_the_family_cannot_represent_is_refused_and_nothing_written(tmp_path):
  workdir = str(tmp_path / "run")
  make_run(_config("bert:tiny", {"layout.sharing": "all"}), workdir)
  with pytest.raises(writer.ExportError, match="layout.sharing='all' has no Hugging Face"):
    writer.export_hf(workdir, str(tmp_path / "hf"))
  assert sorted(os.listdir(tmp_path)) == ["run"]


DECODER_TABLE = "encoder_model/embeddings/position_embeddings/embedding"


def test_a_deberta_run_with_the_enhanced_mask_decoder_exports_its_encoder_alone(tmp_path):
  """Hugging Face's DeBERTa MLM classes have no enhanced mask decoder: refused; the
  encoder (--head=base) exports, the decoder's position table and the MLM head named as
  left out."""
  workdir = str(tmp_path / "run")
  make_run(_config("deberta:tiny"), workdir)
  with pytest.raises(writer.ExportError, match="heads.enhanced_mask_decoder=True: Hugging Face "
                     "DeBERTa has no enhanced mask decoder"):
    writer.export_hf(workdir, str(tmp_path / "hf"))
  assert sorted(os.listdir(tmp_path)) == ["run"]
  bare = writer.export_hf(workdir, str(tmp_path / "base"), head="base")
  assert (bare.hf_class, bare.left_out) == ("DebertaV2Model", [DECODER_TABLE, "mlm_head"])


def test_a_deberta_v3_run_exports_its_discriminator_as_deberta_v2_model(tmp_path,
                                                                       austen_lines):
  """DeBERTa-v3 as released: the discriminator's encoder as DebertaV2Model, its
  replaced-token head and the position table it shares with the generator's decoder
  (which its encoder does not read) left out and named; Hugging Face computes its
  hidden states and its tokenizer gives its ids."""
  workdir = str(tmp_path / "run")
  method, params = make_run(_config("deberta:v3_tiny"), workdir)
  exported = writer.export_hf(workdir, str(tmp_path / "hf"))
  assert (exported.family, exported.hf_class) == ("deberta-v2", "DebertaV2Model")
  assert exported.left_out == [DECODER_TABLE, "rtd_head"]
  check_export_parity(method, method.transferable_params(params), exported,
                      method.vocabulary.pad_id)
  check_tokenizer(exported.output, method.vocabulary, austen_lines(TOKENIZER_LINES))


@pytest.mark.slow
def test_electra_over_modernbert_trains_and_exports_its_discriminator(tmp_path, caplog):
  """configs/modernbert.py:rtd_tiny (DeBERTa-v3's replaced-token detection over
  ModernBERT's encoder) trains a few steps; its discriminator exports as a
  ModernBertModel (the replaced-token head named as left out) that transformers loads
  and computes with encoderx's hidden states (fp32, 1e-4)."""
  from encoderx import sources, train  # pylint: disable=g-import-not-at-top
  from encoderx.methods import registry  # pylint: disable=g-import-not-at-top
  config = _config("modernbert:rtd_tiny")
  config.train.steps = 3
  workdir = str(tmp_path / "run")
  result = train.run(config, workdir, show_progress=False, devices=jax.devices()[:1])
  logged = result["history"][-1]
  assert np.isfinite(logged["loss"]) and "rtd_accuracy" in str(logged), logged
  exported = writer.export_hf(workdir, str(tmp_path / "hf"))
  assert (exported.family, exported.hf_class) == ("modernbert", "ModernBertModel")
  assert exported.left_out == ["rtd_head"]
  method = registry.build(sources.run_config(os.path.join(workdir, "config.json")))
  params = sources.open_source(workdir).load_params()  # the discriminator's, as trained
  diffs = check_export_parity(method, params, exported, method.vocabulary.pad_id)
  print(f"modernbert:rtd_tiny discriminator export parity: hidden {diffs['hidden']:.1e}")


def test_a_pooler_of_another_activation_is_refused():
  """ELECTRA's classifier applies GELU where BERT's pooler applies tanh
  (model.heads.pooler_act): neither family's class takes the other's."""
  model = small_model()
  params = engine.from_hf(engine.hf_model(model, "bert", "sequence_classification",
                                          num_labels=2).state_dict(), model)
  with pytest.raises(base.ConversionError, match="heads.pooler_act='gelu': "
                     "BertForSequenceClassification's pooler applies tanh"):
    engine.to_hf(params, model.replace(heads=dict(pooler_act="gelu")))


def test_weights_and_parameters_left_over_are_named():
  model = small_model()
  state_dict = engine.hf_model(model, "bert").state_dict()
  with pytest.raises(base.ConversionError, match=r"rule \(BertForPreTraining\): "
                     r"bert.encoder.layer.7.output.dense.weight"):
    engine.from_hf({**state_dict, "bert.encoder.layer.7.output.dense.weight": np.zeros(2)},
                   model)
  with pytest.raises(base.ConversionError, match="lack what BertForPreTraining has: "
                     "bert.encoder.layer.2.output.dense.weight"):
    engine.from_hf({k: v for k, v in state_dict.items()
                    if k != "bert.encoder.layer.2.output.dense.weight"}, model,
                   head="pretraining")
  params = engine.from_hf(state_dict, model)
  with pytest.raises(base.ConversionError, match="BertForPreTraining has no place for: "
                     "extra_head/kernel"):
    engine.to_hf({**params, "extra_head": {"kernel": np.zeros(2)}}, model)
  layers = params["encoder_model"]["encoder"]
  with pytest.raises(base.ConversionError, match="no place for: encoder_model/encoder/"
                     "layer_3/attention/layer_norm/bias, .*layer_3/ffn/output/bias"):
    engine.to_hf({**params, "encoder_model": {**params["encoder_model"], "encoder": {
        **layers, "layer_3": layers["layer_2"]}}}, model)


def classify_config(tmp_path, name: str, model: dict | None = None):
  config = _config(name, model)
  rows = "text\tlabel\n" + "".join(f"line {i} of the story\t{'yes' if i % 3 else 'no'}\n"
                                   for i in range(12))
  for split in ("train", "dev"):
    (tmp_path / f"{split}.tsv").write_text(rows)
  config.method = "classify"
  config.finetune.train_file = str(tmp_path / "train.tsv")
  config.finetune.dev_file = str(tmp_path / "dev.tsv")
  config.finetune.labels = ("no", "yes", "maybe")
  return config


@pytest.mark.parametrize("name", ["bert:tiny", "roberta:tiny", "deberta:tiny", "electra:tiny"])
def test_a_fine_tuned_classifier_exports_with_its_head_and_labels(tmp_path, name):
  workdir = str(tmp_path / "run")
  model = {"heads.enhanced_mask_decoder": False} if name == "deberta:tiny" else {}
  method, params = make_run(classify_config(tmp_path, name, model), workdir)
  exported = writer.export_hf(workdir, str(tmp_path / "hf"))
  prefix = {"bert:tiny": "Bert", "roberta:tiny": "Roberta", "deberta:tiny": "DebertaV2",
            "electra:tiny": "Electra"}[name]
  assert exported.hf_class == f"{prefix}ForSequenceClassification"
  loaded = transformers.AutoModelForSequenceClassification.from_pretrained(exported.output)
  assert loaded.config.id2label == {0: "no", 1: "yes", 2: "maybe"}
  assert loaded.config.label2id == {"no": 0, "yes": 1, "maybe": 2}
  check_export_parity(method, params, exported, method.vocabulary.pad_id)
  # The bare encoder on request: the classifier left out, and said so (and the pooler,
  # which DeBERTa's and ELECTRA's classification classes hold, not their encoders).
  bare = writer.export_hf(workdir, str(tmp_path / "base"), head="base")
  left_out = ["classifier"] + (["encoder_model/pooler"] if name in ("deberta:tiny",
                                                                     "electra:tiny") else [])
  assert (bare.hf_class, bare.left_out) == (f"{prefix}Model", left_out)


def test_a_fine_tuned_tagger_and_qa_model_export_with_their_heads(tmp_path):
  """The tag method's run -> BertForTokenClassification with its labels; the qa
  method's -> BertForQuestionAnswering; both compute what encoderx computes."""
  from finetune_cases import LABELS, QUESTIONS, qa_config, squad_json, tag_config  # pylint: disable=g-import-not-at-top
  tags = tmp_path / "tags.txt"
  tags.write_text("".join(f"w{i}\t{tag}\n" for i, tag in enumerate(LABELS)))
  squad_file = squad_json(tmp_path / "squad.json", QUESTIONS)
  for name, config, hf_class in (
      ("tag", tag_config(str(tags), str(tags)), "BertForTokenClassification"),
      ("qa", qa_config(squad_file, squad_file), "BertForQuestionAnswering")):
    config.model.init.range = 0.2
    method, params = make_run(config, str(tmp_path / name))
    exported = writer.export_hf(str(tmp_path / name), str(tmp_path / f"hf_{name}"))
    assert (exported.hf_class, exported.left_out) == (hf_class, [])
    if name == "tag":
      loaded = transformers.AutoModelForTokenClassification.from_pretrained(exported.output)
      assert loaded.config.id2label == dict(enumerate(method.labels))
    check_export_parity(method, params, exported, method.vocabulary.pad_id)


def test_npz_and_the_command_line(runs, tmp_path):
  workdir, _, params = runs(CASES[0])
  output = tmp_path / "params.npz"
  command = [sys.executable, "-m", "encoderx.export", f"--workdir={workdir}",
             f"--output={output}", "--format=npz", "--step=3"]
  env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
  result = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=300,
                          env=env)
  assert result.returncode == 0, result.stderr
  assert "wrote npz (bert)" in result.stdout
  with np.load(output) as arrays:
    flat = flax.traverse_util.flatten_dict(params)
    assert set(arrays.files) == {"/".join(k) for k in flat}
    for key, value in flat.items():
      np.testing.assert_array_equal(arrays["/".join(key)], value)
  # Errors are one line naming the problem; nothing is overwritten.
  result = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=300,
                          env=env)
  assert result.returncode == 2
  assert result.stderr.strip().splitlines()[-1] == (
      f"encoderx: error: --output: '{output}' exists; name a new file (nothing is "
      "overwritten).")
  with pytest.raises(writer.ExportError, match="checkpoints/7' does not exist"):
    writer.export_npz(workdir, str(tmp_path / "other.npz"), step=7)
  with pytest.raises(writer.ExportError, match="family 'bert' has no class for 'qa'"):
    writer.export_hf(workdir, str(tmp_path / "hf"), head="qa")

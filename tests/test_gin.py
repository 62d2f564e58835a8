"""gin as the second syntax of the config schema (encoderx/gin_config.py): every config
file reached from gin, bindings, one-line errors."""
import importlib
import os
import re
import subprocess
import sys

import pytest

from encoderx import errors
from encoderx import config as config_lib
from encoderx import configs
from encoderx import gin_config
from encoderx import train
from conftest import REPO

# Every shipped config of a run: (file, variant). configs/glue.py holds the recipes of a
# GLUE sweep (python -m encoderx.glue --recipe), not runs' configs.
CONFIGS = [(path.stem, variant)
           for path in sorted((REPO / "configs").glob("*.py"))
           if path.stem not in ("__init__", "common", "glue")
           for variant in importlib.import_module(f"encoderx.configs.{path.stem}").VARIANTS]


def _python_config(spec):
  return configs.get(spec)


def _gin_config(spec, bindings=()):
  """The config `spec` ('family:variant') reached from gin alone."""
  family, variant = spec.split(":")
  return gin_config.apply(None, bindings=[f"base.config = 'configs/{family}.py:{variant}'",
                                          *bindings])


def _fields(config) -> dict:
  """Every leaf field of a config by its dotted name."""
  fields = {}

  def visit(prefix, value):
    if isinstance(value, dict):
      for key, child in value.items():
        visit(f"{prefix}{key}.", child)
    else:
      fields[prefix[:-1]] = value
  visit("", config.to_dict())
  return fields


def _differences(got, want) -> list[str]:
  got, want = _fields(got), _fields(want)
  return [f"{name}: {got.get(name)!r} != {want.get(name)!r}"
          for name in sorted(set(got) | set(want)) if got.get(name) != want.get(name)]


@pytest.mark.parametrize("family,variant", CONFIGS)
def test_every_config_written_as_gin_reads_back_field_by_field(family, variant,
                                                               monkeypatch):
  """A config written as gin (`python -m encoderx.gin_config`'s bindings: the fields that
  differ from the defaults) and read back from gin alone is the ml_collections config it
  came from, field by field. Two fields are changed from the file first, so that the file
  read again cannot pass for the round trip; and gin reaches the file itself
  (base.config) with those fields bound."""
  monkeypatch.chdir(REPO)
  from_file = _python_config(f"{family}:{variant}")
  config = _python_config(f"{family}:{variant}")
  config.train.steps += 1
  config.optimizer.learning_rate *= 3
  assert [d.split(":")[0] for d in _differences(from_file, config)] == [
      "optimizer.learning_rate", "train.steps"]
  written = gin_config.to_gin(config)
  assert f"train.steps = {config.train.steps}" in written
  assert not _differences(gin_config.apply(None, bindings=[written]), config)
  changed = [f"train.steps = {config.train.steps}",
             f"optimizer.learning_rate = {config.optimizer.learning_rate!r}"]
  assert not _differences(_gin_config(f"{family}:{variant}", changed), config)


def test_gin_and_ml_collections_bert_base_write_the_same_config_json(tmp_path, monkeypatch):
  """What a run records (train.loop._write_config: config.json), from either front end."""
  monkeypatch.chdir(REPO)
  for front, config in (("gin", _gin_config("bert:base")),
                        ("ml_collections", _python_config("bert:base"))):
    train.loop._write_config(config_lib.validate(config), str(tmp_path / front))
  written = (tmp_path / "gin" / "config.json").read_bytes()
  assert written == (tmp_path / "ml_collections" / "config.json").read_bytes()
  assert b'"vocab_size": 30522' in written and b'"long_fraction": 0.1' in written


def test_bindings_apply_after_files_and_the_base_config(tmp_path):
  base = _python_config("bert:tiny")
  shared = tmp_path / "shared.gin"
  shared.write_text(f"base.config = '{REPO / 'configs' / 'bert.py'}:tiny'\n")
  own = tmp_path / "own.gin"
  # An include, a macro, a full and a short name, a list for a tuple field.
  own.write_text(f"include '{shared}'\n"
                 "STEPS = 7\ntrain.steps = %STEPS\n"
                 "encoderx.config.data.vocab.lower_case = False\n"
                 "mlm.rate = 0.2\nobjective.names = ['mlm']\n")
  config = gin_config.apply(None, files=[str(own)],
                            bindings=["train.steps = 9", "config.method = 'pretrain'"])
  assert config.train.steps == 9  # the binding after the file's macro
  assert not config.data.vocab.lower_case and config.objective.mlm.rate == 0.2
  assert config.objective.names == ("mlm",)
  assert config.model.hidden_size == base.model.hidden_size == 128
  assert base.train.steps == 1000  # the base config is not changed
  # --config and base.config at once: which one is meant is unclear.
  with pytest.raises(errors.ConfigError, match=r"base\.config.*--config gave the base"):
    gin_config.apply(base, files=[str(own)])
  with pytest.raises(errors.ConfigError, match=r"no config file 'configs/bert_tiny.py'"):
    gin_config.apply(None, bindings=["base.config = 'configs/bert_tiny.py'"])


@pytest.mark.parametrize("binding,moved", [
    ("model.local_attention = 8", "'model.local_attention' is now 'model.attention.window'"),
    ("model.attention = 'standard'", "'model.attention' is now 'model.attention.variant'"),
])
def test_a_flat_model_field_names_its_group(binding, moved):
  """A model field that moved into its group (a field that became a group too) stops
  with the one line a --config flag gets; the new name binds."""
  with pytest.raises(errors.ConfigError, match=re.escape(moved)):
    gin_config.apply(config_lib.default_config(), bindings=[binding])
  config = gin_config.apply(config_lib.default_config(),
                            bindings=["model.attention.window = 8"])
  assert config.model.attention.window == 8


@pytest.mark.parametrize("binding,field", [
    ("model.hiden_size = 3", "model.hiden_size"),  # a misspelt parameter
    ("modle.hidden_size = 3", "modle.hidden_size"),  # a misspelt group
    ("vocab.kid = 'x'", "data.vocab.kid"),  # under a short name
    ("config.methd = 'x'", "methd"),  # a top-level field
])
def test_unknown_names_fail_as_a_misspelt_config_flag_does(binding, field, tmp_path):
  expected = config_lib.unknown_field(field)
  assert expected and "did you mean" in expected
  with pytest.raises(errors.ConfigError) as raised:
    gin_config.apply(config_lib.default_config(), bindings=[binding])
  assert str(raised.value) == expected
  in_a_file = tmp_path / "typo.gin"
  in_a_file.write_text(f"# a comment\ntrain.steps = 5\n{binding}\n")
  with pytest.raises(errors.ConfigError) as raised:
    gin_config.apply(config_lib.default_config(), files=[str(in_a_file)])
  assert str(raised.value) == expected


@pytest.mark.parametrize("binding,message", [
    ("model.hidden_size = 'wide'", "config field 'model.hidden_size': gin binds 'wide'"),
    ("eval/train.steps = 1", "gin scopes are not part of the config schema"),
    ("train.steps = (3", "gin: "),
])
def test_bad_bindings_fail_in_one_line(binding, message):
  with pytest.raises(errors.ConfigError) as raised:
    gin_config.apply(config_lib.default_config(), bindings=[binding])
  assert str(raised.value).startswith(message) and "\n" not in str(raised.value)


def test_to_gin_round_trips_a_changed_config():
  config = _python_config("electra:small")
  config.finetune.labels = ("no", "yes")
  config.data.document_marker = r"^\s*Chapter"
  text = gin_config.to_gin(config)
  assert text.startswith("config.method = 'electra'\n")
  again = gin_config.apply(config_lib.default_config(), bindings=[text])
  assert again.to_json_best_effort() == config.to_json_best_effort()


def test_command_line_reports_a_misspelt_gin_binding_in_one_line(tmp_path):
  workdir = tmp_path / "run"
  own = tmp_path / "own.gin"
  own.write_text("base.config = 'configs/bert.py:tiny'\ntrain.steps = 5\n")
  cli = subprocess.run(
      [sys.executable, "-m", "encoderx.train", f"--gin_file={own}",
       "--gin_bindings=model.hiden_size = 3", f"--workdir={workdir}"],
      cwd=REPO, capture_output=True, text=True, timeout=300,
      env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert cli.returncode == 2, cli.stderr
  assert cli.stderr.strip().splitlines()[-1] == (
      "encoderx: error: unknown config field 'model.hiden_size' "
      "(did you mean 'model.hidden_size'?)")
  assert not workdir.exists()

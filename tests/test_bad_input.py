"""Bad input stops a run before anything is compiled or written, with one line saying what
is wrong and what to do: batch sizes and meshes that do not fit the devices, unusable
work directories, --resume where there is nothing to resume. Also the inputs that used to
go wrong quietly: one document per line, and WordPiece vocabularies of Chinese text."""
import logging
import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest
from absl import flags
from conftest import REPO, xla_flags_with_devices
import tiny_hf  # pylint: disable=g-bad-import-order  (tests/ is on sys.path)

from encoderx import cli, errors
from encoderx import checkpoint as checkpoint_lib
from encoderx import config as config_lib
from encoderx import train
from encoderx import workdir as workdir_lib
from encoderx.data import corpus, tasks, vocabulary as vocabulary_lib
from encoderx.train import trainer as trainer_lib

ONE_DEVICE = jax.devices()[:1]


@pytest.mark.parametrize("fields, message", [
    ({"train.batch_size": 12},
     r"'train\.batch_size': 12 is not divisible by the 8 data-parallel devices \(mesh data=8 "
     r"x fsdp=1\)\. Use a multiple of 8\."),
    ({"eval.batch_size": 20}, r"'eval\.batch_size': 20 is not divisible by the 8 "),
    ({"train.grad_accum_steps": 2},
     r"'train\.grad_accum_steps': splits the batch of 8 into micro-batches of 4, which "
     r"is not divisible by the 8 data-parallel devices"),
    ({"mesh.data": 2, "mesh.fsdp": 2, "mesh.tensor": 2, "train.batch_size": 6},
     r"'train\.batch_size': 6 is not divisible by the 4 data-parallel devices \(mesh data=2 x "
     r"fsdp=2\)"),
    ({"mesh.data": 3}, r"config field 'mesh': data=3 x fsdp=1 x tensor=1 needs 3 devices; 8 "
                       r"are available\. Choose sizes whose product is 8"),
    ({"mesh.data": -1, "mesh.tensor": 3},
     r"'mesh': data=-1 x fsdp=1 x tensor=3: the 8 devices do not divide by the fixed axes' "
     r"product 3"),
])
def test_batches_and_meshes_that_do_not_fit_the_devices_fail_before_building(
    tiny_config, fields, message):
  config = tiny_config()
  for field, value in fields.items():
    section, name = field.split(".")
    config[section][name] = value
  with pytest.raises(errors.ConfigError, match=message):
    trainer_lib.Trainer(config)  # all 8 devices


@pytest.fixture
def no_compiling(monkeypatch):
  """Fails the test if a run gets as far as building its state."""
  def fail(*args, **kwargs):
    raise AssertionError("the run got as far as building its state")
  monkeypatch.setattr(trainer_lib.Trainer, "init_state", fail)
  monkeypatch.setattr(trainer_lib.Trainer, "abstract_state_with_shardings", fail)


def _run(config, workdir, **kwargs):
  return train.run(config, str(workdir), show_progress=False, devices=ONE_DEVICE, **kwargs)


@pytest.fixture
def read_only_directory(tmp_path):
  """A directory that cannot be written to: a read-only tmpfs as root (whom permission
  bits do not stop), else permission bits."""
  path = tmp_path / "read_only"
  path.mkdir()
  if os.geteuid() != 0:
    path.chmod(0o555)
    yield path
    path.chmod(0o755)
    return
  mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(path)],
                           capture_output=True, text=True)
  if mounted.returncode:
    pytest.skip(f"cannot mount a read-only tmpfs as root here: {mounted.stderr.strip()}")
  yield path
  subprocess.run(["umount", "-l", str(path)], check=False)


def test_unusable_work_directories_fail_before_compiling(tiny_config, tmp_path,
                                                         read_only_directory, no_compiling):
  a_file = tmp_path / "a_file"
  a_file.write_text("not a directory")
  with pytest.raises(workdir_lib.WorkdirError,
                     match=rf"^'{a_file}' is a file, not a directory") as refused:
    _run(tiny_config(), a_file)
  assert refused.value.argument == "workdir"  # the command line's --workdir
  assert a_file.read_text() == "not a directory"
  with pytest.raises(workdir_lib.WorkdirError,
                     match=rf"^'{read_only_directory / 'run'}' is not writable "
                           r"\((Read-only file system|Permission denied)\)"):
    _run(tiny_config(), read_only_directory / "run")


def test_resume_where_there_is_no_checkpoint_is_refused_unless_allowed(tiny_config, tmp_path,
                                                                       caplog):
  config = tiny_config()
  config.train.steps, config.optimizer.warmup_steps, config.eval.batches = 2, 1, 1
  config.model.num_layers = 1  # what is refused or allowed does not depend on the model
  with pytest.raises(checkpoint_lib.NothingToResume,
                     match=rf"^{tmp_path / 'typo'} holds no checkpoint to resume\. "
                           r"Check the path; .* allow a fresh start\.$") as refused:
    _run(config, tmp_path / "typo", resume=True)
  assert not (tmp_path / "typo").exists(), "nothing is created"
  # The library names no flag; the train command's line names both.
  train_flags = flags.FlagValues()
  for name in ("resume", "allow_fresh_start"):
    flags.DEFINE_bool(name, False, "", flag_values=train_flags)
  assert re.fullmatch(rf"--resume: {tmp_path / 'typo'} holds no checkpoint to resume\. "
                      r"Check the path; .* allow a fresh start \(--allow_fresh_start\)\.",
                      cli.command_line_message(refused.value, train_flags))
  with caplog.at_level(logging.INFO, logger="encoderx"):
    result = _run(config, tmp_path / "new", resume=True, allow_fresh_start=True)
  assert result["step"] == 2
  assert "none to resume there: a fresh start, as allowed" in caplog.text


def test_command_line_reports_a_mesh_that_does_not_fit_in_one_line(tmp_path):
  config = f"{REPO / 'configs' / 'bert.py'}:tiny"
  env = {**os.environ, "XLA_FLAGS": xla_flags_with_devices(8)}
  cli = subprocess.run([sys.executable, "-m", "encoderx.train", f"--config={config}",
                        f"--workdir={tmp_path / 'run'}", "--config.mesh.data=3"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=300, env=env)
  assert cli.returncode == 2
  assert ("encoderx: error: config field 'mesh': data=3 x fsdp=1 x tensor=1 needs 3 "
          "devices; 8 are available.") in cli.stderr
  assert "Traceback" not in cli.stderr
  assert not (tmp_path / "run").exists()


def _cut_short(path) -> None:
  path.write_bytes(path.read_bytes()[:path.stat().st_size // 2])


def test_hugging_face_weights_cut_short_stop_in_one_line(tmp_path):
  """An interrupted download (model.safetensors cut short) given to --init_from=hf:
  stops in one line naming the file, exit 2, before anything is written; a
  pytorch_model.bin cut short too (torch's zip format when the source is opened, its
  legacy format when the weights are read)."""
  transformers = pytest.importorskip("transformers")
  torch = pytest.importorskip("torch")
  from encoderx import sources  # pylint: disable=g-import-not-at-top
  directory = tmp_path / "hf"
  source = tiny_hf.save_tiny_bert(directory, transformers.BertForMaskedLM)
  state_dict = {name: value.clone() for name, value in  # not mapped from the file cut
                transformers.BertForMaskedLM.from_pretrained(directory).state_dict().items()}
  _cut_short(directory / "model.safetensors")
  cli = subprocess.run([sys.executable, "-m", "encoderx.train",
                        f"--config={REPO / 'configs' / 'bert.py'}:tiny",
                        f"--workdir={tmp_path / 'run'}", f"--init_from={source}",
                        "--config.data.seq_length=64"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=300)
  assert cli.returncode == 2, cli.stderr
  assert re.fullmatch(
      rf"encoderx: error: --init_from: '{re.escape(str(directory / 'model.safetensors'))}' "
      r"cannot be read "
      r"\(.*\): it is cut short \(an interrupted download\?\) or damaged; download it "
      r"again\.", cli.stderr.strip().splitlines()[-1]), cli.stderr
  assert "Traceback" not in cli.stderr
  assert not (tmp_path / "run").exists()  # nothing written
  (directory / "model.safetensors").unlink()
  for zipped in (True, False):
    torch.save(state_dict, directory / "pytorch_model.bin",
               _use_new_zipfile_serialization=zipped)
    _cut_short(directory / "pytorch_model.bin")
    with pytest.raises(sources.InitError, match=r"pytorch_model.bin' cannot be read "
                       r"\(.*\): it is cut short"):
      sources.open_source(source).load_params()


# --- one document per line ----------------------------------------------------------------------
def test_one_document_per_line(tiny_config, tmp_path):
  path = tmp_path / "dump.txt"
  path.write_text("First article. It has two sentences.\n\n  Second   article.\n"
                  "Third article, right after the second.\n")
  documents = list(corpus.read_documents(
      [str(path)], corpus.CorpusFormat(document_per_line=True)))
  assert documents == [["First article. It has two sentences."], ["Second article."],
                       ["Third article, right after the second."]]
  config = tiny_config("roberta:tiny")  # packed rows: one document per split is enough
  config.data.files = str(path)
  config.data.document_marker = ""  # the bundled corpus's chapter marker
  config.data.document_per_line = True
  config.data.eval_every_nth_document = 3
  config_lib.validate(config)
  assert tasks.check_text_corpus(config) == {"train": 2, "validation": 1}
  config.data.sentence_per_line = True
  with pytest.raises(errors.ConfigError, match=r"'data\.document_per_line': makes each "
                     r"line a document; it cannot be combined with data\.document_marker"):
    config_lib.validate(config)


# --- WordPiece vocabularies of Chinese text ---------------------------------------------------
def _chinese_text(path, characters=2000, total=60_000, seed=0):
  """Text whose characters follow Zipf's law over `characters` CJK ideographs (Chinese
  text's character frequencies are close to Zipfian), in sentences of 8-30 characters
  ending with '。', a sentence a line."""
  rng = np.random.default_rng(seed)
  alphabet = np.array([chr(0x4E00 + i) for i in range(characters)])
  weights = 1.0 / np.arange(1, characters + 1)
  drawn = alphabet[rng.choice(characters, size=total, p=weights / weights.sum())]
  lines, start = [], 0
  while start < total:
    length = int(rng.integers(8, 31))
    lines.append("".join(drawn[start:start + length]) + "。")
    start += length
  path.write_text("\n".join(lines) + "\n", encoding="utf-8")
  return lines


def _unknown_rate(vocabulary, lines):
  ids = [i for line in lines for i in vocabulary.encode(line)]
  return sum(i == vocabulary.unk_id for i in ids) / len(ids)


def test_wordpiece_alphabet_is_sized_from_the_corpus(tmp_path, caplog):
  lines = _chinese_text(tmp_path / "zh.txt")
  with caplog.at_level(logging.INFO, logger="encoderx"):
    vocabulary = vocabulary_lib.train_wordpiece([str(tmp_path / "zh.txt")],
                                                str(tmp_path / "vocab.txt"), vocab_size=6000)
  # Every character seen at least twice is in the vocabulary (the trainer's default
  # alphabet of 1,000 left the rest [UNK]: 8% of this text).
  counts = {}
  for line in lines:
    for character in line:
      counts[character] = counts.get(character, 0) + 1
  frequent = {c for c, n in counts.items() if n >= 2}
  assert frequent <= set(vocabulary.tokens)
  assert _unknown_rate(vocabulary, lines[::20]) < 0.01
  logged = re.search(r"\[UNK\] is ([0-9.]+)% of the tokens of (\d+) sampled lines",
                     caplog.text)
  assert logged and float(logged[1]) < 1.0 and int(logged[2]) == min(len(lines), 5000)
  assert "WARNING" not in caplog.text

  caplog.clear()
  with caplog.at_level(logging.INFO, logger="encoderx"):
    small = vocabulary_lib.train_wordpiece([str(tmp_path / "zh.txt")],
                                           str(tmp_path / "small.txt"), vocab_size=300)
  assert _unknown_rate(small, lines[::20]) > 0.01
  assert any(r.levelno == logging.WARNING and "above 1%" in r.getMessage()
             and "use a larger --size" in r.getMessage() for r in caplog.records)

"""launch/tpu.sh in dry-run mode: the gcloud commands it would run, and the training
command it starts on every worker (run here by bash as a worker's shell would); and
launch/gpu_bench.py (encoderx/tools/speed/gpu_bench.py) on CPU."""
import json
import os
import re
import shlex
import subprocess
import sys
import time

import pytest

from conftest import REPO
from encoderx.tools.speed import attention_checks, gpu_bench

SCRIPT = REPO / "launch" / "tpu.sh"
TRAIN_ARGS = ["--config=configs/bert.py:base", "--workdir=gs://bucket/runs/bert_base",
              "--config.data.files=gs://bucket/corpus/*.txt", "--config.mesh.fsdp=4",
              "--gin_bindings=train.steps = 5", "--config.data.document_marker=^it's $HOME"]


def _dry_run(tmp_path, *options, train_args=TRAIN_ARGS):
  """(exit status, stdout lines as argv lists, stderr); gcloud and git on PATH are stubs
  that record any call, so that a dry run that ran something fails."""
  stubs = tmp_path / "bin"
  stubs.mkdir(exist_ok=True)
  for tool in ("gcloud", "git"):
    (stubs / tool).write_text(f"#!/bin/sh\necho {tool} >> {tmp_path}/ran\nexit 1\n")
    (stubs / tool).chmod(0o755)
  result = subprocess.run(
      ["bash", str(SCRIPT), "--dry_run", *options, "--", *train_args], capture_output=True,
      text=True, env={**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}"}, timeout=60)
  assert not (tmp_path / "ran").exists(), "a dry run ran a command"
  return result.returncode, [shlex.split(line) for line in result.stdout.splitlines()], \
      result.stderr


def test_a_tpu_vm_is_created_installed_run_on_every_worker_and_deleted(tmp_path):
  code, commands, _ = _dry_run(tmp_path, "--name=bert-base", "--zone=us-central2-b",
                               "--type=v4-32", "--project=my-project")
  assert code == 0
  where = ["--zone=us-central2-b", "--project=my-project"]
  tpu_vm = ["gcloud", "compute", "tpus", "tpu-vm"]
  create, archive, copy, install, start, follow, status, delete = commands
  assert create == [*tpu_vm, "create", "bert-base", *where, "--accelerator-type=v4-32",
                    "--version=tpu-ubuntu2204-base"]
  assert archive[:2] == ["git", "archive"] and archive[-1] == "HEAD"
  tarball = archive[-2].removeprefix("--output=")
  assert copy == [*tpu_vm, "scp", tarball, "bert-base:encoderx.tar.gz", *where, "--worker=all"]
  for command, worker in ((install, "all"), (start, "all"), (follow, "0"), (status, "all")):
    assert command[:-1] == [*tpu_vm, "ssh", "bert-base", *where, f"--worker={worker}",
                            "--command"]
  assert "bash launch/setup.sh" in install[-1] and '"jax[tpu]==0.10.2"' in install[-1]
  assert "encoderx-train.log" in follow[-1] and "tail" in follow[-1]
  assert delete == [*tpu_vm, "delete", "bert-base", *where, "--quiet"]


def test_a_queued_spot_v5e_slice_is_waited_for_and_kept(tmp_path):
  code, commands, _ = _dry_run(tmp_path, "--name=n", "--zone=z", "--type=v5e-16",
                               "--queued", "--spot", "--keep")
  assert code == 0
  assert commands[0] == ["gcloud", "compute", "tpus", "queued-resources", "create", "n",
                         "--node-id=n", "--zone=z", "--accelerator-type=v5litepod-16",
                         "--runtime-version=v2-alpha-tpuv5-lite", "--spot"]
  assert commands[1][:6] == ["gcloud", "compute", "tpus", "queued-resources", "describe", "n"]
  assert not any("delete" in command for command in commands)  # --keep


def test_the_workers_run_exactly_the_training_flags_given(tmp_path):
  """The start command, run by bash in a home with a stand-in for the worker's Python,
  passes every flag through untouched (globs, spaces, quotes, $)."""
  _, commands, _ = _dry_run(tmp_path, "--name=n", "--zone=z", "--type=v4-8", "--keep")
  start = next(c[-1] for c in commands if "encoderx.train" in c[-1])
  home = tmp_path / "home"
  python = home / "encoderx" / ".venv" / "bin" / "python"
  python.parent.mkdir(parents=True)
  python.write_text(f"#!/bin/sh\nfor a in \"$@\"; do printf '%s\\n' \"$a\"; done > {home}/argv\n")
  python.chmod(0o755)
  subprocess.run(["bash", "-c", start], cwd=home, env={**os.environ, "HOME": str(home)},
                 check=True, timeout=30)
  rc = home / "encoderx-train.rc"
  deadline = time.time() + 30
  while not rc.exists() and time.time() < deadline:
    time.sleep(0.1)
  assert rc.read_text().strip() == "0"
  assert (home / "argv").read_text().splitlines() == ["-m", "encoderx.train", *TRAIN_ARGS]


def test_missing_arguments_are_named(tmp_path):
  code, _, stderr = _dry_run(tmp_path, "--name=n", "--type=v4-8")
  assert code == 2 and "--zone is required" in stderr
  code, _, stderr = _dry_run(tmp_path, "--name=n", "--zone=z", "--type=v4-8", train_args=[])
  assert code == 2 and "give the training flags after --" in stderr
  code, _, stderr = _dry_run(tmp_path, "--name=n", "--zone=z", "--type=v9-8")
  assert code == 2 and "no default runtime for --type=v9-8" in stderr


def test_a_queued_resource_that_fails_stops_the_wait_and_is_deleted(tmp_path):
  """Not a dry run: gcloud is a stub whose queued resource ends FAILED. The script stops
  waiting with a message, runs nothing more, and deletes the resource."""
  stubs = tmp_path / "bin"
  stubs.mkdir()
  (stubs / "gcloud").write_text(
      f"#!/bin/sh\necho \"$*\" >> {tmp_path}/calls\n"
      "case \"$*\" in *describe*) echo FAILED ;; esac\n")
  (stubs / "gcloud").chmod(0o755)
  result = subprocess.run(
      ["bash", str(SCRIPT), "--name=n", "--zone=z", "--type=v4-8", "--queued", "--",
       *TRAIN_ARGS], capture_output=True, text=True, timeout=60,
      env={**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}"})
  assert result.returncode == 1
  assert "the queued resource n is FAILED" in result.stderr
  calls = (tmp_path / "calls").read_text().splitlines()
  assert [call.split()[3] for call in calls] == ["create", "describe", "delete"]


# Runs launch/gpu_bench.py (argv after the probe) where the text stack cannot be imported,
# as on a GPU image without it (nor grain, which the lent H100/H200 image lacks); prints the
# imports of them that were tried (none may be).
WITHOUT_TEXT_STACK = """
import importlib.abc, importlib.machinery, runpy, sys
TEXT_STACK = ("tensorflow", "tensorflow_text", "seqio", "tensorflow_datasets", "grain")
class NotInstalled(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  def find_spec(self, name, path, target=None):  # no origin: nothing to look at
    if name.split(".")[0] in TEXT_STACK:
      return importlib.machinery.ModuleSpec(name, self)
  attempted = []
  def create_module(self, spec):
    self.attempted.append(spec.name)
    raise ModuleNotFoundError(f"No module named {spec.name!r}", name=spec.name)
  def exec_module(self, module):
    pass
sys.meta_path.insert(0, NotInstalled())
from encoderx.models import attention_kernels  # the Pallas kernel runs interpreted on CPU
attention_kernels.interpret_off_platform = True
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
print("text stack imports attempted:", NotInstalled.attempted)
"""


@pytest.mark.slow
def test_gpu_bench_runs_the_bench_rows_without_the_text_stack(tmp_path, monkeypatch):
  """launch/gpu_bench.py: batches recorded with the real pipeline (two families, each its
  vocabulary), then the bench's accelerator rows and `all` run in a process where
  tensorflow, tensorflow_text and seqio cannot be imported (as on a GPU image without
  them): here on CPU, tiny models. `rows` runs the Pallas kernel's row at the config's
  dropout (the XLA path's row at that dropout is `all`'s first)."""
  script = str(REPO / "launch" / "gpu_bench.py")
  env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
  plan = "bert_tiny@64:2,modernbert_tiny@128:2"
  recorded = subprocess.run([sys.executable, script, "record", str(tmp_path), plan],
                            capture_output=True, text=True, env=env, timeout=300, cwd=REPO)
  assert recorded.returncode == 0, recorded.stderr
  assert (tmp_path / "batches_bert_64.npz").exists()
  assert (tmp_path / "batches_modernbert_128.npz").exists()
  assert set(json.loads((tmp_path / "vocabulary.json").read_text())) == {
      "bundled:austen-wordpiece", "bundled:austen-modernbert-bpe"}
  ran = subprocess.run(
      [sys.executable, "-c", WITHOUT_TEXT_STACK, script, "rows", str(tmp_path),
       "bert_tiny@64", "--batch_size=2", "--skip_torch", "--dropouts=config",
       "--kernels=pallas"], capture_output=True, text=True, env=env, timeout=300,
      cwd=REPO)
  assert ran.returncode == 0, ran.stderr
  assert "text stack imports attempted: []" in ran.stdout
  assert "bert_tiny @64, attention dropout 0.1, pallas kernel" in ran.stdout
  out = tmp_path / "out"
  every = subprocess.run(
      [sys.executable, "-c", WITHOUT_TEXT_STACK, script, "all", str(tmp_path), plan,
       f"--out={out}"], capture_output=True, text=True, env=env, timeout=600, cwd=REPO)
  assert every.returncode == 0, every.stderr
  assert "text stack imports attempted: []" in every.stdout
  record = json.loads((out / "gpu_bench.json").read_text())
  assert [row["model"] for row in record["rows"]] == [
      "bert_tiny @64, attention dropout 0.1", "bert_tiny @64, attention dropout 0",
      "modernbert_tiny @128, attention dropout 0"]
  assert all(row["jax_over_torch"] > 0 for row in record["rows"])  # PyTorch beside each
  (contraction,) = record["tables"]["kernel_gradient_cost"]
  assert contraction["contract_ms"] > 0 and contraction["jax_order_ms"] > 0
  assert record["command"].startswith("python launch/gpu_bench.py all ")
  assert list((out / "traces").glob("*.json.gz"))  # the profile's trace
  # A length not recorded is named (in this process: the command's main, which points
  # pretraining at the recordings, put back after the test).
  from encoderx.methods import pretrain  # pylint: disable=g-import-not-at-top
  for name in ("build_vocabulary", "validate_data"):
    monkeypatch.setattr(pretrain, name, getattr(pretrain, name))
  with pytest.raises(SystemExit, match="no recorded batches of bert at length 128"):
    gpu_bench.main(["rows", str(tmp_path), "bert_tiny@128", "--batch_size=2",
                    "--skip_torch", "--dropouts=0"])


def test_gpu_bench_all_times_a_row_without_dropout_only_where_the_config_has_dropout():
  """`all`'s first item: BERT (attention dropout 0.1) gets a row with it and one without;
  ModernBERT (none) one row, not the same row twice."""
  assert gpu_bench.first_item_dropouts(("bert_tiny", 64, 2)) == [None, 0.0]
  assert gpu_bench.first_item_dropouts(("modernbert_tiny", 128, 2)) == [None]


def test_gpu_bench_tunes_the_attention_kernels_tiling(capsys):
  """`launch/gpu_bench.py tune` (attention_checks.tune): each candidate tiling checked
  against the XLA reference and timed, the fastest returned (two forward and two backward
  candidates, small heads, the kernel interpreted here); the command line's shape and the
  recordings it needs."""
  from encoderx.models import flash_attention
  best = attention_checks.tune((2, 64, 2, 32), forward_tilings=((64, 4, 3), (32, 4, 2)),
                        backward_tilings=((32, 4, 2), (64, 4, 3)), chain=2, runs=1)
  out = capsys.readouterr().out
  assert isinstance(best, flash_attention.Tiling) and f"fastest: {best}" in out
  assert (best.block, best.forward_warps, best.forward_stages) in ((64, 4, 3), (32, 4, 2))
  tried = re.findall(r"relative error ([\d.e+-]+)", out)
  # 2 forwards, then the backwards that fit the fastest forward's block (1 or 2)
  assert len(tried) == 3 + (best.block == 64) and all(float(e) < 2e-2 for e in tried)
  assert gpu_bench.parse_args(["tune", "--shape=2,64,2,32"]).shape == (2, 64, 2, 32)
  for bad in (["rows"], ["tune", "--shape=2,64"]):
    with pytest.raises(SystemExit):
      gpu_bench.parse_args(bad)


def test_gpu_bench_checks_and_times_the_attention_kernel(capsys):
  """gpu_bench's device check of the Pallas attention (against its XLA
  reference, relative errors printed) and its timing of the attentions (calls chained in
  one jit), run here on small heads with the kernel interpreted."""
  attention_checks.check_flash_attention(shape=(2, 64, 2, 32), timed_shapes=[(2, 64, 2, 32)])
  out = capsys.readouterr().out
  errors = [float(word.rstrip(",")) for word in out.split("relative error:")[1]
            .splitlines()[0].split()[1::2]]
  assert len(errors) == 4 and all(0 <= e < 2e-2 for e in errors), out
  timed = re.findall(r"forward ([\d.]+), forward \+ backward ([\d.]+)", out)
  assert len(timed) == 4, out  # XLA with dropout, cuDNN's path, the kernel at 0.1 and 0
  assert all(float(forward) > 0 and float(both) > 0 for forward, both in timed), out

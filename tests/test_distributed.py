"""Runs of several processes (encoderx/distributed.py): the settings, and two processes of
4 CPU devices each training together on one machine (a localhost coordinator)."""
import json
import os
import re
import socket
import subprocess
import sys

import pytest

from conftest import REPO
from encoderx import config as config_lib
from encoderx import distributed


@pytest.fixture
def no_environment(monkeypatch):
  for variable in distributed.ENVIRONMENT.values():
    monkeypatch.delenv(variable, raising=False)


def test_one_process_initializes_nothing(no_environment):
  assert not distributed.initialize()  # not a TPU VM, no coordinator
  assert not distributed.initialize("localhost:1234", 1, 0)  # a "cluster" of one


@pytest.mark.parametrize("settings,message", [
    (dict(coordinator_address="localhost:1234"),
     "flag --num_processes: (or JAX_NUM_PROCESSES) is missing"),
    (dict(num_processes=2, process_id=0),
     "flag --coordinator_address: (or JAX_COORDINATOR_ADDRESS) is missing"),
    (dict(coordinator_address="h:1", num_processes=2, process_id=2),
     "flag --process_id: 2 is not in [0, 2)"),
    (dict(coordinator_address="h:1", num_processes=0, process_id=0),
     "flag --num_processes: must be >= 1"),
])
def test_incomplete_or_inconsistent_settings_name_the_flag(no_environment, settings, message):
  with pytest.raises(config_lib.ConfigError, match=re.escape(message)):
    distributed.initialize(**settings)


def test_settings_come_from_the_environment_when_not_given(no_environment, monkeypatch):
  monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "h:1")
  monkeypatch.setenv("JAX_NUM_PROCESSES", "two")
  with pytest.raises(config_lib.ConfigError, match="JAX_NUM_PROCESSES='two' is not a whole"):
    distributed.initialize(process_id=0)
  monkeypatch.setenv("JAX_NUM_PROCESSES", "2")
  monkeypatch.setenv("JAX_PROCESS_ID", "5")
  with pytest.raises(config_lib.ConfigError, match=re.escape("5 is not in [0, 2)")):
    distributed.initialize()


def _free_port() -> int:
  with socket.socket() as probe:
    probe.bind(("localhost", 0))
    return probe.getsockname()[1]


@pytest.mark.slow
def test_two_processes_of_four_devices_train_checkpoint_and_evaluate_together(tmp_path):
  """Two processes, one localhost coordinator, a (data 4, fsdp 2) mesh over their 8 CPU
  devices: both finish; each saved its own data position; only process 0 reports."""
  workdir = tmp_path / "run"
  shrink = ["--config.model.num_layers=1", "--config.model.hidden_size=32", "--config.model.num_heads=2",
            "--config.model.intermediate_size=64", "--config.data.seq_length=64",
            "--config.data.shuffle_buffer=200", "--config.data.document_pool=50",
            "--config.objective.mlm.max_predictions=10", "--config.train.batch_size=8",
            "--config.train.steps=2", "--config.train.log_every=1",
            "--config.optimizer.warmup_steps=1", "--config.eval.batches=1",
            "--config.eval.batch_size=8", "--config.checkpoint.every_steps=1",
            "--config.checkpoint.async_save=False", "--config.mesh.fsdp=2"]
  port = _free_port()
  environment = {**os.environ, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3",
                 "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
  processes = [subprocess.Popen(
      [sys.executable, "-m", "encoderx.train", "--config=configs/bert_tiny.py", *shrink,
       f"--workdir={workdir}", f"--coordinator_address=localhost:{port}",
       "--num_processes=2", f"--process_id={index}"],
      cwd=REPO, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
      for index in range(2)]
  outputs = [process.communicate(timeout=900) for process in processes]
  for process, (_, stderr) in zip(processes, outputs):
    assert process.returncode == 0, stderr[-3000:]
  (first_out, first_err), (second_out, second_err) = outputs
  assert "held-out evaluation after 2 steps: mlm_accuracy=" in first_out
  assert "pretrain: 100%" in first_err  # the progress bar
  assert "held-out evaluation" not in second_out and "pretrain:" not in second_err
  for step in (1, 2):
    positions = workdir / "checkpoints" / str(step) / "data_per_process"
    assert sorted(p.name for p in positions.glob("process_*")) == [
        "process_0-of-2.json", "process_1-of-2.json"]
  assert json.loads((workdir / "config.json").read_text())["mesh"]["fsdp"] == 2

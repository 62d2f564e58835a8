"""Runs of several processes (encoderx/distributed.py): the settings, and two processes of
4 CPU devices each training together on one machine (a localhost coordinator)."""
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import REPO
from encoderx import config as config_lib
from encoderx import distributed
from encoderx import plot


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


def _start(workdir, port, index, *extra, processes=2):
  """Process `index` of a run of two, 4 CPU devices each, a (data 4, fsdp 2) mesh; with
  processes=1, the one process of a run on 8 CPU devices. `extra` flags come last."""
  shrink = ["--config.model.num_layers=1", "--config.model.hidden_size=32",
            "--config.model.num_heads=2", "--config.model.intermediate_size=64",
            "--config.data.seq_length=64", "--config.data.shuffle_buffer=200",
            "--config.data.document_pool=50", "--config.objective.mlm.max_predictions=10",
            "--config.train.batch_size=8", "--config.train.steps=30",
            "--config.train.log_every=2", "--config.optimizer.warmup_steps=1",
            "--config.eval.batches=1", "--config.eval.batch_size=8",
            "--config.checkpoint.every_steps=2", "--config.checkpoint.async_save=False",
            "--config.mesh.fsdp=2"]
  cluster = ([f"--coordinator_address=localhost:{port}", f"--num_processes={processes}",
              f"--process_id={index}"] if processes > 1 else [])
  environment = {**os.environ, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3",
                 "XLA_FLAGS": f"--xla_force_host_platform_device_count={8 // processes}"}
  logs = workdir.parent / f"{workdir.name}_process_{index}{'-'.join(('',) + extra)}"
  # Output to files, not pipes: nobody reads a pipe while the test waits for a checkpoint.
  process = subprocess.Popen(
      [sys.executable, "-m", "encoderx.train", "--config=configs/bert_tiny.py", *shrink,
       f"--workdir={workdir}", *cluster, *extra],
      cwd=REPO, env=environment, stdout=open(f"{logs}.out", "w"),
      stderr=open(f"{logs}.err", "w"))
  process.logs = logs
  return process


def _finish(processes):
  """[(stdout, stderr)] of each process once it ended, which must be with status 0."""
  outputs = []
  for process in processes:
    process.wait(timeout=900)
    outputs.append((pathlib.Path(f"{process.logs}.out").read_text(),
                    pathlib.Path(f"{process.logs}.err").read_text()))
    assert process.returncode == 0, outputs[-1][1][-3000:]
  return outputs


def _losses(workdir) -> dict[int, float]:
  """{step: training loss} of a run, from its TensorBoard logs (process 0 writes them)."""
  steps, values = plot.read_scalars(str(workdir))["loss"]
  return dict(zip(steps.tolist(), values.tolist()))


def _run(workdir, *extra, processes=2):
  """{step: loss} of a whole run of `processes` processes (8 CPU devices in all)."""
  port = _free_port()
  _finish([_start(workdir, port, index, *extra, processes=processes)
           for index in range(processes)])
  return _losses(workdir)


# Sums over the devices (gradients, the loss's denominators) in another order: float32
# rounding: measured below 1e-7 relative over 6 steps (data, fsdp x tensor meshes).
RTOL = 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("mesh", [["--config.mesh.fsdp=1"],
                                  ["--config.mesh.fsdp=2", "--config.mesh.tensor=2"]],
                         ids=["data", "fsdp_tensor"])
def test_two_processes_by_rows_train_as_one_process(tmp_path, mesh):
  """data.process_split=rows: 2 processes x 4 devices train on the global batches of
  1 process x 8 devices, with the same losses step by step."""
  flags = ["--config.train.steps=6", "--config.train.log_every=1",
           "--config.checkpoint.every_steps=6", "--config.data.process_split=rows", *mesh]
  one = _run(tmp_path / "one", *flags, processes=1)
  two = _run(tmp_path / "two", *flags)
  assert sorted(one) == sorted(two) == list(range(1, 7))
  steps = sorted(one)
  print("max relative loss difference:",
        max(abs(two[s] - one[s]) / abs(one[s]) for s in steps))
  np.testing.assert_allclose([two[s] for s in steps], [one[s] for s in steps], rtol=RTOL)


def _positions(workdir, step):
  return sorted(p.name for p in (workdir / "checkpoints" / str(step) / "data_per_process")
                .glob("process_*"))


@pytest.mark.slow
def test_two_processes_stop_together_on_one_sigterm_and_resume(tmp_path):
  """Two processes of 4 CPU devices, a localhost coordinator. SIGTERM to process 1 alone
  stops both at the same step with one checkpoint holding both data positions; --resume
  finishes the run with the losses of an uninterrupted run; only process 0 reports."""
  workdir = tmp_path / "run"
  port = _free_port()
  rows = "--config.data.process_split=rows"
  every = "--config.train.log_every=1"  # after the stop: every step's loss, to compare
  processes = [_start(workdir, port, index, rows) for index in range(2)]
  first_checkpoint = workdir / "checkpoints" / "2" / "commit_success.txt"
  deadline = time.time() + 600
  while not first_checkpoint.exists() and time.time() < deadline:
    if any(p.poll() is not None for p in processes):
      for p in processes:
        p.kill()
      pytest.fail("a process ended before the first checkpoint: "
                  + pathlib.Path(f"{processes[0].logs}.err").read_text()[-3000:])
    time.sleep(0.2)
  processes[1].send_signal(signal.SIGTERM)
  (stopped_out, _), (second_out, second_err) = _finish(processes)
  step = int(re.search(r"stopped at step (\d+); checkpoint saved", stopped_out).group(1))
  assert 2 <= step < 30 and step % 2 == 0  # at a log step, the same on both
  saved = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
  assert saved[-1] == step  # nothing after the shared stop
  assert _positions(workdir, step) == ["process_0-of-2.json", "process_1-of-2.json"]
  assert "stopped at step" not in second_out and "pretrain:" not in second_err  # quiet

  port = _free_port()
  (first_out, first_err), (second_out, _) = _finish(
      [_start(workdir, port, index, rows, every, "--resume") for index in range(2)])
  assert "held-out evaluation after 30 steps: mlm_accuracy=" in first_out
  assert "pretrain: 100%" in first_err  # the progress bar
  assert "held-out evaluation" not in second_out
  assert _positions(workdir, 30) == ["process_0-of-2.json", "process_1-of-2.json"]
  resumed = {s: loss for s, loss in _losses(workdir).items() if s > step}
  uninterrupted = _run(tmp_path / "uninterrupted", rows, every)
  assert sorted(resumed) == list(range(step + 1, 31))
  np.testing.assert_allclose([resumed[s] for s in sorted(resumed)],
                             [uninterrupted[s] for s in sorted(resumed)], rtol=RTOL)

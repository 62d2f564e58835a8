"""Runs of several processes (encoderx/distributed.py): the settings, and two processes of
4 CPU devices each training together on one machine (a localhost coordinator). How
processes agree on the outcome of checks: test_agreement.py."""
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from conftest import REPO, xla_flags_with_devices
from test_faults import flip_bytes, largest_file  # pylint: disable=g-bad-import-order
from encoderx import errors
from encoderx import distributed
from encoderx.tools.figures import plot
from encoderx import train


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
  with pytest.raises(errors.ConfigError, match=re.escape(message)):
    distributed.initialize(**settings)


def test_settings_come_from_the_environment_when_not_given(no_environment, monkeypatch):
  monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "h:1")
  monkeypatch.setenv("JAX_NUM_PROCESSES", "two")
  with pytest.raises(errors.ConfigError, match="JAX_NUM_PROCESSES='two' is not a whole"):
    distributed.initialize(process_id=0)
  monkeypatch.setenv("JAX_NUM_PROCESSES", "2")
  monkeypatch.setenv("JAX_PROCESS_ID", "5")
  with pytest.raises(errors.ConfigError, match=re.escape("5 is not in [0, 2)")):
    distributed.initialize()


def _free_port() -> int:
  with socket.socket() as probe:
    probe.bind(("localhost", 0))
    return probe.getsockname()[1]


def _start(workdir, port, index, *extra, processes=2, config="bert:tiny"):
  """Process `index` of a run of two, 4 CPU devices each, a (data 4, fsdp 2) mesh; with
  processes=1, the one process of a run on 8 CPU devices. `config` ('family:variant'),
  shrunk;
  `extra` flags come last."""
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
                 "XLA_FLAGS": xla_flags_with_devices(8 // processes)}
  flags = re.sub(r"[^\w.=-]+", "_", "-".join(("",) + extra))[-80:]
  logs = workdir.parent / f"{workdir.name}_process_{index}{flags}"
  # Output to files, not pipes: nobody reads a pipe while the test waits for a checkpoint.
  process = subprocess.Popen(
      [sys.executable, "-m", "encoderx.train", "--config=configs/{}.py:{}".format(*config.split(":")),
       *shrink,
       f"--workdir={workdir}", *cluster, *extra],
      cwd=REPO, env=environment, stdout=open(f"{logs}.out", "w"),
      stderr=open(f"{logs}.err", "w"))
  process.logs = logs
  return process


def _finish(processes, status=0, timeout=900):
  """[(stdout, stderr)] of each process once it ended, which must be with `status`."""
  outputs = []
  for process in processes:
    process.wait(timeout=timeout)
    outputs.append((pathlib.Path(f"{process.logs}.out").read_text(),
                    pathlib.Path(f"{process.logs}.err").read_text()))
    assert process.returncode == status, outputs[-1][1][-3000:]
  return outputs


def _losses(workdir) -> dict[int, float]:
  """{step: training loss} of a run, from its TensorBoard logs (process 0 writes them)."""
  steps, values = plot.read_scalars(str(workdir))["loss"]
  return dict(zip(steps.tolist(), values.tolist()))


def _run(workdir, *extra, processes=2, config="bert:tiny"):
  """{step: loss} of a whole run of `processes` processes (8 CPU devices in all)."""
  port = _free_port()
  _finish([_start(workdir, port, index, *extra, processes=processes, config=config)
           for index in range(processes)])
  return _losses(workdir)


# Sums over the devices (gradients, the loss's denominators) in another order: float32
# rounding: measured below 1e-7 relative over 6 steps (data, fsdp x tensor meshes);
# 9.9e-8 over 4 steps of 2 processes (data 4 x fsdp 1) against 1 process (data 8).
RTOL = 1e-6


# 4 steps of a run split by rows, each step's loss logged; the checkpoint at the end only.
ROWS = ["--config.train.steps=4", "--config.train.log_every=1",
        "--config.checkpoint.every_steps=4", "--config.data.process_split=rows"]


@pytest.fixture(scope="module")
def one_process_by_rows(tmp_path_factory):
  """{step: loss} of 1 process x 8 devices on a data-parallel mesh (data 8): the
  reference of both 2-process meshes below (sharded runs give the losses of one device
  to RTOL, so one reference serves every mesh)."""
  return _run(tmp_path_factory.mktemp("by_rows") / "one", *ROWS, "--config.mesh.fsdp=1",
              processes=1)


@pytest.mark.slow
@pytest.mark.parametrize("mesh", [["--config.mesh.fsdp=1"],
                                  ["--config.mesh.fsdp=2", "--config.mesh.tensor=2"]],
                         ids=["data", "fsdp_tensor"])
def test_two_processes_by_rows_train_as_one_process(tmp_path, mesh, one_process_by_rows):
  """data.process_split=rows: 2 processes x 4 devices train on the global batches of
  1 process x 8 devices, with the same losses step by step."""
  one = one_process_by_rows
  two = _run(tmp_path / "two", *ROWS, *mesh)
  assert sorted(one) == sorted(two) == list(range(1, 5))
  steps = sorted(one)
  print("max relative loss difference:",
        max(abs(two[s] - one[s]) / abs(one[s]) for s in steps))
  np.testing.assert_allclose([two[s] for s in steps], [one[s] for s in steps], rtol=RTOL)


@pytest.mark.slow
def test_two_processes_train_an_embedding_model_on_the_whole_batchs_negatives(tmp_path):
  """The contrastive method (configs/embedding.py:tiny) on 2 processes x 4 devices
  (data.process_split=rows), caching gradients in two chunks of 8 rows, each chunk spread
  over all 8 devices: each row's negatives are every text of the global batch, gathered
  across the processes, and the losses are those of 1 process x 8 devices without
  caching. (There texts are packed into rows; with several processes each text has a
  padded row of its own: the same step.) No dropout: the chunks would draw other masks."""
  from finetune_cases import pairs_file, stsb_subset  # pylint: disable=g-import-not-at-top
  contrastive = ["--config.train.batch_size=16", "--config.data.seq_length=32",
                 "--config.model.hidden_dropout=0", "--config.model.attention.dropout=0",
                 f"--config.finetune.train_file={pairs_file(tmp_path)}",
                 f"--config.finetune.dev_file={stsb_subset(tmp_path, 'dev.tsv', 16)}"]
  one = _run(tmp_path / "one", *ROWS, *contrastive, processes=1, config="embedding:tiny")
  two = _run(tmp_path / "two", *ROWS, *contrastive, "--config.contrastive.cache_chunk_size=8",
             config="embedding:tiny")
  assert sorted(one) == sorted(two) == list(range(1, 5))
  steps = sorted(one)
  np.testing.assert_allclose([two[s] for s in steps], [one[s] for s in steps], rtol=1e-5)


def _positions(workdir, step):
  return sorted(p.name for p in (workdir / "checkpoints" / str(step) / "data_per_process")
                .glob("process_*"))


STEPS = 12  # of the runs of the SIGTERM test


@pytest.mark.slow
def test_two_processes_stop_together_on_one_sigterm_and_resume(tmp_path):
  """Two processes of 4 CPU devices, a localhost coordinator, each streaming its own
  files (data.process_split=shards, the default). SIGTERM to process 1 alone stops both
  at the same step with one checkpoint holding both data positions, which differ. That
  checkpoint is then damaged: --resume finds it on both processes, process 0 alone moves
  it aside (the checkpoints are shared), and both resume, each from its own position of
  the checkpoint before, to finish the run with the losses of an uninterrupted run; only
  process 0 reports."""
  workdir = tmp_path / "run"
  port = _free_port()
  # 3 files: 2 for process 0, 1 for process 1; shuffled in windows of 2 batches, so
  # that a position (the window's start: the shards open, the examples taken from each)
  # has left the first window when the run stops.
  # 12 steps: after the second checkpoint (step 4), 8 steps and 4 saves to stop in.
  streaming = ("--config.data.streaming=True", "--config.data.shuffle_buffer=8",
               f"--config.train.steps={STEPS}")
  every = "--config.train.log_every=1"  # after the stop: every step's loss, to compare
  processes = [_start(workdir, port, index, *streaming) for index in range(2)]
  # The second checkpoint: the one the damaged newest falls back to is not the first.
  second_checkpoint = workdir / "checkpoints" / "4" / "commit_success.txt"
  deadline = time.time() + 600
  while not second_checkpoint.exists() and time.time() < deadline:
    if any(p.poll() is not None for p in processes):
      for p in processes:
        p.kill()
      pytest.fail("a process ended before the second checkpoint: "
                  + pathlib.Path(f"{processes[0].logs}.err").read_text()[-3000:])
    time.sleep(0.05)
  processes[1].send_signal(signal.SIGTERM)
  (stopped_out, _), (second_out, second_err) = _finish(processes)
  step = int(re.search(r"stopped at step (\d+); checkpoint saved", stopped_out).group(1))
  assert 4 <= step < STEPS and step % 2 == 0  # at a log step, the same on both
  saved = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
  assert saved[-1] == step  # nothing after the shared stop
  assert _positions(workdir, step) == ["process_0-of-2.json", "process_1-of-2.json"]
  positions = workdir / "checkpoints" / str(step) / "data_per_process"
  assert ((positions / "process_0-of-2.json").read_text()
          != (positions / "process_1-of-2.json").read_text())  # their own shards
  assert "stopped at step" not in second_out and "pretrain:" not in second_err  # quiet

  flip_bytes(largest_file(workdir / "checkpoints" / str(step) / "state"))
  port = _free_port()
  (first_out, first_err), (second_out, _) = _finish(
      [_start(workdir, port, index, *streaming, every, "--resume") for index in range(2)])
  assert f"checkpoint {step} is damaged" in first_err
  assert f"using step {step - 2}, the newest checkpoint that verifies" in first_err
  assert ([p.name.split("-")[0] for p in (workdir / "damaged_checkpoints").iterdir()]
          == [str(step)])
  assert f"held-out evaluation after {STEPS} steps: mlm_accuracy=" in first_out
  assert "pretrain: 100%" in first_err  # the progress bar
  assert "held-out evaluation" not in second_out
  assert _positions(workdir, STEPS) == ["process_0-of-2.json", "process_1-of-2.json"]
  # From step - 2's state and data positions (the resumed run's values win in the logs).
  resumed = {s: loss for s, loss in _losses(workdir).items() if s > step - 2}
  # Its only checkpoint at the end: saving reads the state, it changes nothing.
  uninterrupted = _run(tmp_path / "uninterrupted", *streaming, every,
                       f"--config.checkpoint.every_steps={STEPS}")
  assert sorted(resumed) == list(range(step - 1, STEPS + 1))
  # The same processes, devices and batches: the same arithmetic, bit for bit.
  np.testing.assert_array_equal([resumed[s] for s in sorted(resumed)],
                                [uninterrupted[s] for s in sorted(resumed)])


@pytest.mark.slow
def test_a_file_missing_on_one_process_stops_every_process_with_one_message(tmp_path):
  """Process 1 alone is given a corpus file that does not exist: both processes exit
  with status 2 and print the same one-line error naming process 1 and the file, at
  once instead of waiting in a collective for JAX's timeout."""
  missing = tmp_path / "worker_1" / "corpus.txt"
  port, started = _free_port(), time.monotonic()
  outputs = _finish([_start(tmp_path / "run", port, 0),
                     _start(tmp_path / "run", port, 1, f"--config.data.files={missing}")],
                    status=2, timeout=600)
  print(f"both exited after {time.monotonic() - started:.0f} s")
  errors = [[line for line in err.splitlines() if line.startswith("encoderx: error:")]
            for _, err in outputs]
  assert errors[0] == errors[1] == [
      f"encoderx: error: process 1 of 2: config field 'data.files': '{missing}' matches "
      "no file. Check the path (it is resolved from the current directory)."]


# --- evaluation over a whole split --------------------------------------------------------
ONE_DEVICE = jax.devices()[:1]


@pytest.mark.parametrize("name", ["bert:tiny", "electra:tiny", "xlnet:tiny"])
def test_padding_rows_count_for_nothing_in_pretraining_evaluations(tiny_config, name):
  """A batch of padding rows (zeros, example_weight 0.0, what completes a whole split's
  last batch or feeds a process whose shard ran out) adds nothing to any sum the
  evaluation is summarized from: no prediction, no sentence label, no token."""
  from encoderx.train import trainer as trainer_lib  # pylint: disable=g-import-not-at-top
  from encoderx.data import pipeline  # pylint: disable=g-import-not-at-top
  config = tiny_config(name)
  trainer = trainer_lib.Trainer(config, devices=ONE_DEVICE)
  state = trainer.init_state()
  (batch,) = pipeline.take_batches(trainer.method.task(), "validation", 64, 8, count=1)
  padding = {k: np.zeros_like(v) for k, v in batch.items()}
  padding["example_weight"] = np.zeros(8, np.float32)
  evaluate = trainer.evaluate_step()
  key = jax.random.key(0)
  sums = jax.device_get(evaluate(state.params, state.method_state,
                                 trainer.device_batch(padding), key))
  assert sums and all(float(x) == 0.0 for x in jax.tree_util.tree_leaves(sums)), sums
  real = jax.device_get(evaluate(state.params, state.method_state,
                                 trainer.device_batch(batch), key))
  assert all(float(t["count"]) > 0 for t in real.values())  # the real batch counts


def test_a_whole_split_evaluation_gives_the_metrics_of_its_examples(tiny_config):
  """NSP alone (nothing masked: each example's metrics do not depend on its batch): the
  validation split evaluated whole in batches of 8, the last padded, gives the metrics
  of batches of 1, which need no padding."""
  from encoderx.train import trainer as trainer_lib  # pylint: disable=g-import-not-at-top
  from encoderx.data import pipeline  # pylint: disable=g-import-not-at-top
  metrics = {}
  for size in (8, 1):
    config = tiny_config()
    config.objective.names = ("nsp",)
    config.eval.batches, config.eval.batch_size = 0, size
    trainer = trainer_lib.Trainer(config, devices=ONE_DEVICE)
    task, phase = trainer.method.task(), trainer.phases[0]
    if size == 8:
      *_, last = pipeline.whole_split(task, "validation", phase.seq_length, size)
      assert 0 < last["example_weight"].sum() < size  # a padded last batch
    metrics[size] = train.evaluate(trainer, task, trainer.init_state(), phase)
  print("whole split, batches of 8 and of 1:", metrics)
  assert metrics[8].keys() == {"nsp_loss", "nsp_accuracy"}
  assert metrics[8]["nsp_accuracy"] == metrics[1]["nsp_accuracy"]
  assert metrics[8]["nsp_loss"] == pytest.approx(metrics[1]["nsp_loss"], rel=1e-6)


@pytest.mark.slow
def test_two_processes_evaluate_and_predict_a_whole_split_as_one_process(tmp_path,
                                                                         austen_lines):
  """Classification, each process reading its own shard of a 9-example dev file (5 and
  4 examples: 2 and 1 batches of 4): the 2-process run's whole-split evaluation gives
  the metrics of one process evaluating the same parameters, and --predict on two
  processes writes one process's predictions, each row once, in input order."""
  import seqio  # pylint: disable=g-import-not-at-top
  from encoderx import checkpoint, sources  # pylint: disable=g-import-not-at-top
  from encoderx.train import trainer as trainer_lib  # pylint: disable=g-import-not-at-top
  from encoderx.data import pipeline  # pylint: disable=g-import-not-at-top
  lines = [line.replace("\t", " ") for line in austen_lines(73)]
  for name, part in (("train.tsv", lines[:64]), ("dev.tsv", lines[64:])):
    (tmp_path / name).write_text("label\ttext\n" + "".join(
        f"{'comma' if ',' in line else 'none'}\t{line}\n" for line in part))
  dev, run = tmp_path / "dev.tsv", tmp_path / "run"
  flags = [f"--config.finetune.train_file={tmp_path / 'train.tsv'}",
           f"--config.finetune.dev_file={dev}", "--config.train.steps=2",
           "--config.eval.batches=0",
           "--config.model.init.range=0.5"]  # predictions that differ by row
  start = lambda *extra: _finish([
      _start(run, port, index, *flags, *extra, config="finetune:classify")
      for index in range(2)])
  port = _free_port()
  start()
  port = _free_port()
  start(f"--predict={dev}", f"--predict_output={tmp_path / 'two.tsv'}")

  # One process of 8 devices, the same config and parameters (the best checkpoint: the
  # only evaluation's).
  config = sources.run_config(str(run / "config.json"))
  trainer = trainer_lib.Trainer(config)
  task = trainer.method.task()
  assert [len(list(pipeline.whole_split(task, "validation", 64, 4,
                                        shard_info=seqio.ShardInfo(i, 2))))
          for i in range(2)] == [2, 1]
  params, method_state = checkpoint.restore_for_inference(
      str(run), trainer.describe(), trainer.abstract_state_with_shardings(),
      config.eval.best_metric, config.eval.best_mode)
  one = train.evaluate(trainer, task, trainer_lib.TrainState(
      step=None, params=params, opt_state=None, rng=None, method_state=method_state,
      skipped_in_a_row=None, skipped_total=None), trainer.phases[-1])
  two = {tag.removeprefix("eval/"): values[-1]
         for tag, (_, values) in plot.read_scalars(str(run)).items()
         if tag.startswith("eval/")}
  assert two.keys() == one.keys() == {"accuracy", "f1", "mcc", "loss"}
  print("1 vs 2 processes:", {k: (one[k], two[k]) for k in one}, "largest difference:",
        max(abs(one[k] - two[k]) for k in one))
  # TensorBoard keeps float32: 6e-8 relative rounding.
  np.testing.assert_allclose([two[k] for k in sorted(one)], [one[k] for k in sorted(one)],
                             rtol=1e-6)

  train.predict(config, str(run), str(dev), str(tmp_path / "one.tsv"))
  predicted = (tmp_path / "two.tsv").read_text()
  assert predicted == (tmp_path / "one.tsv").read_text()
  lines = [line.split("\t") for line in predicted.splitlines()]
  assert [line[0] for line in lines] == ["line"] + [str(n) for n in range(2, 11)]
  assert len({line[3] for line in lines[1:]}) == 9  # the probabilities tell rows apart

"""Faults: damaged checkpoints, non-finite training, a full disk, two runs in one work
directory, and runs killed at random points. Each test asserts on the message and that no
earlier checkpoint was lost."""
import hashlib
import logging
import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from conftest import REPO, _tiny_config

from encoderx import checkpoint as checkpoint_lib
from encoderx import checksum
from encoderx.methods import registry as method_registry
from encoderx import train
from encoderx import workdir as workdir_lib
from encoderx.data import pipeline, tasks
from encoderx.methods import pretrain
from encoderx.train import trainer as trainer_lib

ONE_DEVICE = jax.devices()[:1]


def _run(config, workdir, **kwargs):
  return train.run(config, str(workdir), show_progress=False, devices=ONE_DEVICE, **kwargs)


def _losses(result) -> dict:
  return {entry["step"]: entry["loss"] for entry in result["history"]}


def _fingerprint(directory: pathlib.Path) -> dict:
  return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
          for p in sorted(directory.rglob("*")) if p.is_file()}


def flip_bytes(path: pathlib.Path, count: int = 30, seed: int = 0) -> None:
  data = bytearray(path.read_bytes())
  rng = random.Random(seed)
  for _ in range(count):
    data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
  path.write_bytes(bytes(data))


def largest_file(directory: pathlib.Path) -> pathlib.Path:
  """The file holding the most array data (the embeddings and their Adam moments)."""
  return max((p for p in directory.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


def _six_step_config():
  config = _tiny_config()
  config.train.steps = 6
  config.checkpoint.every_steps = 3
  return config


@pytest.fixture(scope="module")
def six_steps(tmp_path_factory):
  """A finished 6-step run with checkpoints at steps 3 and 6: (work directory, result).
  Tests copy it before changing anything."""
  workdir = tmp_path_factory.mktemp("six_steps") / "run"
  return workdir, _run(_six_step_config(), workdir)


@pytest.fixture
def six_step_copy(six_steps, tmp_path):
  source, result = six_steps
  shutil.copytree(source, tmp_path / "run")
  return tmp_path / "run", result


# --- checksums --------------------------------------------------------------------------------
def test_array_checksums_do_not_depend_on_sharding_and_see_one_flipped_bit():
  values = np.random.default_rng(0).normal(size=(64, 32)).astype(np.float32)
  mesh = jax.make_mesh((8,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
  sharded = jax.device_put(values, jax.sharding.NamedSharding(
      mesh, jax.sharding.PartitionSpec("x")))
  tree = {"a": sharded, "b": jnp.arange(5, dtype=jnp.int32), "c": jnp.ones(3, jnp.bfloat16)}
  single = {"a": jax.device_put(values, ONE_DEVICE[0]), "b": tree["b"], "c": tree["c"]}
  assert checksum.arrays(tree) == checksum.arrays(single)
  flipped = values.copy()
  flipped.view(np.uint32)[17, 3] ^= 1 << 9
  swapped = values.copy()
  swapped[[0, 1]] = swapped[[1, 0]]
  for changed in (flipped, swapped):
    assert checksum.differences(checksum.arrays(single),
                                checksum.arrays({**single, "a": jnp.asarray(changed)})) == ["a"]


# --- damaged checkpoints -------------------------------------------------------------------
def test_damaged_newest_checkpoint_is_reported_and_the_previous_one_resumed(
    six_step_copy, caplog):
  workdir, straight = six_step_copy
  checkpoints = workdir / "checkpoints"
  flip_bytes(largest_file(checkpoints / "6" / "state"))
  intact = _fingerprint(checkpoints / "3")
  # A save that a crash interrupted (as orbax leaves it): removed at start, and said so.
  shutil.copytree(checkpoints / "6", checkpoints / "9.orbax-checkpoint-tmp-1700000000")

  with caplog.at_level(logging.WARNING, logger="encoderx"):
    resumed = _run(_six_step_config(), workdir, resume=True)
  log = caplog.text
  assert "checkpoint 6 is damaged" in log
  assert "differ from their checksums at save" in log or "cannot be read" in log
  assert "using step 3, the newest checkpoint that verifies" in log
  assert "removed 1 unfinished checkpoint(s)" in log and "9.orbax-checkpoint-tmp" in log
  assert not (checkpoints / "9.orbax-checkpoint-tmp-1700000000").exists()
  # The damaged one is kept for inspection, out of orbax's sight; the good one untouched.
  assert [p.name.split("-")[0] for p in (workdir / "damaged_checkpoints").iterdir()] == ["6"]
  assert _fingerprint(checkpoints / "3") == intact
  # Steps 4-6 again, from step 3's state: the losses of the unbroken run, bit for bit.
  assert resumed["step"] == 6 and resumed["eval"]
  assert {s: l for s, l in _losses(resumed).items()} == {
      s: l for s, l in _losses(straight).items() if s > 3}


def _restore(workdir, config):
  trainer = trainer_lib.Trainer(config, devices=ONE_DEVICE)
  checkpoints = checkpoint_lib.Checkpoints(str(workdir / "checkpoints"))
  try:
    return checkpoints.restore_latest(trainer.abstract_state_with_shardings(),
                                      trainer.describe())
  finally:
    checkpoints.close()


def _wide_config():
  """The tiny config wide enough (about 20 MB of state) that orbax still has reads in
  flight when its first read of a damaged checkpoint fails."""
  config = _tiny_config()
  config.model.hidden_size, config.model.num_heads = 256, 4
  config.model.intermediate_size, config.model.num_layers = 1024, 4
  return config


def _array_file(state: pathlib.Path, key: bytes) -> pathlib.Path:
  """The file of orbax's array store (OCDBT) that holds the chunk `key`."""
  import tensorstore as ts  # pylint: disable=g-import-not-at-top
  store = ts.KvStore.open(state.resolve().as_uri() + "/").result()
  root = ts.ocdbt.dump(store).result()["versions"][-1]["root"]["location"]
  entry = next(entry for entry in ts.ocdbt.dump(store, root).result()["entries"]
               if entry["key"] == key)
  _, base, name = entry["indirect_value"].rsplit(":", 2)[0].split(":", 2)
  return state / (base + name)


RESTORE_LATEST = """
import gc, pathlib, sys
from test_faults import _restore, _wide_config
step = _restore(pathlib.Path(sys.argv[1]), _wide_config())[0]
gc.collect()  # reads a failed restore abandoned print when collected
print("restored", step)
"""


def test_a_checkpoint_missing_an_array_file_is_skipped_with_one_warning(tmp_path):
  """The newest checkpoint lost a file of array chunks: the restore takes the one before
  with one warning naming the step and the file, and prints nothing else. (orbax's
  restore stops at the first array it cannot read and abandons the reads in flight,
  which printed tens of "Exception ignored ... Traceback" blocks with TensorStore specs
  when collected: the files are checked against the index before restoring.)"""
  trainer = trainer_lib.Trainer(_wide_config(), devices=ONE_DEVICE)
  state = trainer.init_state()
  checkpoints = checkpoint_lib.Checkpoints(str(tmp_path / "checkpoints"), async_save=False)
  for step in (3, 6):
    checkpoints.save(step, state, {"batch": step}, trainer.describe())
  checkpoints.close()
  damaged = tmp_path / "checkpoints" / "6" / "state"
  chunk = _array_file(damaged, b"params.encoder_model.embeddings.position_embeddings."
                      b"embedding/0.0")
  chunk.unlink()
  result = subprocess.run([sys.executable, "-c", RESTORE_LATEST, str(tmp_path)],
                          capture_output=True, text=True, cwd=REPO / "tests", timeout=600)
  assert result.returncode == 0, result.stderr
  assert "restored 3" in result.stdout
  assert "Exception ignored" not in result.stderr and "Traceback" not in result.stderr, (
      result.stderr[-3000:])
  warnings = [line for line in result.stderr.splitlines() if "is damaged" in line]
  assert len(warnings) == 1 and warnings[0].endswith(
      f"checkpoint 6 is damaged: {damaged} cannot be read: its array files "
      f"{chunk.relative_to(damaged)} are missing or cut short"), result.stderr[-3000:]


def test_damaged_json_item_and_all_checkpoints_damaged(six_step_copy, caplog):
  workdir, _ = six_step_copy
  checkpoints = workdir / "checkpoints"
  data_item = checkpoints / "6" / "data" / "metadata"
  # A digit changed: still valid JSON, but another data position.
  data_item.write_text(data_item.read_text().replace('"batch": 6', '"batch": 5'))
  with caplog.at_level(logging.WARNING, logger="encoderx"):
    step, _, position, _ = _restore(workdir, _six_step_config())
  assert step == 3 and position["batch"] == 3
  assert f"{checkpoints / '6' / 'data'} differ from their checksums" in caplog.text

  flip_bytes(largest_file(checkpoints / "3" / "state"))
  before = _fingerprint(workdir)
  with pytest.raises(checkpoint_lib.CheckpointError,
                     match=r"no checkpoint .* can be resumed; every one is damaged: step 3: "):
    _restore(workdir, _six_step_config())
  assert _fingerprint(workdir) == before, "nothing is moved or deleted"


def test_resuming_with_another_data_or_objective_config_lists_the_changes(six_step_copy,
                                                                          caplog):
  workdir, _ = six_step_copy
  before = _fingerprint(workdir)
  changed = _six_step_config()
  changed.objective.mlm.rate = 0.2
  changed.data.short_seq_prob = 0.3
  changed.data.builder, changed.objective.names = "full_sentences", ("mlm",)
  with pytest.raises(checkpoint_lib.CheckpointError) as error:
    _run(changed, workdir, resume=True)
  message = str(error.value)
  assert "different model" in message and "heads" in message  # no NSP head: not allowed
  changed.data.builder, changed.objective.names = "sentence_pairs", ("mlm", "nsp")
  with pytest.raises(checkpoint_lib.CheckpointError,
                     match=r"the checkpoint of step 6 in .* was trained on another config: "
                           r"data\.short_seq_prob: checkpoint 0\.1, this run 0\.3; "
                           r"objective\.mlm\.rate: checkpoint 0\.15, this run 0\.2\. "
                           r"Resume with the config that made it, or pass "
                           r"--allow_config_change"):
    _run(changed, workdir, resume=True)
  assert _fingerprint(workdir) == before
  with caplog.at_level(logging.WARNING, logger="encoderx"):
    resumed = _run(changed, workdir, resume=True, allow_config_change=True)
  assert resumed["step"] == 6 and resumed["eval"]
  assert "resuming step 6 with a changed config (--allow_config_change)" in caplog.text


# --- non-finite losses and gradients --------------------------------------------------------
class Poisonable(pretrain.Pretraining):
  """Pretraining whose loss and gradients are NaN for a batch with a NaN in its `poison`
  feature ([batch] float32)."""
  name = "poisonable"

  def loss(self, params, state, batch, key, denominators, update, carry):
    loss, output = super().loss(params, state, batch, key, denominators, update, carry)
    return loss * (1.0 + jnp.sum(batch["poison"])), output


method_registry.register(Poisonable.name, "test_faults:Poisonable")


def _poisoned(batch, poison: bool) -> dict:
  rows = len(batch["input_ids"])
  return {**batch, "poison": np.full(rows, np.nan if poison else 0.0, np.float32)}


def _poisonable_config():
  """The tiny config with Poisonable, 2 micro-batches a step and the peak learning rate
  from the first update: one train step that the two tests below share (compiled once)."""
  config = _tiny_config()
  config.method = Poisonable.name
  config.train.steps = 12
  config.train.grad_accum_steps = 2
  config.optimizer.warmup_steps = 0
  return config


def test_a_non_finite_step_is_skipped_leaving_the_state_as_it_was():
  config = _poisonable_config()
  task = tasks.register_pretraining_task(config)
  batches = pipeline.take_batches(task, "train", 64, 8, 2, seed=5)
  trainer = trainer_lib.Trainer(config, devices=ONE_DEVICE)
  step = trainer.train_step(0)
  state = trainer.init_state()
  before = jax.device_get(state)
  state, metrics = step(state, trainer.device_batch(_poisoned(batches[0], True)))
  after, metrics = jax.device_get((state, metrics))
  assert np.isnan(metrics["loss"]) and metrics["skipped"] == 1.0
  assert (int(after.step), int(after.skipped_in_a_row), int(after.skipped_total)) == (1, 1, 1)
  for name in ("params", "opt_state", "rng"):
    jax.tree_util.tree_map(np.testing.assert_array_equal, getattr(before, name),
                           getattr(after, name))
  assert trainer.state_is_finite(state)

  state, metrics = step(state, trainer.device_batch(_poisoned(batches[1], False)))
  after_clean, metrics = jax.device_get((state, metrics))
  assert np.isfinite(metrics["loss"]) and metrics["skipped"] == 0.0
  # The optimizer's first update (its schedule counts updates, not steps).
  assert metrics["learning_rate"] == np.float32(config.optimizer.learning_rate)
  assert (int(after_clean.skipped_in_a_row), int(after_clean.skipped_total)) == (0, 1)
  moved = jax.tree_util.tree_leaves(jax.tree_util.tree_map(
      lambda a, b: float(np.abs(a - b).max()), after.params, after_clean.params))
  assert max(moved) > 0


def test_skipped_steps_keep_the_last_checkpoint_before_them_out_of_rotation(
    tmp_path, monkeypatch, caplog):
  config = _poisonable_config()
  config.checkpoint.every_steps = 3
  config.checkpoint.keep = 1
  poisoned_steps = {5, 6}
  calls = []
  real_device_batch = trainer_lib.Trainer.device_batch

  def poisoning_device_batch(self, batch):
    if "example_weight" in batch:  # an evaluation's (its first compiled before step 1)
      return real_device_batch(self, batch)
    calls.append(1)  # the train loop's n-th train batch is step n
    return real_device_batch(self, _poisoned(batch, len(calls) in poisoned_steps))

  monkeypatch.setattr(trainer_lib.Trainer, "device_batch", poisoning_device_batch)
  with caplog.at_level(logging.WARNING, logger="encoderx"):
    result = _run(config, tmp_path)
  skipped = {h["step"] for h in result["history"] if h["skipped"]}
  assert skipped == poisoned_steps and result["step"] == 12 and result["eval"]
  assert "the checkpoint of step 3 is kept out of rotation" in caplog.text
  # keep=1 leaves the newest, and step 3: the last one saved before the skipped steps.
  assert sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir()) == [3, 12]


def test_a_diverging_run_stops_naming_the_steps_and_saves_nothing_non_finite(
    tiny_config, tmp_path):
  config = tiny_config()
  config.train.steps = 30
  config.checkpoint.every_steps = 2
  config.checkpoint.keep = 2
  config.train.max_skipped_steps = 3
  config.optimizer.learning_rate = 1e6
  with pytest.raises(trainer_lib.NonFiniteError,
                     match=r"steps (\d+)-(\d+) \(4 in a row\) had a non-finite loss or "
                           r"gradient norm .* train.max_skipped_steps=3") as error:
    _run(config, tmp_path)
  first, last = map(int, error.value.args[0].split()[1].split("-"))
  assert last == first + 3
  manager = ocp.CheckpointManager(tmp_path / "checkpoints", item_names=("state",))
  steps = manager.all_steps()
  manager.close()
  assert steps and max(steps) <= last
  trainer = trainer_lib.Trainer(config, devices=ONE_DEVICE)
  for step in steps:  # every checkpoint restores, verifies and is finite
    checkpoints = checkpoint_lib.Checkpoints(str(tmp_path / "checkpoints"))
    state = checkpoints._read_state(step, trainer.abstract_state_with_shardings())
    checkpoints._verify_state(step, state, checkpoints._json_items(step)["checksums"])
    checkpoints.close()
    assert trainer.state_is_finite(state)


# --- two runs, one work directory --------------------------------------------------------------
def test_a_second_run_on_a_locked_work_directory_is_refused(six_step_copy):
  workdir, _ = six_step_copy
  before = _fingerprint(workdir)
  with workdir_lib.Lock(str(workdir)):  # as a run in progress holds it
    with pytest.raises(workdir_lib.WorkdirError,
                       match=rf"{workdir} is in use by another run \(pid {os.getpid()} on "
                             r"host .*overwrite each other's checkpoints"):
      _run(_six_step_config(), workdir, resume=True)
    after = _fingerprint(workdir)
    after.pop(workdir_lib.LOCK_NAME)
    assert after == before
  assert not (workdir / workdir_lib.LOCK_NAME).exists(), "released when the run ends"


def test_a_stale_lock_is_taken_over_and_one_from_another_host_refused(tmp_path, caplog):
  lock_file = tmp_path / workdir_lib.LOCK_NAME
  # What a run killed with SIGKILL leaves: the file, with no process holding its flock.
  lock_file.write_text('{"pid": 4000000, "host": "%s", "since": "yesterday"}'
                       % workdir_lib.socket.gethostname())
  with caplog.at_level(logging.WARNING, logger="encoderx"):
    with workdir_lib.Lock(str(tmp_path)):
      assert f'"pid": {os.getpid()}' in lock_file.read_text()
  assert "(pid 4000000, since yesterday) ended without releasing the lock" in caplog.text
  lock_file.write_text('{"pid": 12, "host": "another-host", "since": "today"}')
  with pytest.raises(workdir_lib.WorkdirError,
                     match=rf"locked by a run on another host \(pid 12 on host another-host"
                           rf".*delete {lock_file}"):
    workdir_lib.Lock(str(tmp_path)).acquire()
  assert "another-host" in lock_file.read_text()


# --- a full disk ------------------------------------------------------------------------------
@pytest.fixture
def small_tmpfs(tmp_path):
  """A 5 MiB tmpfs (room for one tiny checkpoint, not two); remount(size) resizes it."""
  mount_point = tmp_path / "tmpfs"
  mount_point.mkdir()
  mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=5m", "tmpfs",
                            str(mount_point)], capture_output=True, text=True)
  if mounted.returncode:
    pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()}); needs root")

  def remount(size):
    subprocess.run(["mount", "-o", f"remount,size={size}", str(mount_point)], check=True)

  yield mount_point, remount
  subprocess.run(["umount", "-l", str(mount_point)], check=False)


# After the first write fails, orbax's save closes its event loop while tensorstore's other
# writes are still in flight; as each ends, tensorstore's native thread wakes the closed loop
# (call_soon_threadsafe) and Python reports "Event loop is closed". Those writes go to the
# unfinished step, which the resume below removes; the assertions check what matters.
@pytest.mark.filterwarnings(
    "ignore:(?s).*Event loop is closed:pytest.PytestUnraisableExceptionWarning")
@pytest.mark.slow
def test_a_full_disk_stops_the_run_with_the_intact_checkpoints_named(small_tmpfs, caplog):
  mount_point, remount = small_tmpfs
  workdir = mount_point / "run"
  config = _six_step_config()
  config.checkpoint.async_save = True
  with pytest.raises(checkpoint_lib.CheckpointError,
                     match=r"could not write the checkpoint of step 6 in .*: No space left on "
                           r"device \(the disk is full\). The earlier checkpoints are intact "
                           r"\(steps 3\)"):
    _run(config, workdir)
  intact = _fingerprint(workdir / "checkpoints" / "3")
  remount("64m")  # space freed
  with caplog.at_level(logging.WARNING, logger="encoderx"):
    resumed = _run(config, workdir, resume=True)
  assert "removed 1 unfinished checkpoint(s)" in caplog.text
  assert resumed["step"] == 6 and resumed["eval"]
  assert _fingerprint(workdir / "checkpoints" / "3") == intact


# --- runs killed at random points ----------------------------------------------------------------
KILL_CONFIG = """
from encoderx import configs

def get_config():
  config = configs.get("bert:tiny")
  config.model.num_layers, config.model.hidden_size = 1, 32
  config.model.num_heads, config.model.intermediate_size = 2, 64
  config.data.seq_length, config.data.shuffle_buffer, config.data.document_pool = 64, 200, 50
  config.objective.mlm.max_predictions = 10
  config.train.batch_size, config.train.steps, config.train.log_every = 8, 12, 1
  config.optimizer.warmup_steps = 2
  config.eval.batches, config.eval.batch_size = 1, 8
  config.checkpoint.every_steps = 3
  return config
"""


def _start(config_path, workdir, *flags):
  return subprocess.Popen([sys.executable, "-m", "encoderx.train", f"--config={config_path}",
                           f"--workdir={workdir}", *flags], cwd=REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _logged_losses(workdir) -> dict[int, list[float]]:
  """Every loss a run (and its resumptions) wrote to TensorBoard, by step."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  losses = {}
  for path in sorted((workdir / "tensorboard").glob("events.*")):
    for event in tf.compat.v1.train.summary_iterator(str(path)):
      for value in event.summary.value:
        if value.tag == "loss":
          losses.setdefault(event.step, []).append(float(tf.make_ndarray(value.tensor)))
  return losses


def _kill_when(process, condition, timeout=600.0):
  """SIGKILLs `process` once `condition()` holds; False if it ended first."""
  deadline = time.monotonic() + timeout
  while process.poll() is None and time.monotonic() < deadline:
    if condition():
      process.send_signal(signal.SIGKILL)
      process.wait()
      return True
    time.sleep(0.002)
  return False


def _saving(checkpoints: pathlib.Path) -> bool:
  return checkpoints.is_dir() and any(".orbax-checkpoint-tmp" in p.name
                                      for p in checkpoints.iterdir())


def _finished(checkpoints: pathlib.Path, step: int) -> bool:
  return (checkpoints / str(step) / "commit_success.txt").exists()


@pytest.mark.slow
def test_runs_killed_mid_save_and_between_saves_resume_bit_for_bit(tmp_path):
  config_path = tmp_path / "kill_config.py"
  config_path.write_text(KILL_CONFIG)
  straight = _start(config_path, tmp_path / "straight")
  out, _ = straight.communicate(timeout=900)
  assert straight.returncode == 0, out
  expected = _logged_losses(tmp_path / "straight")
  assert sorted(expected) == list(range(1, 13))

  seed = random.randrange(10**6)
  rng = random.Random(seed)
  workdir = tmp_path / "killed"
  checkpoints = workdir / "checkpoints"
  # 1. Killed mid-save: as soon as a save of step 3 or 6 has begun.
  target = rng.choice([3, 6])
  run = _start(config_path, workdir)
  assert _kill_when(run, lambda: _saving(checkpoints) and (target == 3 or _finished(
      checkpoints, 3))), f"seed {seed}: the run ended before the kill"
  assert _saving(checkpoints), f"seed {seed}: not killed mid-save"
  # 2. Resumed, then killed between saves, at a random moment after the next save.
  run = _start(config_path, workdir, "--resume", "--allow_fresh_start")
  after = target + 3
  delay = rng.uniform(0.0, 1.5)
  done = {}
  assert _kill_when(run, lambda: _finished(checkpoints, after) and not _saving(checkpoints)
                    and time.monotonic() >= done.setdefault("t", time.monotonic() + delay)
                    ), f"seed {seed}: the run ended before the kill"
  # 3. Resumed to the end (the lock the killed runs left is stale, their tmp dirs removed).
  run = _start(config_path, workdir, "--resume")
  out, _ = run.communicate(timeout=900)
  assert run.returncode == 0, f"seed {seed}: {out}"
  assert "held-out evaluation after 12 steps" in out
  # (A killed run may not have flushed its last steps' metrics.)
  logged = _logged_losses(workdir)
  assert {10, 11, 12} <= set(logged), f"seed {seed}"
  for step, values in logged.items():  # steps run twice (after a kill) gave the same loss
    assert values == expected[step] * len(values), f"seed {seed}, step {step}: {values}"
  assert not _saving(checkpoints)

"""Processes agreeing on the outcome of checks (encoderx/distributed.py: agreement,
exchange): a check failing on one process fails on all with one message, a process that
never answers is named, a checkpoint one process cannot read is damaged for all. The
processes are threads sharing one key-value store; tests/test_distributed.py runs real
ones."""
import itertools
import threading

import jax
import pytest

from encoderx import errors
from encoderx import checkpoint as checkpoint_lib
from encoderx import distributed
from encoderx.train import loop as train_loop
from encoderx import workdir as workdir_lib


def test_one_process_agrees_without_exchanging(monkeypatch):
  """One process: the body's error comes out unchanged, and nothing is exchanged."""
  def no_exchange(value):
    raise AssertionError("exchanged")
  monkeypatch.setattr(distributed, "exchange", no_exchange)
  error = errors.ConfigError("config field 'data.files': 'x' matches no file.")
  with pytest.raises(errors.ConfigError) as raised:
    with distributed.agreement((errors.UserError,)):
      raise error
  assert raised.value is error
  with distributed.agreement((errors.UserError,)):
    pass


class _KeyValueStore:
  """jax.distributed's key-value store, for processes simulated by threads."""

  def __init__(self):
    self.values, self.changed = {}, threading.Condition()

  def key_value_set(self, key, value):
    with self.changed:
      self.values[key] = value
      self.changed.notify_all()

  def blocking_key_value_get(self, key, timeout_in_ms):
    with self.changed:
      if not self.changed.wait_for(lambda: key in self.values, timeout_in_ms / 1000):
        raise jax.errors.JaxRuntimeError(f"DEADLINE_EXCEEDED: GetKeyValue() timed out "
                                         f"with key: {key}")
      return self.values[key]

  def key_value_delete(self, key):
    with self.changed:
      del self.values[key]


def _as_processes(monkeypatch, bodies) -> list:
  """Runs bodies[i] as process i of len(bodies), each inside distributed.agreement, in
  threads sharing one key-value store; [what each raised (None: nothing)]."""
  store, local = _KeyValueStore(), threading.local()

  class PerProcess:  # each process counts its own exchanges
    def __next__(self):
      return next(local.exchanges)

  monkeypatch.setattr(distributed, "_client", lambda: store)
  monkeypatch.setattr(distributed, "_exchanges", PerProcess())
  monkeypatch.setattr(distributed, "EXCHANGE_TIMEOUT_S", 30)
  monkeypatch.setattr(jax, "process_count", lambda: len(bodies))
  monkeypatch.setattr(jax, "process_index", lambda: local.index)
  outcomes = [None] * len(bodies)

  def process(index):
    local.index, local.exchanges = index, itertools.count()
    try:
      with distributed.agreement((errors.UserError,)):
        bodies[index]()
    except Exception as error:  # pylint: disable=broad-except
      outcomes[index] = error

  threads = [threading.Thread(target=process, args=(i,), daemon=True)
             for i in range(len(bodies))]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join(timeout=60)
  # Each exchange deletes the keys of the one before: only the last one's are left.
  assert len({key.rsplit("/", 1)[0] for key in store.values}) <= 1, store.values
  return outcomes


def _fails(error):
  def body():
    raise error
  return body


def test_a_check_failing_on_one_process_fails_on_all_with_one_message(monkeypatch):
  missing = "config field 'data.files': '/w1/x.txt' matches no file."
  outcomes = _as_processes(monkeypatch, [
      lambda: None, _fails(errors.ConfigError(missing)), lambda: None])
  assert [type(o) for o in outcomes] == [errors.ConfigError] * 3
  assert {str(o) for o in outcomes} == {f"process 1 of 3: {missing}"}

  # Two failures: the first failing process's class, every message once.
  locked = workdir_lib.WorkdirError("--workdir 'r' is locked.")
  outcomes = _as_processes(monkeypatch, [
      _fails(locked), _fails(errors.ConfigError(missing)),
      _fails(errors.ConfigError(missing))])
  assert [type(o) for o in outcomes] == [workdir_lib.WorkdirError] * 3
  assert {str(o) for o in outcomes} == {
      f"process 0 of 3: {locked}; processes 1, 2 of 3: {missing}"}

  assert _as_processes(monkeypatch, [lambda: None, lambda: None]) == [None, None]


def test_an_error_that_is_not_the_users_is_reported_by_the_others(monkeypatch):
  bug = KeyError("position")
  outcomes = _as_processes(monkeypatch, [lambda: None, _fails(bug)])
  assert outcomes[1] is bug  # its own traceback
  assert isinstance(outcomes[0], distributed.ProcessFailed)
  assert str(outcomes[0]) == "process 1 of 2: KeyError: 'position'"


def test_a_process_that_never_answers_is_named(monkeypatch):
  monkeypatch.setattr(distributed, "EXCHANGE_TIMEOUT_S", 0.2)
  store = _KeyValueStore()
  monkeypatch.setattr(distributed, "_client", lambda: store)
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  monkeypatch.setattr(jax, "process_index", lambda: 0)
  with pytest.raises(distributed.ProcessFailed, match="process 1 of 2 did not answer "
                     r"\(DEADLINE_EXCEEDED"):
    distributed.exchange(True)


def test_a_checkpoint_one_process_cannot_read_is_damaged_for_every_process(monkeypatch):
  """Process 1 cannot read a checkpoint that process 0 reads: both treat it as damaged,
  with one message naming process 1, so that both go on to the same earlier step."""
  problem = "/w/checkpoints/4/state cannot be read: a file is missing"
  found = [None, None]

  def process(index):
    def read():
      if index == 1:
        raise checkpoint_lib._Damaged(problem)  # pylint: disable=protected-access
      return "state"

    def body():
      try:
        found[index] = checkpoint_lib._on_every_process(read)  # pylint: disable=protected-access
      except checkpoint_lib._Damaged as error:  # pylint: disable=protected-access
        found[index] = f"damaged: {error}"
    return body

  assert _as_processes(monkeypatch, [process(0), process(1)]) == [None, None]
  assert found == [f"damaged: process 1 of 2: {problem}"] * 2

  found[:] = [None, None]
  def reads(index):
    def body():
      found[index] = checkpoint_lib._on_every_process(lambda: "state")  # pylint: disable=protected-access
    return body
  assert _as_processes(monkeypatch, [reads(0), reads(1)]) == [None, None]
  assert found == ["state", "state"]


def test_processes_that_see_different_checkpoints_are_stopped(monkeypatch):
  """A work directory on each worker's own disk: process 1 sees no checkpoint where
  process 0 sees step 6, and neither may start, resume or refuse on its own."""
  class Seen:
    directory = "runs/x/checkpoints"

    def __init__(self, step):
      self.step = step

    def latest_step(self):
      return self.step

  seen = [Seen(6), Seen(None)]
  outcomes = _as_processes(monkeypatch, [
      lambda: train_loop._latest_step(seen[0]), lambda: train_loop._latest_step(seen[1])])  # pylint: disable=protected-access
  assert [type(o) for o in outcomes] == [checkpoint_lib.CheckpointError] * 2
  assert str(outcomes[0]) == str(outcomes[1])
  assert ("the processes see different checkpoints in runs/x/checkpoints (process 0: "
          "step 6, process 1: none)") in str(outcomes[0])

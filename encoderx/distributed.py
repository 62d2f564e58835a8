"""Joining the other processes of a multi-host run (jax.distributed), before JAX is used.

A run is one process per host (per TPU VM worker, or per GPU / CPU machine). The
processes find each other through a coordinator (process 0's address):

- On a Cloud TPU VM JAX reads them from the TPU's metadata: every worker runs the same
  command, nothing to give (launch/tpu.sh).
- Elsewhere (GPU or CPU clusters, or several processes on one machine) give all three,
  as flags or in the environment (JAX's own name for the address):
      --coordinator_address=HOST:PORT  (JAX_COORDINATOR_ADDRESS)
      --num_processes=N                (JAX_NUM_PROCESSES)
      --process_id=I, 0 <= I < N       (JAX_PROCESS_ID)
Without either, the run is one process and nothing is initialized.

Once joined, the processes agree on the outcome of each phase of start-up checks
(`agreement`): a check that fails on one process (a file missing on one worker) fails on
all of them with the same message, instead of leaving the others waiting in their next
collective until JAX's timeout.
"""
from __future__ import annotations

import contextlib
import importlib
import itertools
import json
import logging
import os

import jax
import numpy as np

from encoderx import errors

logger = logging.getLogger("encoderx")

ENVIRONMENT = {"coordinator_address": "JAX_COORDINATOR_ADDRESS",
               "num_processes": "JAX_NUM_PROCESSES", "process_id": "JAX_PROCESS_ID"}


def on_cloud_tpu_vm() -> bool:
  """TPU chips on this machine's PCI bus: the check JAX's own TPU set-up makes (there is no
  public API for it; on an older or newer JAX without it, assume not)."""
  try:
    from jax._src import hardware_utils  # pylint: disable=g-import-not-at-top
    chips, _ = hardware_utils.num_available_tpu_chips_and_device_id()
  except (ImportError, AttributeError, OSError, ValueError):
    return False
  return chips > 0


def _settings(coordinator_address: str, num_processes: int | None,
              process_id: int | None) -> dict:
  """The flags, each falling back to its environment variable."""
  given = {"coordinator_address": coordinator_address, "num_processes": num_processes,
           "process_id": process_id}
  for name, variable in ENVIRONMENT.items():
    if given[name] in (None, "") and os.environ.get(variable, ""):
      value = os.environ[variable]
      try:
        given[name] = value if name == "coordinator_address" else int(value)
      except ValueError:
        errors.fail(f"--{name}", f"{variable}={value!r} is not a whole number.")
  return given


def initialize(coordinator_address: str = "", num_processes: int | None = None,
               process_id: int | None = None) -> bool:
  """jax.distributed.initialize() when this run is one of several processes; True then.

  Raises ConfigError naming the flag when the settings are incomplete or inconsistent.
  """
  settings = _settings(coordinator_address, num_processes, process_id)
  if any(value not in (None, "") for value in settings.values()):
    missing = [name for name, value in settings.items() if value in (None, "")]
    if missing:
      errors.fail(f"--{missing[0]}", f"(or {ENVIRONMENT[missing[0]]}) is missing: a run "
                      "of several processes needs --coordinator_address, --num_processes "
                      "and --process_id.")
    if settings["num_processes"] < 1:
      errors.fail("--num_processes", f"must be >= 1, got {settings['num_processes']}.")
    if not 0 <= settings["process_id"] < settings["num_processes"]:
      errors.fail("--process_id", f"{settings['process_id']} is not in [0, "
                      f"{settings['num_processes']}) (--num_processes).")
    if settings["num_processes"] == 1:
      return False
    jax.distributed.initialize(**settings)
  elif on_cloud_tpu_vm():
    jax.distributed.initialize()  # the workers and coordinator from the TPU's metadata
  else:
    return False
  logger.info("process %d of %d (%d of %d devices here)", jax.process_index(),
              jax.process_count(), jax.local_device_count(), jax.device_count())
  return True



class ProcessFailed(RuntimeError):
  """Another process of the run failed with an error that is not the user's (or did not
  answer); its own log has the traceback."""


# How long a process waits for the others at an exchange: the slowest process's checks
# (reading a corpus, restoring a checkpoint) hold the others up at most this long.
EXCHANGE_TIMEOUT_S = 30 * 60
_exchanges = itertools.count()  # exchanges happen in the same order on every process
_PREFIX = "encoderx/exchange"


def _client():
  """jax.distributed's coordination client (its key-value store). It has no public API in
  jax 0.10; orbax reaches it the same way."""
  from jax._src import distributed as jax_distributed  # pylint: disable=g-import-not-at-top
  return jax_distributed.global_state.client


def exchange(value) -> list:
  """Every process's `value` (JSON-able), in process order, through jax.distributed's
  key-value store (no device work). Every process must call it at the same point of the
  run. One process: [value], nothing exchanged. Raises ProcessFailed when a process does
  not answer within EXCHANGE_TIMEOUT_S."""
  count, me = jax.process_count(), jax.process_index()
  if count == 1:
    return [value]
  client, number = _client(), next(_exchanges)
  client.key_value_set(f"{_PREFIX}/{number}/{me}", json.dumps(value))
  values = []
  for index in range(count):
    try:
      values.append(json.loads(client.blocking_key_value_get(
          f"{_PREFIX}/{number}/{index}", EXCHANGE_TIMEOUT_S * 1000)))
    except jax.errors.JaxRuntimeError as error:
      raise ProcessFailed(f"process {index} of {count} did not answer ("
                          f"{_first_line(error)}).") from None
  if number:  # every process is past the previous exchange: its keys can go
    client.key_value_delete(f"{_PREFIX}/{number - 1}/{me}")
  return values


def any_process(flag: bool) -> bool:
  """Whether `flag` holds on any process (one small all-gather over the devices); every
  process must call it at the same point. One process: `flag`."""
  if jax.process_count() == 1:
    return flag
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  return bool(np.any(multihost_utils.process_allgather(np.int32(flag))))


def _first_line(error: Exception) -> str:
  return (str(error).splitlines() or [""])[0][:300]


def _processes(indices: list[int]) -> str:
  names = ", ".join(map(str, indices))
  return (f"process{'es' if len(indices) > 1 else ''} {names} of {jax.process_count()}")


@contextlib.contextmanager
def agreement(user_errors: tuple[type[Exception], ...]):
  """A phase of checks whose outcome every process shares. Every process runs the body;
  they exchange success or the error (class and message), and if the body raised on any
  of them, every process raises the same error: the class of the first failing process's
  error (one of `user_errors`, the user errors, or a subclass), with a message naming the
  failing processes and what each reported ('process 1 of 2: config field ...').
  A process whose own error is not one of `user_errors` re-raises it (its traceback is the
  report); the others raise ProcessFailed naming it.

  The body must not enter a collective: a process that failed before it would leave the
  others waiting there. One process: the body runs as it is, nothing exchanged.
  """
  if jax.process_count() == 1:
    yield
    return
  failure = None
  try:
    yield
  except Exception as error:  # pylint: disable=broad-except  (shared, then raised)
    failure = error
  kinds = [i for i, kind in enumerate(user_errors) if isinstance(failure, kind)]
  reports = exchange(None if failure is None else {
      "kind": kinds[0] if kinds else None,
      "class": f"{type(failure).__module__}:{type(failure).__qualname__}",
      "message": str(failure) if kinds
                 else f"{type(failure).__name__}: {_first_line(failure)}",
      # What a user error is about, which the command line names as flags.
      "argument": getattr(failure, "argument", ""), "remedy": getattr(failure, "remedy", "")})
  failed = [i for i, report in enumerate(reports) if report is not None]
  if not failed:
    return
  if failure is not None and not kinds:
    raise failure
  by_message = {}
  for index in failed:
    by_message.setdefault(reports[index]["message"], []).append(index)
  message = "; ".join(f"{_processes(indices)}: {text}" for text, indices in by_message.items())
  first = reports[failed[0]]
  kind = ProcessFailed if first["kind"] is None else _error_class(first["class"],
                                                                  user_errors[first["kind"]])
  error = kind(message)
  for name in ("argument", "remedy"):
    if first[name]:
      setattr(error, name, first[name])
  raise error from failure


def _error_class(name: str, base: type[Exception]) -> type[Exception]:
  """The class 'module:QualName' that another process raised (every process runs the same
  code), where it is a `base`; else `base` itself."""
  module, _, qualname = name.partition(":")
  found = importlib.import_module(module)
  for part in qualname.split("."):
    found = getattr(found, part, None)
  return found if isinstance(found, type) and issubclass(found, base) else base

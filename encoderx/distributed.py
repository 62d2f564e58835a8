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
"""
from __future__ import annotations

import logging
import os

import jax

from encoderx import config as config_lib

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
        config_lib.fail(f"--{name}", f"{variable}={value!r} is not a whole number.")
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
      config_lib.fail(f"--{missing[0]}", f"(or {ENVIRONMENT[missing[0]]}) is missing: a run "
                      "of several processes needs --coordinator_address, --num_processes "
                      "and --process_id.")
    if settings["num_processes"] < 1:
      config_lib.fail("--num_processes", f"must be >= 1, got {settings['num_processes']}.")
    if not 0 <= settings["process_id"] < settings["num_processes"]:
      config_lib.fail("--process_id", f"{settings['process_id']} is not in [0, "
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


"""The work directory of a run: usable before anything is compiled, and one run at a time.

    path = workdir.prepare(path)     # a writable directory, or WorkdirError
    with workdir.Lock(path):         # refuses a second run on the same directory
      ...

The lock is the file `<workdir>/encoderx.lock`, holding the owner's pid, host and start
time (for messages), and locked with flock(2) while the run lasts. The kernel drops a
flock when its process dies, however it dies, so a lock file left by a run killed with
SIGKILL is stale exactly when its flock can be taken: it is taken over (and logged), with
no guessing from pids, which get reused. A file written by a run on another host is
refused even when its flock is free, since flocks may not reach across hosts on a shared
file system: the message names the file to delete once that run is known to be gone.

A remote work directory (gs://, encoderx/files.py) cannot be flock'ed, and an object
store has no lock to take instead: it is not locked, and two runs given the same one
would overwrite each other's checkpoints. Give each run its own.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import tempfile
import time

from encoderx import errors
from encoderx import files as files_lib

logger = logging.getLogger("encoderx")

LOCK_NAME = "encoderx.lock"


class WorkdirError(errors.UserError, OSError):
  """A work directory this run cannot use; the message says why and what to do."""


def prepare(path: str) -> str:
  """Creates `path` if needed and checks that files can be written in it; returns it
  absolute. Raises WorkdirError (a file in the way, no permission, a read-only disk)."""
  directory = files_lib.path(path)
  path = str(directory)
  if directory.exists() and not directory.is_dir():
    raise WorkdirError(f"'{path}' is a file, not a directory. Choose another path (a "
                       "directory, existing or not).", argument="workdir")
  try:
    directory.mkdir(parents=True, exist_ok=True)
    if files_lib.is_remote(path):  # no temporary files on an object store: write one
      probe = directory / f".write-test-{socket.gethostname()}-{os.getpid()}"
      probe.write_bytes(b"")
      probe.unlink()
    else:
      with tempfile.TemporaryFile(dir=path, prefix=".write-test-"):
        pass
  except Exception as error:  # pylint: disable=broad-except  (OSError; remote: tf's)
    reason = getattr(error, "strerror", None) or getattr(error, "message", None) or error
    raise WorkdirError(f"'{path}' is not writable ({reason}). Choose a directory this "
                       "user can write to, on a disk with free space.", argument="workdir"
                       ) from None
  return path


class Lock:
  """Exclusive use of a work directory by this process (a context manager); a remote
  one is not locked (see above)."""

  def __init__(self, directory: str):
    self.path = os.path.join(directory, LOCK_NAME)
    self.remote = files_lib.is_remote(directory)
    self.owner = {"pid": os.getpid(), "host": socket.gethostname(),
                  "since": time.strftime("%Y-%m-%d %H:%M:%S")}
    self._fd = None

  def _owner(self, fd: int) -> dict:
    try:
      return json.loads(os.pread(fd, 4096, 0).decode("utf-8") or "{}")
    except (OSError, ValueError):
      return {}  # a torn write: its writer died while writing

  def _refuse(self, owner: dict, held: bool):
    directory = os.path.dirname(self.path)
    who = (f"pid {owner.get('pid', '?')} on host {owner.get('host', '?')}, since "
           f"{owner.get('since', '?')}")
    if held:
      raise WorkdirError(
          f"{directory} is in use by another run ({who}); two runs in one directory would "
          "overwrite each other's checkpoints. Wait for it to end, stop it, or choose "
          "another work directory.")
    raise WorkdirError(
        f"{directory} is locked by a run on another host ({who}), which cannot be checked "
        f"from here. If that run is gone, delete {self.path}; else choose another work "
        "directory.")

  def acquire(self) -> None:
    if self.remote:
      logger.warning("%s is remote and cannot be locked: make sure no other run uses it.",
                     os.path.dirname(self.path))
      return
    while True:
      fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except BlockingIOError:
        owner = self._owner(fd)
        os.close(fd)
        self._refuse(owner, held=True)
      try:
        same_file = os.fstat(fd).st_ino == os.stat(self.path).st_ino
      except FileNotFoundError:
        same_file = False
      if not same_file:  # released (unlinked) by its owner meanwhile: lock the new file
        os.close(fd)
        continue
      break
    previous = self._owner(fd)
    if previous.get("host", self.owner["host"]) != self.owner["host"]:
      os.close(fd)
      self._refuse(previous, held=False)
    if previous:
      logger.warning("%s: the run that locked it before (pid %s, since %s) ended without "
                     "releasing the lock (killed?); taking it over.",
                     os.path.dirname(self.path), previous.get("pid"), previous.get("since"))
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(self.owner).encode("utf-8"), 0)
    self._fd = fd

  def release(self) -> None:
    if self._fd is None:
      return
    try:
      os.remove(self.path)  # before unlocking: a waiting run then locks a new file
    except FileNotFoundError:
      pass
    os.close(self._fd)
    self._fd = None

  def __enter__(self) -> "Lock":
    self.acquire()
    return self

  def __exit__(self, *exc) -> None:
    self.release()

"""Stopping a run at a step boundary when asked (SIGINT, SIGTERM), on every process."""
from __future__ import annotations

import contextlib
import logging
import signal
import threading

import jax

from encoderx import distributed

logger = logging.getLogger("encoderx")


class StopRequest:
  """Set by SIGINT/SIGTERM; the loop saves a checkpoint and returns at the next step.

  With several processes a signal may reach only one of them (SIGTERM to one worker):
  they agree at the steps where the host waits for the device anyway (the log steps,
  the same steps on every process), and all stop after the first of those at or after
  the request, with one checkpoint saved together.
  """

  def __init__(self):
    self.requested = False  # this process was asked to stop
    self.stopping = False  # the run stops after this step (the same on every process)

  def update(self, agree: bool) -> bool:
    """Whether the run stops after this step; `agree`: every process checks now."""
    if jax.process_count() == 1:
      self.stopping = self.stopping or self.requested
    elif agree and not self.stopping:
      self.stopping = distributed.any_process(self.requested)
    return self.stopping

  @contextlib.contextmanager
  def installed(self):
    if threading.current_thread() is not threading.main_thread():
      yield
      return
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def handle(signum, frame):
      if self.requested:  # a second Ctrl-C stops at once
        previous[signal.SIGINT](signum, frame)
      self.requested = True
      logger.warning("stop requested: saving a checkpoint at the end of this step%s",
                     " (the next log step, with the other processes)"
                     if jax.process_count() > 1 else "")

    for sig in previous:
      signal.signal(sig, handle)
    try:
      yield
    finally:
      for sig, handler in previous.items():
        signal.signal(sig, handler)

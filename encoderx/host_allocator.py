"""Which malloc this process runs on, and a warning when it is the slow one for a CPU step.

XLA's CPU runtime allocates a step's temporaries anew on every execution. glibc's malloc
hands such large blocks back to the kernel when they are freed (mmap/munmap, heap trims),
and the kernel faults them in again, zeroed, on the next step: BERT-Small's step took
~0.5 million page faults and ~1 s of system time per step, and ran 1.4-1.5x slower than
under tcmalloc or jemalloc, which keep freed memory for reuse (CHANGELOG.md, 2026-11-26).

The allocator is chosen before a process starts (LD_PRELOAD); launch/setup.sh preloads
tcmalloc where it is installed. This module only tells which one is in use.
"""
from __future__ import annotations

import logging
import sys

logger = logging.getLogger("encoderx")

# Shared-object name fragments -> the allocator's name.
KNOWN = {"libtcmalloc": "tcmalloc", "libjemalloc": "jemalloc", "libmimalloc": "mimalloc"}


def name() -> str:
  """'tcmalloc', 'jemalloc' or 'mimalloc' when one is loaded in this process (preloaded),
  else 'system' (glibc's malloc on Linux; also what other platforms report)."""
  try:
    with open("/proc/self/maps", encoding="utf-8") as maps:
      mapped = maps.read()
  except OSError:  # not Linux
    return "system"
  for fragment, allocator in KNOWN.items():
    if fragment in mapped:
      return allocator
  return "system"


def warn_if_slow_for(platform: str) -> bool:
  """Logs a warning (and returns True) when the step runs on CPU on Linux with glibc's
  malloc, which costs it ~1.4x."""
  if platform != "cpu" or not sys.platform.startswith("linux") or name() != "system":
    return False
  logger.warning(
      "the train step runs on CPU with glibc's malloc, which returns each step's buffers "
      "to the kernel and faults them in again (~1.4x slower steps). Preload tcmalloc: "
      "`apt-get install libtcmalloc-minimal4` and LD_PRELOAD=libtcmalloc_minimal.so.4; "
      "`source launch/setup.sh` does both (docs/getting-started.md).")
  return True

#!/usr/bin/env bash
# Creates .venv (Python 3.11) with encoderx installed editable and its pinned stack.
# Usage: source launch/setup.sh [extras]   e.g. extras "hf,test"
# Re-running is quick: the install is skipped while setup.py and the extras are unchanged.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
extras="${1:-}"
python="${PYTHON:-python3.11}"
command -v "$python" >/dev/null || python=python3
if [ ! -x .venv/bin/python ]; then
  echo "encoderx: creating .venv with $($python --version)"
  "$python" -m venv .venv
fi
stamp=".venv/.setup-stamp-$(sha1sum setup.py | cut -c1-12)-${extras//,/_}"
if [ ! -f "$stamp" ]; then
  echo "encoderx: installing the pinned stack${extras:+ with extras [$extras]} (first time: a few minutes)"
  .venv/bin/python -m pip install --quiet --upgrade pip setuptools wheel
  # seqeval (entity F1 for tagging) is an sdist whose build needs setuptools_scm < 9:
  # build it against that, outside pip's isolated build environment.
  .venv/bin/python -m pip install --quiet "setuptools_scm<9"
  .venv/bin/python -m pip install --quiet --no-build-isolation "seqeval==1.2.2"
  .venv/bin/python -m pip install --quiet -e ".${extras:+[$extras]}"
  touch "$stamp"
fi
# The tests compile the Pallas attention's Triton IR for an H100 without a GPU
# (launch/triton_check.py). triton goes apart from the environment, into .venv/triton,
# which only that script puts on its path: tensorflow and triton in one process abort
# (their LLVMs register the same options), and torch imports triton wherever it finds it.
if [[ ",$extras," == *",test,"* ]] && [ ! -f .venv/triton/.triton-3.9.0 ]; then
  echo "encoderx: installing triton 3.9.0 into .venv/triton (launch/triton_check.py)"
  .venv/bin/python -m pip install --quiet --no-deps --target .venv/triton triton==3.9.0
  touch .venv/triton/.triton-3.9.0
fi
# tcmalloc for every process started from here. XLA's CPU runtime allocates each step's
# buffers anew, and glibc's malloc hands large blocks back to the kernel and faults them in
# again: CPU steps run ~1.4x slower on it (encoderx/host_allocator.py). Installed with apt
# where this shell may; elsewhere the system's malloc, slower but the same results.
tcmalloc_so() { /sbin/ldconfig -p 2>/dev/null | awk '/libtcmalloc_minimal\.so\.4 /{print $NF; exit}'; }
if [ -z "$(tcmalloc_so)" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "encoderx: installing libtcmalloc-minimal4 (apt) for faster CPU steps"
  apt-get install -y -qq libtcmalloc-minimal4 >/dev/null 2>&1 ||
    { apt-get update -qq >/dev/null 2>&1 &&
      apt-get install -y -qq libtcmalloc-minimal4 >/dev/null 2>&1; } || true
fi
if [ -n "$(tcmalloc_so)" ]; then
  case ":${LD_PRELOAD:-}:" in
    *libtcmalloc*) ;;
    *) export LD_PRELOAD="$(tcmalloc_so)${LD_PRELOAD:+:$LD_PRELOAD}" ;;
  esac
  # tcmalloc reports every allocation over 1 GiB on stderr; BERT-large's steps make them.
  export TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD="${TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD:-1099511627776}"
else
  echo "encoderx: tcmalloc not found (apt-get install libtcmalloc-minimal4): CPU steps run" \
       "on the system's malloc, ~1.4x slower"
fi
export PATH="$PWD/.venv/bin:$PATH"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-3}"

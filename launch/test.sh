#!/usr/bin/env bash
# Set up .venv with the Hugging Face and test extras, then run the test suite.
# Extra arguments go to pytest, e.g. -k parity.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh" hf,test
# Two workers: the tests compile on one core each (a 2-core machine: 48 min, not 56).
# --reruns with a pattern that matches no error: a failed test is never rerun, but a test
# whose worker process crashed natively (XLA, LLVM) is run once more on a fresh worker
# (see docs/getting-started.md, "Running the tests").
# --durations=30: the record of a run (CI's included) says where its time went.
# tmp_path_retention_policy=failed: a passing test's directory (checkpoints, exports) goes
# when it ends, so the suite holds tens of MB of /tmp at a time instead of ~1 GB a run.
exec python -m pytest tests -q -n 2 --reruns 1 --only-rerun '^(?!)' --durations=30 \
  -o tmp_path_retention_policy=failed "$@"

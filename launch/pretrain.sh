#!/usr/bin/env bash
# The main job: set up .venv, then pretrain a tiny BERT (MLM + NSP) on the bundled
# Austen corpus. Extra arguments go to encoderx.train, e.g. --config.train.steps=300.
# WORKDIR (default runs/bert_tiny-<date>-<time>) receives checkpoints and TensorBoard logs.
set -euo pipefail
# An explicit (empty) extras argument: sourced without one, setup.sh would take ours.
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh" ""
workdir="${WORKDIR:-runs/bert_tiny-$(date +%Y%m%d-%H%M%S)}"
echo "encoderx: pretraining configs/bert.py:tiny into $workdir"
exec python -m encoderx.train --config=configs/bert.py:tiny --workdir="$workdir" "$@"

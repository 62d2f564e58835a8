#!/usr/bin/env bash
# Reference loss curves: trains tiny configs over their default budget (configs/<name>.py
# as it is: 1,000 steps x 32 x 128 on the bundled Austen corpus) with a held-out
# evaluation every 100 steps into runs/curves/<name>, and draws docs/curves/<name>.png
# (training and held-out MLM loss; XLNet's PLM loss). Arguments: config names (default:
# every tiny config). Tens of minutes per config on two CPU cores: use a quiet machine.
# Rerunning continues a run left unfinished (--resume).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
configs=("$@")
if [ ${#configs[@]} -eq 0 ]; then
  configs=(bert_tiny roberta_tiny albert_tiny spanbert_tiny deberta_tiny electra_tiny xlnet_tiny)
fi
mkdir -p docs/curves
for name in "${configs[@]}"; do
  metric=mlm_loss
  [ "$name" = xlnet_tiny ] && metric=plm_loss
  python -m encoderx.train --config="configs/$name.py" --workdir="runs/curves/$name" \
    --config.eval.every_steps=100 --resume --allow_fresh_start
  python -m encoderx.plot "runs/curves/$name" --output="docs/curves/$name.png" \
    --metric="$metric" --title="$name: $metric (bundled Austen corpus)"
done

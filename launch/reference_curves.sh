#!/usr/bin/env bash
# Reference loss curves: trains the families' tiny configs over their default budget
# (configs/<family>.py:tiny as it is: 1,000 steps x 32 x 128 on the bundled Austen corpus;
# modernbert's tiny is its recipe's first phase, 600 steps)
# with a held-out evaluation every 100 steps into runs/curves/<family>_tiny, and draws
# docs/curves/<family>_tiny.png (training and held-out MLM loss; XLNet's PLM loss).
# Arguments: families (default: every family). Tens of minutes per config on two CPU cores: use a quiet machine.
# Rerunning continues a run left unfinished (--resume).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
configs=("$@")
if [ ${#configs[@]} -eq 0 ]; then
  configs=(bert roberta albert spanbert deberta electra xlnet modernbert eurobert)
fi
mkdir -p docs/curves
for family in "${configs[@]}"; do
  name="${family}_tiny"
  metric=mlm_loss
  [ "$family" = xlnet ] && metric=plm_loss
  python -m encoderx.train --config="configs/$family.py:tiny" --workdir="runs/curves/$name" \
    --config.eval.every_steps=100 --resume --allow_fresh_start
  python -m encoderx.tools.figures.plot "runs/curves/$name" --output="docs/curves/$name.png" \
    --metric="$metric" --title="$name: $metric (bundled Austen corpus)"
done

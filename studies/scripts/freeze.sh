#!/usr/bin/env bash
# Regenerates studies/freeze.md: the freeze ablation. The paper freezes λ at the switch point and anneals
# it from there; lambda-harden-learn keeps learning λ during the anneal ((1 − a)·λ(s) + a·λ_target).
# Same seeds, same switch point (0.25), paired after ReLU: 10 seeds on mnist1d-mlp and fmnist-mlp.
# Resumable (stored runs are skipped); about 15 minutes on 2 idle cores.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/freeze}
for task in mnist1d-mlp fmnist-mlp; do
    lambda-gelu lab run $task --seeds 10 --arms lambda-harden lambda-harden-learn --workers 2 --threads 1 \
        --quiet --no-report --out "$OUT"
done
lambda-gelu lab report --out "$OUT" --output studies/freeze.md --title "Freeze λ at the switch, or keep learning it? (the freeze ablation)"

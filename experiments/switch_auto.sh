#!/usr/bin/env bash
# Regenerates docs/switch_auto.md: where switch_at="auto" switches on mnist1d-mlp and what it does to
# accuracy after ReLU, paired by seed against the fixed switch points 0.10 / 0.25 / 0.50 (10 seeds).
# Resumable (stored runs are skipped); about half an hour on 2 idle cores.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/switch}
for s in auto 0.10 0.25 0.50; do
    lambda-gelu run mnist1d-mlp --seeds 10 --arms lambda-harden --switch-at $s --workers 2 --threads 1 \
        --quiet --no-report --out "$OUT"
done
# where it lands on fmnist-mlp (8 seeds; its fixed-switch arms are in docs/results.md's store, not here)
lambda-gelu run fmnist-mlp --seeds 8 --arms lambda-harden --switch-at auto --workers 2 --threads 1 \
    --quiet --no-report --out "$OUT"
lambda-gelu report --out "$OUT" --output docs/switch_auto.md

#!/usr/bin/env bash
# Regenerates docs/sparsity.md: exact zeros after ReLU against accuracy for the L1 activation penalty
# (arm lambda-harden-sparse) at peaks 1 / 3 / 10, paired by seed against the annealed arm without it,
# 5 seeds on fmnist-mlp, stdlib-gpt and fmnist-vit. Resumable (stored runs are skipped); about an hour
# on 2 idle cores.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/sparsity}
T="--seeds 5 --workers 2 --threads 1 --quiet --no-report --out $OUT"
for task in fmnist-mlp stdlib-gpt fmnist-vit; do
    lambda-gelu run $task --arms lambda-harden $T
    for peak in 1 3 10; do
        lambda-gelu run $task --arms lambda-harden-sparse --set sparsity=$peak $T
    done
done
lambda-gelu report --out "$OUT" --output docs/sparsity.md

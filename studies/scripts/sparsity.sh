#!/usr/bin/env bash
# Regenerates studies/sparsity.md: exact zeros after ReLU against accuracy for the L1 activation penalty
# (arm lambda-harden-sparse) at peaks 1 / 3 / 10 (and 5 on fmnist-mlp), paired by seed against the
# annealed arm without it, 5 seeds on fmnist-mlp, stdlib-gpt and fmnist-vit. Resumable (stored runs are skipped); about an hour
# on 2 idle cores.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/sparsity}
T="--seeds 5 --workers 2 --threads 1 --quiet --no-report --out $OUT"
for task in fmnist-mlp stdlib-gpt fmnist-vit; do
    lambda-gelu lab run $task --arms lambda-harden $T
    peaks="1 3 10"; [ $task = fmnist-mlp ] && peaks="1 3 5 10"  # 5: between 3 (84% zeros) and 10 (-1 point)
    for peak in $peaks; do
        lambda-gelu lab run $task --arms lambda-harden-sparse --set sparsity=$peak $T
    done
done
lambda-gelu lab report --out "$OUT" --output studies/sparsity.md --title "Activation sparsity against quality (the L1 penalty)"

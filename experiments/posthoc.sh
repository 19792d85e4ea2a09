#!/usr/bin/env bash
# Regenerates docs/posthoc.md: post-hoc conversion of trained GELU networks at equal compute. Each seed's
# gelu arm is converted to exact ReLU with lambda_gelu.reluize, annealed (reluize-anneal) or swapped at
# once (reluize-swap), distilling from itself for 10% of its training steps; paired against each other, the
# GELU original and, on the MLPs, the network annealed during training (lambda-harden). 10 seeds on
# mnist1d-mlp and fmnist-mlp, 5 on stdlib-gpt. Resumable; about 40 minutes on 2 idle cores.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/posthoc}
T="--workers 2 --threads 1 --quiet --no-report --out $OUT"
for task in mnist1d-mlp fmnist-mlp; do
    lambda-gelu run $task --seeds 10 --arms gelu lambda-harden reluize-anneal reluize-swap $T
done
lambda-gelu run stdlib-gpt --seeds 5 --arms gelu reluize-anneal reluize-swap $T
lambda-gelu report --out "$OUT" --output docs/posthoc.md

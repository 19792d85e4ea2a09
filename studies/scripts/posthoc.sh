#!/usr/bin/env bash
# Regenerates studies/posthoc.md: post-hoc conversion of trained GELU networks at equal steps. Each seed's
# gelu arm is converted to exact ReLU with lambda_gelu.reluize — annealed (reluize-anneal), swapped at once
# (reluize-swap), or reconstructed block by block (reluize-blockwise) — distilling from itself for 10% of its
# training steps; paired against each other, the GELU original and, on the MLPs, the network annealed
# during training (lambda-harden). 10 seeds on mnist1d-mlp and fmnist-mlp, 5 on stdlib-gpt, fmnist-vit and fmnist-resnet.
# Resumable; about 80 minutes on 2 idle cores.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/posthoc}
T="--workers 2 --threads 1 --quiet --no-report --out $OUT"
POSTHOC="reluize-anneal reluize-swap reluize-blockwise"
for task in mnist1d-mlp fmnist-mlp; do
    lambda-gelu lab run $task --seeds 10 --arms gelu lambda-harden $POSTHOC $T
done
lambda-gelu lab run stdlib-gpt --seeds 5 --arms gelu $POSTHOC $T
lambda-gelu lab run fmnist-vit --seeds 5 --arms gelu $POSTHOC $T
lambda-gelu lab run fmnist-resnet --seeds 5 --arms gelu $POSTHOC $T
lambda-gelu lab report --out "$OUT" --output studies/posthoc.md --title "Post-hoc conversion of trained GELU networks at equal steps"

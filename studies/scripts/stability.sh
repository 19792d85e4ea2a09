#!/usr/bin/env bash
# Regenerates studies/stability.md: does the layerwise hardness profile stabilise with longer training?
# The paper found stable profiles on ResNet-18 and DeiT; the lab's 2-epoch models do not (mean Spearman
# 0.53-0.60 across seeds, studies/results.md). The λ-GELU arm (learned λ, no hardening) on fmnist-vit and
# fmnist-resnet, 5 seeds, trained for 2 and for EPOCHS (default 8) epochs; each length is its own
# experiment in the report, with its Spearman ρ between every pair of seeds.
# Resumable (stored runs are skipped); about an hour on 2 idle cores.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/stability}
EPOCHS=${EPOCHS:-8}
for task in fmnist-vit fmnist-resnet; do
    for epochs in 2 "$EPOCHS"; do
        lambda-gelu lab run $task --seeds 5 --arms lambda --epochs "$epochs" --workers 2 --threads 1 \
            --quiet --no-report --out "$OUT"
    done
done
lambda-gelu lab report --out "$OUT" --output studies/stability.md --title "Layerwise hardness profiles with longer training"

#!/usr/bin/env bash
# Regenerates studies/posthoc_batchnorm.md: post-hoc conversion of the BatchNorm ResNet (fmnist-resnet), where
# the swap's damage is mostly BatchNorm's running statistics. Each seed's gelu arm is converted with
# lambda_gelu.reluize for 10% of its training steps: the swap + distillation at the lab's default learning
# rate (1e-3) and at 3e-4, the same with BatchNorm re-estimated over 50 batches after the swap (its forward
# passes paid for out of the budget: 69 optimizer steps instead of 86), and the block-by-block
# reconstruction. Paired by seed against the GELU original. Resumable; about 40 minutes on 2 idle cores.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/posthoc_batchnorm}
T="fmnist-resnet --seeds ${SEEDS:-5} --workers 2 --threads 1 --quiet --no-report --out $OUT"
lambda-gelu lab run $T --arms gelu reluize-swap reluize-blockwise
lambda-gelu lab run $T --arms reluize-swap --set posthoc_lr=3e-4
lambda-gelu lab run $T --arms reluize-swap --set posthoc_lr=3e-4 --set posthoc_recalibrate=50
lambda-gelu lab report --out "$OUT" --output studies/posthoc_batchnorm.md --title "Post-hoc conversion of fmnist-resnet with BatchNorm re-estimated"

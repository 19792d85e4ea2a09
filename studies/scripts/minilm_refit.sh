#!/usr/bin/env bash
# Regenerates studies/minilm_refit.md: the real all-MiniLM-L6-v2 converted to exact ReLU by `lambda-gelu reluize`
# with its defaults (abrupt swap, least-squares refit of the layer after each activation over 1024 sentences,
# then distillation; 15 minutes on this machine's cores) and without the refit (--refit 0) in the same budget,
# 3 seeds, paired by seed. Resumable: a finished conversion is kept. Run it on an idle machine: the step count
# is what fits the budget here. About 95 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/minilm-refit}
SEEDS=${SEEDS:-"0 1 2"}
source studies/scripts/minilm_convert.sh
for seed in $SEEDS; do
    convert "$OUT/refit-$seed" --minutes 15 --batching shuffled --lr-schedule constant --seed "$seed"
    convert "$OUT/swap-$seed" --minutes 15 --refit 0 --batching shuffled --lr-schedule constant --seed "$seed"
done
lambda-gelu lab reluize-report "$OUT"/refit-* "$OUT"/swap-* --output studies/minilm_refit.md --title "all-MiniLM-L6-v2 → exact ReLU: with and without the refit"

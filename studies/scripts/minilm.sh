#!/usr/bin/env bash
# Regenerates studies/minilm.md: the real all-MiniLM-L6-v2 converted to exact ReLU by `lambda-gelu reluize`
# annealed with its default budget (15 minutes on this machine's cores), 3 seeds, and the abrupt swap with
# the same loss at the same number of steps, paired by seed. Resumable: a finished conversion is kept. Run it on
# an idle machine: the step count is what fits the budget here. About 95 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/minilm}
SEEDS=${SEEDS:-"0 1 2"}
source studies/scripts/minilm_convert.sh
for seed in $SEEDS; do
    convert "$OUT/anneal-$seed" --minutes 15 --schedule anneal --batching shuffled --lr-schedule constant --seed "$seed"
    steps=$(steps_of "$OUT/anneal-$seed")
    convert "$OUT/swap-$seed" --steps "$steps" --schedule swap --refit 0 --batching shuffled --lr-schedule constant --seed "$seed"
done
lambda-gelu lab reluize-report "$OUT"/anneal-* "$OUT"/swap-* --output studies/minilm.md --title "all-MiniLM-L6-v2 → exact ReLU: swap against anneal"

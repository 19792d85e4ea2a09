#!/usr/bin/env bash
# Regenerates studies/minilm_length.md: the real all-MiniLM-L6-v2 converted to exact ReLU by `lambda-gelu reluize`
# with its defaults (abrupt swap, least-squares refit over 1024 sentences, then distillation on batches of
# sentences of nearly one length, the learning rate falling linearly to 0; 15 minutes on this machine's cores),
# against the same with a constant learning rate, 3 seeds each. The same recipe and seeds on shuffled batches
# with a constant rate are the refit rows of studies/minilm_refit.md (studies/scripts/minilm_refit.sh).
# Resumable: a finished conversion is kept. Run it on an idle machine: the step count is what fits the budget
# here. About 100 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/minilm-length}
SEEDS=${SEEDS:-"0 1 2"}
source studies/scripts/minilm_convert.sh
for seed in $SEEDS; do
    convert "$OUT/default-$seed" --minutes 15 --seed "$seed"
done
for seed in $SEEDS; do
    convert "$OUT/constant-$seed" --minutes 15 --lr-schedule constant --seed "$seed"
done
lambda-gelu lab reluize-report "$OUT"/default-* "$OUT"/constant-* --output studies/minilm_length.md --title "all-MiniLM-L6-v2 → exact ReLU: length batches and a falling rate"

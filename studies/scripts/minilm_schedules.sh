#!/usr/bin/env bash
# Regenerates studies/minilm_schedules.md: the real all-MiniLM-L6-v2 converted to exact ReLU by `lambda-gelu reluize`
# with its defaults (abrupt swap, least-squares refit over 1024 sentences, length batches, the learning rate falling
# linearly to 0; 15 minutes on this machine's cores), 3 seeds, and annealed (`--schedule anneal`, same loss, batches
# and learning-rate schedule) at the same number of steps, paired by seed: the anneal-vs-swap question under the
# current defaults (studies/minilm.md asks it on shuffled batches at a constant rate, without the refit).
# Resumable: a finished conversion is kept. Run it on an idle machine: the step count is what fits the budget
# here (the anneal runs a set number of steps, so only its minutes depend on the load). About 90 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/minilm-schedules}
SEEDS=${SEEDS:-"0 1 2"}
source studies/scripts/minilm_convert.sh
for seed in $SEEDS; do
    convert "$OUT/default-$seed" --minutes 15 --seed "$seed"
    steps=$(steps_of "$OUT/default-$seed")
    convert "$OUT/anneal-$seed" --steps "$steps" --schedule anneal --seed "$seed"
done
lambda-gelu lab reluize-report "$OUT"/default-* "$OUT"/anneal-* --output studies/minilm_schedules.md --title "all-MiniLM-L6-v2 → exact ReLU: the anneal under the CLI's defaults"

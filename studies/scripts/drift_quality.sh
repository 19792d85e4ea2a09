#!/usr/bin/env bash
# Regenerates studies/drift_quality.md: does hardness drift Δλ predict the quality of the ReLU network?
# mnist1d-mlp, 10 seeds: the protocol's four arms and the annealed arm at switch points 0.10 / 0.50, then
# `lambda-gelu deploy` (int8 with ONNX Runtime, exact verification) on all 10 seeds; the report's drift
# section correlates Δλ and the profile's spread with accuracy after ReLU, the substitution drop, int8
# accuracy and the verified fraction. Resumable; about half an hour on 2 idle cores.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/drift}
T="--seeds 10 --workers ${WORKERS:-2} --threads 1 --quiet --no-report --out $OUT"
lambda-gelu lab run mnist1d-mlp $T
for s in 0.10 0.50; do
    lambda-gelu lab run mnist1d-mlp --arms lambda-harden --switch-at $s $T
done
lambda-gelu lab deploy --out "$OUT" --task mnist1d-mlp --seeds 10 --points 10 --time-limit 2
lambda-gelu lab report --out "$OUT" --output studies/drift_quality.md --title "Does hardness drift predict deployment quality? (mnist1d-mlp)"

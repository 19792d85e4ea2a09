#!/usr/bin/env bash
# Regenerates studies/results.md: every sweep behind it, the deployment study, then the report.
# Resumable: rerun after an interruption and stored runs are skipped. About 5.5 hours on 2 idle CPU
# cores (WORKERS runs at once, one torch thread each).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/results}
T="--workers ${WORKERS:-2} --threads 1 --quiet --no-report --out $OUT"

# The protocol's four arms, 10 seeds (issue: the paper's claim on real data).
lambda-gelu lab run fmnist-mlp mnist1d-mlp tabular-mlp --seeds 10 $T
# Baselines the paper did not run.
lambda-gelu lab run fmnist-mlp mnist1d-mlp tabular-mlp --seeds 10 --arms prelu swish-harden gelu-finetune $T
# Switch-point ablation, the automatic switch point among the fixed ones.
for s in 0.10 0.50 auto; do
    lambda-gelu lab run fmnist-mlp mnist1d-mlp --seeds 10 --arms lambda-harden --switch-at $s $T
done
# The freeze ablation: λ keeps learning during the anneal.
lambda-gelu lab run fmnist-mlp mnist1d-mlp --seeds 10 --arms lambda-harden-learn $T
# Robustness of the learned profile to the initial λ.
for init in 1.05 3.0; do
    lambda-gelu lab run fmnist-mlp mnist1d-mlp --seeds 10 --arms lambda --set init_lambda=$init $T
done
# The larger model families: the protocol's four arms, 5 seeds.
lambda-gelu lab run fmnist-resnet stdlib-gpt fmnist-vit --seeds 5 $T
# Robustness of their profiles to the initial λ (2 seeds: what fits here).
for init in 1.05 3.0; do
    lambda-gelu lab run fmnist-resnet fmnist-vit stdlib-gpt --seeds 2 --arms lambda --set init_lambda=$init $T
done
# Hardness drift over temperature × multiplier (learned arm): mnist1d-mlp at 3 seeds, fmnist-mlp and
# fmnist-resnet at 1 (their (0.1, 9) cells are the learned arms above, at 10 and 5 seeds). A cell
# of one seed is one run, so the two halves of the grid run side by side, a worker each.
drift() {
    for t in "$@"; do for c in 1 3 9 27; do
        for task in "mnist1d-mlp --seeds 3" "fmnist-mlp --seeds 1" "fmnist-resnet --seeds 1"; do
            lambda-gelu lab run $task --arms lambda --set temperature=$t --set multiplier=$c \
                --threads 1 --quiet --no-report --out "$OUT"
        done
    done; done
}
drift 0.03 0.1 & first=$!
drift 0.3 1 & second=$!
wait $first
wait $second
# Deployment of the stored models: int8, exact verification, sparsity.
lambda-gelu lab deploy --out "$OUT" --task fmnist-mlp mnist1d-mlp --seeds 5 --points 20 --time-limit 10
lambda-gelu lab report --out "$OUT" --output studies/results.md --title "The main study: the paper's protocol on seven tasks"

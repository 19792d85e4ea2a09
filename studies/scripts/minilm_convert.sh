# Sourced by the MiniLM studies (minilm.sh, minilm_refit.sh, minilm_length.sh, minilm_schedules.sh).
convert() {  # DIR ARGS...: `lambda-gelu reluize all-minilm-l6-v2` into DIR, unless DIR already holds a finished one
    local dir=$1; shift
    [ -f "$dir/reluize_report.json" ] || lambda-gelu reluize all-minilm-l6-v2 --out "$dir" --quiet "$@"
}
steps_of() {  # DIR: the steps the finished conversion in DIR took, for another at the same steps
    python -c "import json, sys; print(json.load(open(sys.argv[1]))['steps'])" "$1/reluize_report.json"
}

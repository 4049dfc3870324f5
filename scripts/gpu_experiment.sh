#!/usr/bin/env bash
# An HPO experiment end to end on this machine's GPU(s), as a user runs it: the demo corpus generated here (once),
# `hpo run` of the GPU preset on a SQLite file (trials placed on the GPUs by the allocator, each recorded by its
# own process), `hpo status`, the trials and the best per arm with the verdict, every trial's MLPerf log through
# the MLPerf compliance checker (open division: a synthetic corpus; the closed division's 0.720 target is checked
# by the gpu-marked trainer test), `hpo export` of the best config and 1,024 samples of training from it.
#     OUT=/tmp/gpu bash scripts/gpu_experiment.sh
#     PRESET=my_experiment.yaml bash scripts/gpu_experiment.sh        # another experiment file
set -euo pipefail
OUT=${OUT:-gpu_checks}
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}  # the project's environment where made
PRESET=${PRESET:-search_spaces/presets/adam_vs_lamb_gpu_check.yaml}
DATA=${DATA:-data/demo}
NAME=$($PY -c "import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))['name'])" "$PRESET")
DB="sqlite:///$OUT/experiment.db"
RUN_DIR="$OUT/experiment"
hpo() { $PY -m hpo --db "$DB" "$@"; }
step() { echo; echo "--- $*"; }

mkdir -p "$OUT"
rm -rf "$RUN_DIR" "$OUT/experiment.db"
if [ ! -f "$DATA/meta.json" ]; then
  step "generating the demo corpus into $DATA"
  $PY -m trainer.data.demo_corpus --out "$DATA"
fi
step "hpo run $PRESET"
hpo run "$PRESET" --run-dir "$RUN_DIR"
step "hpo status $NAME"
hpo status "$NAME"
step "hpo trials $NAME"
hpo trials "$NAME"
step "hpo best $NAME --per-arm"
hpo best "$NAME" --per-arm
step "the MLPerf compliance checker (training 5.0.0) on every trial's log"
checks=0
PYTHON=$PY bash scripts/check_mlperf_logs.sh "$RUN_DIR/trials" || checks=$?
step "hpo export $NAME"
hpo export "$NAME" -o "$OUT/best.yaml"
cat "$OUT/best.yaml"
step "training from the exported config for 1,024 samples"
$PY -m trainer --config "$OUT/best.yaml" budget.max_samples=1024 eval.every_samples=1024 log.mlperf=null \
  log.every_steps=4 checkpoint.dir=null
[ "$checks" -eq 0 ]

#!/usr/bin/env bash
# The MLPerf compliance checker (training 5.0.0, the division each log names) on every trial's MLPerf log under a
# run directory, where its trials wrote them (`log.mlperf: mlperf.log`, or `mlperf/result_0.txt` as docs/mlperf.md
# has it: any mlperf/result_N.txt):
#     bash scripts/check_mlperf_logs.sh RUN_DIR/trials
# A trial that stopped before its first evaluation (diverged, out of memory, stopped) has no eval_accuracy, which
# the rules require of a result: its log is listed as not checked, and does not fail the check. Exit 0 when at least
# one log was checked and every checked log passed.
set -uo pipefail
if [ $# -ne 1 ] || [ ! -d "$1" ]; then
  echo "usage: bash scripts/check_mlperf_logs.sh RUN_DIR/trials (a folder of trial folders; got: ${1:-nothing})" >&2
  exit 2
fi
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# the project's environment (`make setup` makes it), from any working folder; PYTHON=... names another
PY=${PYTHON:-$([ -x "$ROOT/.venv/bin/python" ] && echo "$ROOT/.venv/bin/python" || echo python3)}
if ! "$PY" -c "import mlperf_logging.compliance_checker" 2>/dev/null; then
  echo "error: $PY has no MLPerf compliance checker (mlperf-logging): run \`make setup\` in $ROOT, or name a Python" \
       "that has it with PYTHON=..." >&2
  exit 2
fi
passed=0
checked=0
for log in "$1"/*/mlperf.log "$1"/*/mlperf/result_*.txt; do
  [ -f "$log" ] || continue
  case "$log" in *.checker.txt) continue ;; esac  # the checker's own output beside a log of a run before
  if ! grep -q '"key": "eval_accuracy"' "$log"; then
    stop=$(grep -o '"key": "run_stop".*"status": "[a-z]*"' "$log" | grep -o '"status": "[a-z]*"' | cut -d'"' -f4)
    echo "$log: not checked: the trial stopped before its first evaluation (run_stop ${stop:-not logged})"
    continue
  fi
  checked=$((checked + 1))
  if "$PY" -m mlperf_logging.compliance_checker --usage training --ruleset 5.0.0 --log_output "$log.checked" "$log" \
      > "$log.checker.txt" 2>&1; then
    passed=$((passed + 1)); echo "$log: SUCCESS"
  else
    echo "$log: FAILED"; tail -5 "$log.checker.txt"
  fi
done
echo "compliance checker: $passed of $checked trial logs passed"
[ "$checked" -gt 0 ] && [ "$passed" -eq "$checked" ]

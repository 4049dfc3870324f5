# The GPU preset with narrowed learning-rate ranges, end to end, beside the ranges' ends trained alone
set -u
timeout 120 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
{ date -u +"%Y-%m-%d %H:%M UTC"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu | grep "Model name"; } > $OUT/machine.txt
COMMON="budget.max_samples=36864 log.mlperf=null checkpoint.dir=null log.every_steps=100"
run() { name=$1; shift; timeout 170 python3 -m trainer --config trainer/configs/gpu_check.yaml $COMMON "$@" > $OUT/$name.log 2>&1; echo "$name exit $?" >> $OUT/$name.log; }
run adamw_5e-4 optimizer.name=adamw optimizer.lr=5.0e-4 &
run adamw_1.2e-3 optimizer.name=adamw optimizer.lr=1.2e-3 &
run lamb_3e-3 optimizer.name=lamb optimizer.lr=3.0e-3 &
run lamb_9e-3 optimizer.name=lamb optimizer.lr=9.0e-3 &
T0=$SECONDS
timeout 200 env OUT=/tmp/gpu_experiment PYTHON=python3 bash scripts/gpu_experiment.sh > $OUT/experiment.txt 2>&1
echo "=== experiment exit $? after $((SECONDS - T0)) s" >> $OUT/experiment.txt
for trial in /tmp/gpu_experiment/experiment/trials/*/; do
  [ -f "$trial/mlperf.log" ] || continue
  cp "$trial/mlperf.log" "$OUT/experiment_trial_mlperf.log"; cp "$trial/stderr.log" "$OUT/experiment_trial_stderr.log"; break
done
cp /tmp/gpu_experiment/best.yaml $OUT/experiment_best.yaml
wait
grep -E "^trial [0-9]|^verdict|^compliance|=== experiment" $OUT/experiment.txt
for f in $OUT/*.log; do echo "== $f"; grep -E "^eval|exit" $f | grep -v '^{' | tr '\n' ' ' | sed 's/(target 0.15), nsp_accuracy [0-9.]*//g'; echo; done

# The GPU preset end to end with model.attention auto taking varlen (with dropout) on the GPU
set -u
timeout 120 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
{ date -u +"%Y-%m-%d %H:%M UTC"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu | grep "Model name"; } > $OUT/machine.txt
T0=$SECONDS
timeout 170 env OUT=/tmp/gpu_experiment PYTHON=python3 bash scripts/gpu_experiment.sh > $OUT/experiment.txt 2>&1
echo "=== experiment exit $? after $((SECONDS - T0)) s" >> $OUT/experiment.txt
for trial in /tmp/gpu_experiment/experiment/trials/*/; do
  [ -f "$trial/mlperf.log" ] || continue
  cp "$trial/mlperf.log" "$OUT/experiment_trial_mlperf.log"; cp "$trial/stderr.log" "$OUT/experiment_trial_stderr.log"; break
done
cp /tmp/gpu_experiment/best.yaml $OUT/experiment_best.yaml
grep -E "^training|^trial [0-9]|^verdict|^compliance|=== experiment" $OUT/experiment.txt

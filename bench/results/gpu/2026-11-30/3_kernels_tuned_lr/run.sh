# The experiment's tuned learning rates, each kernel, the trial's budget (36,864 samples): which learn?
set -u
timeout 120 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
COMMON="budget.max_samples=36864 log.mlperf=null checkpoint.dir=null log.every_steps=100"
ADAM="optimizer.name=adamw optimizer.lr=0.0016583702132629877"
LAMB="optimizer.name=lamb optimizer.lr=0.015569889721290999"
run() { name=$1; shift; timeout 170 python3 -m trainer --config trainer/configs/gpu_check.yaml $COMMON "$@" > $OUT/$name.log 2>&1; echo "$name exit $?" >> $OUT/$name.log; }
for k in padded packed jagged; do
  run adamw_$k $ADAM model.attention=$k &
  run lamb_$k $LAMB model.attention=$k &
done
run adamw_padded_seed1235 $ADAM model.attention=padded seed=1235 &
run adamw_padded_fp32 $ADAM model.attention=padded precision.dtype=fp32 &
wait
for f in $OUT/*.log; do echo "== $f"; grep -E "^eval|exit|Error|error" $f | grep -v '^{' | sed -n '1p;3p;5p;7p;9p;$p'; done

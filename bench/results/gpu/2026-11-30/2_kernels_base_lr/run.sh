# The GPU trial config with each attention kernel, trained 12,288 samples: which learn?
set -u
timeout 120 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/machine.txt
python3 -c "import torch; print('torch', torch.__version__)" | tee -a $OUT/machine.txt
COMMON="budget.max_samples=12288 log.mlperf=null checkpoint.dir=null"
run() { name=$1; shift; timeout 150 python3 -m trainer --config trainer/configs/gpu_check.yaml $COMMON "$@" > $OUT/$name.log 2>&1; echo "$name exit $?" >> $OUT/$name.log; }
run auto_padded &
run padded_no_attn_dropout model.attention=padded model.attention_probs_dropout_prob=0.0 &
run padded_fp32 model.attention=padded precision.dtype=fp32 &
run packed model.attention=packed &
run jagged model.attention=jagged &
run varlen model.attention=varlen &
timeout 120 python3 bench/results/gpu/2026-11-30/2_kernels_base_lr/sdpa_check.py > $OUT/sdpa_check.txt 2>&1 &
wait
for f in $OUT/*.log; do echo "== $f"; grep -E "^training|^eval|exit|Error|error" $f | grep -v '^{' | tail -8; done
cat $OUT/sdpa_check.txt

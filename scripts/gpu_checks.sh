#!/usr/bin/env bash
# The checks that need a CUDA GPU, in order of value: the gpu-marked tests, then the GPU rows of BENCHMARKS.md
# (trainer throughput against Hugging Face, the LAMB step, clipping and noise-scale overhead with NCCL).
# Each writes its output to $OUT (default: gpu_checks/) as one file; a failing step does not stop the rest.
#     OUT=/tmp/gpu bash scripts/gpu_checks.sh
set -u
OUT=${OUT:-gpu_checks}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
run() {  # run NAME SECONDS CMD...: its output to $OUT/NAME.txt and to the terminal
  local name=$1 secs=$2; shift 2
  echo "=== $name: $*" | tee "$OUT/$name.txt"
  timeout "$secs" "$@" 2>&1 | tee -a "$OUT/$name.txt"
  echo "=== $name exit ${PIPESTATUS[0]}" | tee -a "$OUT/$name.txt"
}
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; lscpu | grep "Model name";
  $PY -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
run tests 150 $PY -m pytest -m gpu -p no:cacheprovider -q tests/trainer
run throughput 150 $PY -m bench.trainer_throughput --device cuda --size large --dtype bf16 --batch 32 --steps 20 --warmup 3
run optimizer_step 60 $PY -m bench.optimizer_step --device cuda --steps 30 --warmup 5
run clipping 90 $PY -m bench.clipping_overhead --device cuda --nproc 1 --accumulation 2 --size large --dtype bf16 --batch 8 --rounds 15
run noise_scale 90 $PY -m bench.noise_scale_overhead --device cuda --nproc 1 --accumulation 2 --size large --dtype bf16 --batch 8 --rounds 15

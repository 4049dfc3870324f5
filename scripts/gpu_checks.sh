#!/usr/bin/env bash
# The checks that need a CUDA GPU, in order of value, sized for at most 10 minutes of one H100 or H200:
#   experiment   the GPU preset end to end (scripts/gpu_experiment.sh): trials, verdict, MLPerf compliance, export
#   throughput   BERT-large, bf16, BERT's dropout, at batch 32 and at batch 128 (the GPU busier, its host overhead
#                spread over 4x the tokens): our padded grid and the varlen flash kernel (with compiled layers at
#                128) beside Hugging Face's padded model, with the per-step breakdown and the kernels that took the
#                most time (a model that runs out of memory or fails leaves the comparison; the others go on)
#   micro_batch  batch.micro_batch_size auto for BERT-large on the varlen kernel: the micro-batch it chooses from
#                the GPU's memory, the peak of a step at it against the prediction, its speed beside micro-batch 32
#   tests        the gpu-marked tests (fused paths against the eager model on CUDA, the varlen kernel's dropout
#                against its own mask, the closed-division MLPerf log)
#   clipping, noise_scale   their overhead on one NCCL rank at micro-batches of 128, where the GPU, not the host,
#                sets the pace (at 32 and below the step is mostly host time: 1.12x and 1.13x were measured there
#                on 2026-11-28): bucket-wise clipping against none, with a profiled step of each and its top
#                kernels; the noise scale measured every step (the trainer's default)
# Each writes its output to $OUT (default: gpu_checks/) as one file with the machine's line (with the machine's own
# file, one trial's MLPerf log and the exported config of the experiment, whose other files stay in
# /tmp/gpu_experiment: 10 files), then summary.txt gathers their result lines; a failing step does not stop the
# rest; the time limits add up to under 10 minutes. Packages the GPU image lacks travel as wheels: `bash scripts/gpu_wheels.sh` here makes .whl/.
#     OUT=/tmp/gpu bash scripts/gpu_checks.sh
# With PACK=1 the files end up as two: summary.txt and gpu_checks.tar.gz holding all of them (for a machine that
# hands back only a few files).
set -u
OUT=${OUT:-gpu_checks}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
rm -f "$OUT/summary.txt" "$OUT/gpu_checks.tar.gz"  # an earlier run's
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then  # made for Python 3.12 on x86-64 (the GPU image's); elsewhere the installed packages serve
  if $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  then export PYTHONPATH=/tmp/site; else echo "the wheels in .whl/ do not install here: using the installed packages"; fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the trials' trainer processes import this checkout too
run() {  # run NAME SECONDS CMD...: its output to $OUT/NAME.txt and to the terminal
  local name=$1 secs=$2; shift 2
  { echo "=== $name: $*"; cat "$OUT/machine.txt"; } | tee "$OUT/$name.txt"
  local t0=$SECONDS
  timeout "$secs" "$@" 2>&1 | tee -a "$OUT/$name.txt"
  echo "=== $name exit ${PIPESTATUS[0]} after $((SECONDS - t0)) s" | tee -a "$OUT/$name.txt"
}
{ date -u +"%Y-%m-%d %H:%M UTC"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader;
  lscpu | grep "Model name"; $PY -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
LARGE="--device cuda --size large --dtype bf16 --dropout 0.1"
run experiment 240 env OUT=/tmp/gpu_experiment PYTHON="$PY" bash scripts/gpu_experiment.sh
for log in /tmp/gpu_experiment/experiment/trials/*/mlperf.log; do  # one trial's MLPerf log and the exported config
  [ -f "$log" ] && cp "$log" "$OUT/experiment_trial_mlperf.log" && break
done
cp /tmp/gpu_experiment/best.yaml "$OUT/experiment_best.yaml" 2>/dev/null
run throughput 50 $PY -m bench.trainer_throughput $LARGE --batch 32 --steps 8 --warmup 3 \
  --variants padded,varlen --breakdown --top 12
run throughput_128 85 $PY -m bench.trainer_throughput $LARGE --batch 128 --steps 6 --warmup 2 \
  --variants padded,varlen,varlen+compile --breakdown --top 12
run micro_batch 30 $PY -m bench.micro_batch_fit --device cuda --size large --dtype bf16 --per-rank 448 --baseline 32 \
  --steps 2 --attention varlen
run tests 65 $PY -m pytest -m gpu -p no:cacheprovider -q tests/trainer
run clipping 50 $PY -m bench.clipping_overhead --device cuda --nproc 1 --accumulation 2 --size large --dtype bf16 \
  --batch 128 --rounds 5 --strategies none,bucketwise --breakdown --top 8
run noise_scale 60 $PY -m bench.noise_scale_overhead --device cuda --nproc 1 --accumulation 2 --size large \
  --dtype bf16 --batch 128 --rounds 6 --strategies none,bucketwise
summary() {
  echo "=== summary (the full output of each check is in $OUT/)"
  cat "$OUT/machine.txt"
  grep -h "=== .* exit" "$OUT"/*.txt
  grep -h "^# verdict\|^compliance checker:\|^finished:" "$OUT/experiment.txt"
  grep -h "^size=\|^  ours \|^  HF \|^  breakdown\|left out" "$OUT"/throughput*.txt
  grep -h "^batch.micro_batch_size\|^one step at\|^  micro-batch" "$OUT/micro_batch.txt"
  grep -h " passed\| failed\| skipped" "$OUT/tests.txt" | tail -1
  grep -h " x[0-9]" "$OUT/clipping.txt" "$OUT/noise_scale.txt"
}
summary > "$OUT/summary.partial" 2>&1  # not a .txt while its own greps read them
mv "$OUT/summary.partial" "$OUT/summary.txt"
cat "$OUT/summary.txt"
if [ "${PACK:-0}" = 1 ]; then
  (cd "$OUT" && files=$(ls | grep -v '^summary.txt$\|^gpu_checks.tar.gz$') && tar czf gpu_checks.tar.gz $files \
    && rm -f $files && echo "packed into $OUT/gpu_checks.tar.gz: $(echo $files)")
fi

#!/usr/bin/env bash
# The checks that need a CUDA GPU, in order of value, within 8 minutes of one H100 or H200 all together:
#   experiment   the GPU preset end to end (scripts/gpu_experiment.sh): trials, verdict, MLPerf compliance, export
#   fused_kernels  the fused kernels (bias-dropout-residual-LayerNorm, bias-GELU; forward and backward) at BERT-large's
#                widths on a batch of 128's tokens, with their default launch and with each candidate launch
#                (bench/fused_kernels.py), against the GPU's copy bandwidth and eager PyTorch: the fastest of each
#                kernel, where over 3 % faster than its defaults, goes to fused_launch.json, which the chained
#                throughput check launches them with ({}: the defaults)
#   throughput_128  BERT-large, bf16, BERT's dropout, at batch 128 (the GPU, not the host, sets the pace): the
#                varlen flash kernel with the bf16 residual stream (model.half_residual), eager, beside Hugging Face's
#                padded model, with the per-step breakdown and the kernels that took the most time (a model that runs
#                out of memory or fails leaves the comparison; the others go on). On an H200 on 2026-11-30: 763.2
#                sequences/s, 2.69x HF (the varlen kernel with an fp32 residual stream 716.9, our padded grid 459.5).
#                Also with the fused bias-dropout-residual-LayerNorm kernels (model.fused_norm, +fused), with the
#                fused bias-GELU kernels too (model.fused_gelu, +gelu), and with the attention on cuDNN's kernel
#                instead (model.varlen_kernel: cudnn, +cudnn: its attention milliseconds against flash's)
#   clipping, noise_scale   their overhead on one GPU at micro-batches of 128, where the GPU, not the host, sets
#                the pace (at 32 and below the step is mostly host time: 1.12x and 1.13x were measured there on
#                2026-11-28, one NCCL rank in DDP): bucket-wise clipping against none as the trainer runs one process
#                (no DDP: the whole gradient clipped) and in DDP on one rank (its bucket hook), with a profiled step of
#                each and its top kernels; the noise scale measured every step (the trainer's default) against
#                not at all, one process, two micro-batches a step
#   tests        the gpu-marked tests (fused paths against the eager model on CUDA, the compiled model on CUDA
#                graphs against the eager one, the varlen kernel's dropout against its own mask, the Triton kernels
#                against eager PyTorch, cuDNN's varlen attention against the flash kernel and its own dropout mask,
#                the closed-division MLPerf log)
#   throughput_chained  at a micro-batch of 256 (HF's model at 128, the most it fits), three steps in a row without
#                waiting for the device (--chain 3), as the trainer's loop runs (on 2026-11-30, unchained, 256 gave
#                777.2 sequences/s against 763.2 at 128): varlen with the bf16 residual stream, eager, with
#                both fused kernels (launched as fused_launch.json says), and with those and the attention on
#                cuDNN's kernel (+cudnn; PyTorch's flash kernel took 27 ms of a 171 ms step). (The compiled model on CUDA graphs, model.compile_model,
#                measured no faster on an H200 on 2026-11-30: 747.8 sequences/s against 764.7 eager, 45 s of
#                compiling.)
# Each writes its output to $OUT (default: gpu_checks/) as one file with the machine's line (with the machine's own
# file, and of the experiment one trial's MLPerf log and progress lines and the exported config; its other files
# stay in EXPERIMENT_OUT, default /tmp/gpu_experiment), then summary.txt gathers their result lines; a failing step
# does not stop the rest.
# batch.micro_batch_size auto was checked on a GPU on 2026-11-28 (`python3 -m bench.micro_batch_fit --device cuda
# --size large --dtype bf16 --per-rank 448 --baseline 32 --steps 2`).
# The throughput checks stop timing short of their limit (--max-seconds): fewer steps, but figures.
# Each check has its own time limit, and the whole script a deadline (DEADLINE_S, default 480 s from its start):
# a check gets at most what is left of it less the time kept for the summary, and a check with too little left
# is skipped and named so; the script then still writes its summary (and with PACK=1 its archive) in time.
# It runs .venv/bin/python where `make setup` made it, else python3 (PYTHON=... names another interpreter).
# Packages the GPU image lacks travel as wheels: `bash scripts/gpu_wheels.sh` here makes .whl/; without them (the
# project's packages do not import) the script says so in its summary and stops before any check.
#     OUT=/tmp/gpu bash scripts/gpu_checks.sh
# With PACK=1 the files end up as two: summary.txt and gpu_checks.tar.gz holding all of them (two files to copy
# off the machine).
set -u
OUT=${OUT:-gpu_checks}
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}  # the project's environment where made
if ! timeout 60 $PY -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
  echo "scripts/gpu_checks.sh: $PY sees no CUDA GPU (torch.cuda.is_available() is false, or torch does not import):" \
    "run it on a GPU machine (PYTHON=... names another interpreter); on the CPU, \`make test\` runs the checks" \
    "that need none. Nothing was written." >&2
  exit 2
fi
mkdir -p "$OUT"
rm -f "$OUT/summary.txt" "$OUT/gpu_checks.tar.gz"  # an earlier run's
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then  # made for Python 3.12 on x86-64 (the GPU image's); elsewhere the installed packages serve
  if timeout 120 $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl
  then export PYTHONPATH=/tmp/site; else echo "the wheels in .whl/ do not install here: using the installed packages"; fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the trials' trainer processes import this checkout too
if ! missing=$(timeout 60 $PY -c "import pydantic, sqlalchemy, alembic, mlperf_logging, h5py" 2>&1); then
  echo "scripts/gpu_checks.sh: the project's packages do not import here ($(echo "$missing" | tail -1)): make the" \
    "wheels with \`bash scripts/gpu_wheels.sh\` and bring .whl/ along. Nothing was checked." | tee "$OUT/summary.txt" >&2
  exit 2
fi
DEADLINE_S=${DEADLINE_S:-480}
KEEP_S=${KEEP_S:-10}  # of the deadline, for the summary and the archive (about a second)
MIN_S=${MIN_S:-5}     # a check with less than this left is skipped
run() {  # run NAME SECONDS CMD...: its output to $OUT/NAME.txt and to the terminal, within the deadline
  local name=$1 secs=$2; shift 2
  local left=$((DEADLINE_S - KEEP_S - SECONDS))
  { echo "=== $name: $*"; cat "$OUT/machine.txt"; } | tee "$OUT/$name.txt"
  if [ "$left" -lt "$MIN_S" ]; then
    echo "=== $name skipped: ${left} s left of the script's ${DEADLINE_S} s" | tee -a "$OUT/$name.txt"
    return
  fi
  [ "$left" -lt "$secs" ] && secs=$left
  local t0=$SECONDS
  timeout -k 10 "$secs" "$@" 2>&1 | tee -a "$OUT/$name.txt"  # -k: a check that ignores SIGTERM
  echo "=== $name exit ${PIPESTATUS[0]} after $((SECONDS - t0)) s (limit $secs s)" | tee -a "$OUT/$name.txt"
}
{ date -u +"%Y-%m-%d %H:%M UTC"
  timeout 10 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  lscpu | grep "Model name"
  timeout 30 $PY - <<'PYTHON'  # one interpreter for both: an import of torch costs seconds of the deadline
import torch
print("torch", torch.__version__, torch.cuda.get_device_name())
try:
    import triton
    print("triton", triton.__version__)
except ImportError:
    print("triton: none (the +compile checks need it)")
PYTHON
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
EXPERIMENT_OUT=${EXPERIMENT_OUT:-/tmp/gpu_experiment}
LARGE="--device cuda --size large --dtype bf16 --dropout 0.1"
MARK="HPO_GPU_CHECKS_RUN=$$.$RANDOM"  # in the environment of every process of the experiment, and of no other
run experiment 85 env "$MARK" OUT="$EXPERIMENT_OUT" PYTHON="$PY" bash scripts/gpu_experiment.sh
# A controller cut at its limit may leave trial processes (each in a session of its own) on the GPU: they would
# share it with the throughput checks. They are found by the mark, so that no one else's process is touched.
left=$(grep -lsxzF -- "$MARK" /proc/[0-9]*/environ | cut -d/ -f3)
if [ -n "$left" ]; then
  kill -9 $left 2>/dev/null
  echo "=== experiment: $(echo "$left" | wc -l) leftover trial process(es) ended before the next check" \
    | tee -a "$OUT/experiment.txt"
fi
# One trial's MLPerf log, its progress lines (the sequences/s of a small model sharing the GPU), the exported config
for trial in "$EXPERIMENT_OUT"/experiment/trials/*/; do
  [ -f "$trial/mlperf.log" ] || continue
  cp "$trial/mlperf.log" "$OUT/experiment_trial_mlperf.log"; cp "$trial/stderr.log" "$OUT/experiment_trial_stderr.log"
  break
done
cp "$EXPERIMENT_OUT/best.yaml" "$OUT/experiment_best.yaml" 2>/dev/null
rm -f "$OUT/fused_launch.json"  # an earlier run's (another GPU's, maybe)
run fused_kernels 35 $PY -m bench.fused_kernels --device cuda --max-seconds 18 --write "$OUT/fused_launch.json"
[ -s "$OUT/fused_launch.json" ] || echo "{}" > "$OUT/fused_launch.json"  # (not run, or failed: the defaults)
run throughput_128 75 $PY -m bench.trainer_throughput $LARGE --batch 128 --steps 6 --warmup 2 --max-seconds 65 \
  --variants varlen+half,varlen+half+fused,varlen+half+fused+gelu,varlen+half+cudnn --breakdown --top 20
run clipping 40 $PY -m bench.clipping_overhead --device cuda --nproc 1 --ddp both --size large --dtype bf16 \
  --batch 128 --warmup 2 --rounds 5 --strategies none,bucketwise --breakdown --top 8
run noise_scale 30 $PY -m bench.noise_scale_overhead --device cuda --nproc 1 --accumulation 2 --size large \
  --dtype bf16 --batch 128 --warmup 2 --rounds 5 --strategies none
T=tests/trainer  # the files with gpu-marked tests, the fused paths first (pytest keeps the order of its files)
run tests 120 $PY -m pytest -m gpu -p no:cacheprovider -v $T/test_fused_paths.py $T/test_fused_kernels.py \
  $T/test_train.py $T/test_clipping.py $T/test_memory.py $T/test_mlperf_log.py
run throughput_chained 55 $PY -m bench.trainer_throughput $LARGE --batch 256 --hf-batch 128 --steps 6 --warmup 2 \
  --chain 3 --max-seconds 45 --fused-launch "$OUT/fused_launch.json" \
  --variants varlen+half,varlen+half+fused+gelu,varlen+half+fused+gelu+cudnn
summary() {
  echo "=== summary (the full output of each check is in $OUT/)"
  cat "$OUT/machine.txt"
  grep -h "=== .* exit\|=== .* skipped\|=== .* leftover" "$OUT"/*.txt
  grep -h "^# verdict\|^compliance checker:\|^finished:" "$OUT/experiment.txt"
  grep -h "^device: \|^  kept \|^  norm: \|^  gelu: \|^wrote \|^time is up\|left out\|not run" "$OUT/fused_kernels.txt"
  grep -h "^fused kernels launched\|^size=\|^  ours \|^  HF \|^HF padded to batch max\|^  breakdown\|left out" \
    "$OUT"/throughput*.txt
  grep -h "time is up\|^  first step" "$OUT"/throughput*.txt
  grep -hE "^(=+ )?[0-9]+ (passed|failed|errors?|skipped|deselected)" "$OUT/tests.txt" | tail -1  # pytest's last line
  grep -h " x[0-9]" "$OUT/clipping.txt" "$OUT/noise_scale.txt"
}
summary > "$OUT/summary.partial" 2>&1  # not a .txt while its own greps read them
mv "$OUT/summary.partial" "$OUT/summary.txt"
cat "$OUT/summary.txt"
if [ "${PACK:-0}" = 1 ]; then
  (cd "$OUT" && files=$(ls | grep -v '^summary.txt$\|^gpu_checks.tar.gz$') && tar czf gpu_checks.tar.gz $files \
    && rm -f $files && echo "packed into $OUT/gpu_checks.tar.gz: $(echo $files)")
fi

# After run 6, on the same lease: why the compiled model on fixed shapes gave no speed (graph breaks, recompiles,
# CUDA graphs), with the wheels of scripts/gpu_wheels.sh installed into /tmp/site.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/diag.txt
TORCH_LOGS=graph_breaks,recompiles,cudagraphs timeout 250 python3 -m bench.trainer_throughput --device cuda \
  --size large --dtype bf16 --dropout 0.1 --batch 128 --steps 4 --warmup 3 --no-hf \
  --variants varlen+whole+half+static --max-seconds 200 >> $OUT/diag.txt 2>&1

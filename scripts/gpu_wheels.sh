#!/usr/bin/env bash
# Wheels of the Python packages `hpo run` and the trainer need beyond what a GPU machine's own PyTorch image holds
# (PyTorch, NumPy, SciPy, h5py, PyYAML, transformers are there; a machine without a package index cannot install
# the rest), for Python 3.12 on x86-64 Linux, at the versions this checkout's environment has. They go to .whl/
# (ignored by git); scripts/gpu_checks.sh installs them into a folder of their own when .whl/ exists.
#     bash scripts/gpu_wheels.sh              # here, with network access; then carry .whl to the GPU machine
set -euo pipefail
PY=${PYTHON:-.venv/bin/python}
DEST=${DEST:-.whl}
NAMES="alembic mako pydantic pydantic-core annotated-types typing-inspection typing-extensions sqlalchemy mlperf-logging
  nvidia-ml-py"
pins=$($PY - $NAMES <<'PYTHON'
import sys
from importlib.metadata import version
print(" ".join(f"{name}=={version(name)}" for name in sys.argv[1:]))
PYTHON
)
# Into a folder of their own first, then in place of an earlier run's wheels (two versions of one package side by
# side would not install together; a failed download leaves the earlier ones)
fresh=$(mktemp -d)
trap 'rm -rf "$fresh"' EXIT
platforms=""
for n in 17 24 27 28 31 34; do platforms="$platforms --platform manylinux_2_${n}_x86_64"; done
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  $platforms --platform manylinux2014_x86_64 --platform any -d "$fresh" $pins
mkdir -p "$DEST"
rm -f "$DEST"/*.whl
mv "$fresh"/*.whl "$DEST"/
ls -la "$DEST"

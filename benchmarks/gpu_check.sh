#!/usr/bin/env bash
# One prepared script for a machine with an NVIDIA GPU (CuPy preinstalled, no
# internet): installs dtorch without dependencies, runs the cuda-parametrised
# tests and a short GPU benchmark, writing its log and figures to OUTDIR.
#   bash benchmarks/gpu_check.sh OUTDIR        (finishes within ~8 minutes)
set -u
out="${1:?usage: gpu_check.sh OUTDIR}"
mkdir -p "$out"
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
log="$out/gpu_check.log"
{
  echo "== $(date -u) $(hostname)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
  "$PY" -c "import cupy; print('cupy', cupy.__version__, 'devices', cupy.cuda.runtime.getDeviceCount())"
  "$PY" -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2 \
    || export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
  "$PY" -c "import dtorch; assert dtorch.cuda.is_available(), 'dtorch sees no GPU'; print('dtorch sees', dtorch.cuda.device_count(), 'GPU(s)')"
  echo "== cuda tests"
  timeout 300 "$PY" -m pytest -q -p no:cacheprovider -m "not mpi" -k "cuda" \
      --junitxml="$out/gpu_tests.xml" tests 2>&1 | tail -40
  echo "pytest exit: ${PIPESTATUS[0]}"
  echo "== GPU benchmark (MLP step, dtorch cuda vs torch cuda when present)"
  timeout 180 "$PY" benchmarks/gpu_mlp.py --out "$out/gpu_mlp.json" 2>&1
} 2>&1 | tee "$log"

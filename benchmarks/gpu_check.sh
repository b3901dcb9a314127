#!/usr/bin/env bash
# The GPU check, unattended, on a machine with an NVIDIA GPU (< 8 minutes on
# one H200 with 16 cores):
#   bash benchmarks/gpu_check.sh OUTDIR
# 0. stops at once (exit 2, nothing installed, written or run) when there is
#    no NVIDIA GPU: nvidia-smi lists none (or is missing) and no /dev/nvidiaN;
# 1. checks numpy/safetensors/ml_dtypes/tqdm/pytest are importable (installs
#    the missing ones with pip if it can), installs CuPy if missing
#    (cupy-cuda12x or cupy-cuda13x, chosen from the driver's CUDA version,
#    within the versions dtorch supports);
# 2. runs every test marked `gpu` (the cuda half of the device-parametrised
#    suite, the CuPy behaviour list, RNG, DataLoader, collectives);
# 3. the one-rank NCCL test; with >= 2 GPUs, a 2-rank NCCL + DDP job
#    (benchmarks/gpu_ddp_check.py under dtorch's launcher);
# 4. a short MLP benchmark (dtorch cuda vs torch cuda when installed).
# 5. the AMP tests on cuda and float32 vs float16-autocast step time
#    (benchmarks/amp.py: MLP and a GPT block).
# Writes OUTDIR/gpu_check.log (everything), OUTDIR/summary.txt (one line per
# step: PASS/FAIL/SKIP and figures, for a note to quote), junit XML, JSON.
# Exit status: 0 when every step that ran passed.
set -u -o pipefail
out="${1:?usage: gpu_check.sh OUTDIR}"
# ---- 0. a GPU at all? (before anything is installed or written)
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
if [ "${gpus:-0}" -eq 0 ] && ! ls /dev/nvidia[0-9]* >/dev/null 2>&1; then
    why="nvidia-smi not found"
    command -v nvidia-smi >/dev/null 2>&1 && why="nvidia-smi lists no GPU: $(nvidia-smi -L 2>&1 | head -1 | cut -c1-160)"
    echo "gpu_check.sh: no GPU on this machine ($why; no /dev/nvidiaN):" \
         "nothing installed or run. Run it on a machine with an NVIDIA GPU." >&2
    exit 2
fi
mkdir -p "$out"
out="$(cd "$out" && pwd)"
cd "$(dirname "$0")/.."
repo="$PWD"
PY="${PYTHON:-python3}"
# dtorch, collectives and launch from this checkout, whatever is installed
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}"
log="$out/gpu_check.log"
summary="$out/summary.txt"
: > "$log"
: > "$summary"
status=0
t_start=$(date +%s)

say() { echo "$*" | tee -a "$log"; }
result() {  # $1 step, $2 PASS|FAIL|SKIP, $3 details
    printf '%-14s %-4s %s\n' "$1" "$2" "${3:-}" | tee -a "$summary" >> "$log"
    [ "$2" = FAIL ] && status=1
    return 0
}
# CuPy versions dtorch supports (pyproject's cuda extras; README)
CUPY_SPEC='>=13.0,<15'
# the whole run stays under 8 minutes: each step's timeout is capped by
# what is left of BUDGET (seconds), keeping 20 s for the steps after it
BUDGET="${GPU_CHECK_BUDGET:-450}"
cap() {  # $1 = the step's own limit; prints the timeout to use (>= 10)
    local left=$(( BUDGET - ($(date +%s) - t_start) - 20 ))
    [ "$left" -lt "$1" ] && set -- "$left"
    [ "$1" -lt 10 ] && set -- 10
    echo "$1"
}

say "== $(date -u) $(hostname)  repo $(git -C "$repo" rev-parse --short HEAD 2>/dev/null)"
nvidia-smi --query-gpu=index,name,memory.total,driver_version \
    --format=csv 2>&1 | tee -a "$log"

# ---- 1. dependencies
missing=$("$PY" - <<'EOF'
import importlib.util
print(" ".join(m for m in ("numpy", "safetensors", "ml_dtypes", "tqdm",
                           "pytest") if importlib.util.find_spec(m) is None))
EOF
)
if [ -n "$missing" ]; then
    say "installing missing modules: $missing"
    timeout "$(cap 120)" "$PY" -m pip install -q $missing >> "$log" 2>&1
fi
missing=$("$PY" -c "import importlib.util as u; print(' '.join(m for m in ('numpy','safetensors','ml_dtypes','tqdm','pytest') if u.find_spec(m) is None))")
if [ -n "$missing" ]; then
    result deps FAIL "missing python modules: $missing (pip install them)"
    cat "$summary"; exit 1
fi
if ! "$PY" -c "import cupy" >/dev/null 2>&1; then
    cuda_major=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: \([0-9]*\).*/\1/p' | head -1)
    pkg=cupy-cuda12x
    [ "${cuda_major:-12}" -ge 13 ] && pkg=cupy-cuda13x
    say "installing $pkg$CUPY_SPEC (driver CUDA ${cuda_major:-?})"
    timeout "$(cap 150)" "$PY" -m pip install -q "$pkg$CUPY_SPEC" >> "$log" 2>&1
fi
info=$("$PY" - 2>&1 <<'EOF'
import cupy
n = cupy.cuda.runtime.getDeviceCount()
try:
    from cupy.cuda import nccl
    has_nccl = nccl.available if hasattr(nccl, "available") else True
except Exception:
    has_nccl = False
print(f"cupy={cupy.__version__} devices={n} nccl={has_nccl}")
EOF
)
rc=$?
say "$info"
if [ $rc -ne 0 ]; then
    result cupy FAIL "CuPy unusable: $(echo "$info" | tail -1)"
    cat "$summary"; exit 1
fi
ndev=$(echo "$info" | sed -n 's/.*devices=\([0-9]*\).*/\1/p')
result cupy PASS "$info; numpy $("$PY" -c 'import numpy; print(numpy.__version__)')"
if ! "$PY" -c "import dtorch, sys; sys.exit(0 if dtorch.cuda.is_available() else 1)" >> "$log" 2>&1; then
    result dtorch FAIL "dtorch.cuda.is_available() is False"
    cat "$summary"; exit 1
fi

# ---- 2. the gpu-marked tests
say "== pytest -m gpu"
lim=$(cap 240)
timeout "$lim" "$PY" -m pytest -q -p no:cacheprovider -m "gpu and not mpi" \
    --junitxml="$out/gpu_tests.xml" tests >> "$log" 2>&1
rc=$?
counts=$(tail -5 "$log" | grep -E "passed|failed|error" | tail -1)
if [ $rc -eq 0 ]; then result gpu-tests PASS "$counts"
elif [ $rc -eq 124 ]; then result gpu-tests FAIL "timed out after $lim s; $counts"
else result gpu-tests FAIL "exit $rc: $counts (see gpu_check.log)"; fi

# ---- 3. NCCL: one rank, then two ranks with DDP
say "== one-rank NCCL"
timeout "$(cap 90)" "$PY" -m pytest -q -p no:cacheprovider -rs \
    "tests/collectives/test_collectives.py::test_nccl_imports_without_cupy" >> "$log" 2>&1
rc=$?
if [ $rc -eq 0 ] && ! tail -3 "$log" | grep -q skipped; then
    result nccl-1rank PASS "all_reduce + broadcast on a one-rank communicator"
elif [ $rc -eq 0 ]; then result nccl-1rank FAIL "skipped: NCCL not available"
else result nccl-1rank FAIL "exit $rc"; fi

if [ "${ndev:-0}" -ge 2 ]; then
    say "== two-rank NCCL + DDP"
    timeout "$(cap 120)" "$PY" -m launch --nproc-per-node 2 \
        benchmarks/gpu_ddp_check.py "$out/gpu_ddp.json" > "$out/gpu_ddp.log" 2>&1
    rc=$?
    cat "$out/gpu_ddp.log" >> "$log"
    line=$(grep -o "GPU_DDP_CHECK.*" "$out/gpu_ddp.log" | head -1 | cut -c1-300)
    if [ $rc -eq 0 ] && echo "$line" | grep -q "GPU_DDP_CHECK PASS"; then
        result nccl-ddp-2 PASS "${line#GPU_DDP_CHECK PASS }"
    else result nccl-ddp-2 FAIL "exit $rc: ${line:-no result line}"; fi
else
    result nccl-ddp-2 SKIP "one GPU visible"
fi

# ---- 4. benchmark
say "== GPU benchmark (MLP step, dtorch cuda vs torch cuda when present)"
timeout "$(cap 90)" "$PY" benchmarks/gpu_mlp.py --out "$out/gpu_mlp.json" >> "$log" 2>&1
rc=$?
if [ $rc -eq 0 ]; then
    result gpu-mlp PASS "$("$PY" -c "import json; d=json.load(open('$out/gpu_mlp.json')); print(', '.join(f'{k}={v}' for k, v in d.items() if not isinstance(v, (list, dict))))" 2>/dev/null | cut -c1-300)"
else result gpu-mlp FAIL "exit $rc"; fi

# ---- 5. mixed precision: the cuda AMP tests (also in step 2) and float32
# vs float16-autocast step time (goal: >= 1.5x on the GEMM-bound MLP)
say "== AMP on the GPU"
timeout "$(cap 60)" "$PY" -m pytest -q -p no:cacheprovider -m gpu \
    tests/amp/test_autocast.py tests/amp/test_grad_scaler.py >> "$log" 2>&1
rc=$?
counts=$(tail -5 "$log" | grep -E "passed|failed|error" | tail -1)
if [ $rc -eq 0 ]; then result amp-tests PASS "$counts"
else result amp-tests FAIL "exit $rc: $counts"; fi
timeout "$(cap 90)" "$PY" benchmarks/amp.py --device cuda --steps 20 \
    --out "$out/gpu_amp.json" >> "$log" 2>&1
rc=$?
if [ $rc -eq 0 ]; then
    result gpu-amp PASS "$("$PY" -c "import json; d=json.load(open('$out/gpu_amp.json')); print(', '.join(f'{k}: fp32 {d[k][\"fp32_ms\"]} ms, fp16 {d[k][\"amp_ms\"]} ms, x{d[k][\"speedup\"]}' for k in ('mlp', 'block')))" 2>/dev/null | cut -c1-300)"
else result gpu-amp FAIL "exit $rc"; fi

result total "$([ $status -eq 0 ] && echo PASS || echo FAIL)" "$(( $(date +%s) - t_start )) s"
cat "$summary"
exit $status

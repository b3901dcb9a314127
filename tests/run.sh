#!/usr/bin/env bash
# The whole test suite, one command: single-process tests, then the multi-rank
# tests under mpiexec (pytest-mpi's --only-mpi selects the @pytest.mark.mpi ones).
# Usage: bash tests/run.sh [extra pytest args for the single-process run]
set -u
here="$(cd "$(dirname "$0")/.." && pwd)"
cd "$here"
PY="${PYTHON:-python}"
BIN="$(dirname "$(command -v "$PY")")"
MPIEXEC="${MPIEXEC:-$BIN/mpiexec}"
[ -x "$MPIEXEC" ] || MPIEXEC="$(command -v mpiexec || true)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# mpiexec gives ranks a pseudo-terminal for stdout: without NO_COLOR their pytest colour codes land in a log
[ -t 1 ] || export NO_COLOR=1
# Two cores are all CI has: oversubscribing is expected, and one BLAS thread per rank.
export OMPI_MCA_rmaps_base_oversubscribe=1 PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"

# The single-process phases run in two pytest-xdist workers (which tests
# stay together in one worker, and in which order the groups start:
# tests/conftest.py); `bash tests/run.sh -n 0` runs them in this process.
XDIST=(-n 2 --dist loadgroup --no-loadscope-reorder)

status=0
echo "== single-process tests"
"$PY" -m pytest -q "${XDIST[@]}" -m "not mpi" "$@" tests || status=1

# The cuda half of the device-parametrised tests (marker gpu) on the strict
# CuPy stand-in (tests/fakecupy): checks the CUDA path's API use without a GPU.
echo "== cuda tests on the CuPy stand-in (DTORCH_FAKE_CUDA=1)"
DTORCH_FAKE_CUDA=1 "$PY" -m pytest -q "${XDIST[@]}" -m "gpu and not mpi" "$@" tests || status=1

run_mpi() {  # $1 = number of ranks
    echo "== multi-rank tests: mpiexec -n $1"
    # python -m mpi4py: an uncaught exception in one rank aborts the job instead of hanging it
    timeout 600 "$MPIEXEC" -n "$1" "$PY" -m mpi4py -m pytest -q -p no:cacheprovider \
        --only-mpi -m mpi tests
    rc=$?
    # exit code 5 = "no tests collected": only acceptable when no mpi test exists for this size
    if [ $rc -eq 5 ]; then echo "(no multi-rank tests selected for -n $1)"; rc=0; fi
    [ $rc -eq 0 ] || status=1
}
if [ -n "$MPIEXEC" ]; then
    run_mpi 2
    run_mpi 3
else
    echo "mpiexec not found: install with pip install -e '.[dev]'" >&2
    status=1
fi
if [ $status -eq 0 ]; then echo "ALL TEST PHASES PASSED"; else echo "SOME TEST PHASE FAILED"; fi
exit $status

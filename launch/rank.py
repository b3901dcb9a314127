"""Per-rank shim: `python -m launch.rank [--] CMD ARGS...`.

mpiexec and srun start the ranks themselves and describe them in their
own variables (OMPI_COMM_WORLD_*, SLURM_*).  This shim turns those into
the dtorch contract (RANK, WORLD_SIZE, LOCAL_RANK, ..., see launch.env)
and then exec's CMD, so the rank is the same process MPI started (PMIx
keeps working) and the script sees one environment under every runner.
"""

import os
import sys

from launch.env import STARTED_VAR, detect


def _mark_started():
    """Tell the launcher that this rank got as far as running (see
    launch.external: a failure before any rank started is the MPI
    launcher's own)."""
    where = os.environ.pop(STARTED_VAR, None)
    if where:
        try:
            with open(os.path.join(where, os.environ.get("RANK", "x")),
                      "w"):
                pass
        except OSError:  # another host, or the launcher is gone
            pass


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        sys.exit("usage: python -m launch.rank [--] COMMAND [ARGS...]")
    try:
        os.environ.update(detect())
    except ValueError as err:
        sys.exit(f"launch.rank: {err}")
    _mark_started()
    try:
        os.execvp(argv[0], argv)
    except OSError as err:
        sys.exit(f"launch.rank: cannot run {argv[0]!r}: {err}")


if __name__ == "__main__":
    main()

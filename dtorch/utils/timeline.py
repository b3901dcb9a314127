"""``python -m dtorch.utils.timeline merge DIR [-o OUT]``: join the per-rank
Chrome traces that ``DTORCH_TIMELINE=DIR`` wrote into one file for
chrome://tracing or Perfetto (one process per rank, clocks aligned, each
collective split into the wait for the last rank and the transfer).

The recording itself is in ``collectives/timeline.py`` (collectives) and
``dtorch/distributed/_timeline.py`` (autograd ops, DDP buckets).
"""
import sys


def main(argv=None):
    # loaded here, not at import: dtorch.utils loads no distribution code
    from collectives.timeline import main as _main
    return _main(argv)


if __name__ == "__main__":
    sys.exit(main())

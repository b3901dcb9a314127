"""``dtorch-launch --dry-run``: a job's first steps in ONE process, its
ranks simulated as threads, before any real job starts.

    dtorch-launch --dry-run --nproc-per-node 4 train.py --tp 2 --pp 2
    python -m dtorch.distributed.dry_run --nproc-per-node 4 train.py ...

The launcher runs this module as its one child. Each of the N x M ranks is
a thread of the threads backend (``spawn_threads(deferred=True)``; each has
its own RNG, default dtype etc., dtorch/_rank_local.py) that executes the
script unmodified, as a process would:

- ``init_process_group()`` joins the rank's thread group, and
  RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE/GROUP_RANK in ``os.environ``
  read as the rank's own (an overlay for those keys, in the calling thread);
- ``signal.signal`` in a rank keeps the process's handler (Python allows
  handlers in the main thread only);
- rank 0's stdout and stderr are shown, each line prefixed ``[rank 0]``;
  other ranks' are dropped (the error that ends a rank is reported);
- ``sys.exit(0)`` ends a rank cleanly; any other exit or error in any rank
  ends the dry run with that error, naming the rank (the other ranks'
  collectives fail within half a second);
- every rank stops after ``--steps K`` optimizer steps (default 2), so all
  stop at the same step and their collectives stay matched.

The script really runs those K steps in the current directory (relative
data paths keep working): what it writes (a checkpoint, logs) is written.
Then a table gives, per rank, the parameter, gradient, optimizer-state and
activation bytes and the last step's bytes per collective kind
(distributed/_accounting.py says what each figure counts; a real rank
under ``DTORCH_DRY_RUN_REPORT=DIR`` measures the same). ``--json FILE``
writes them all.
"""
import argparse
import builtins
import contextlib
import json
import os
import resource
import runpy
import signal
import sys
import threading
import time
import traceback

import collectives as _c
from collectives import blas_threads

from . import _accounting, spawn_threads

RANK_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
             "GROUP_RANK")
DEFAULT_STEPS = 2
_tls = threading.local()      # .rank, .env of a simulated rank


class DryRunError(RuntimeError):
    """A rank of the dry run failed; ``rank``, ``error`` and ``code`` (the
    exit status to pass on) tell which and how."""

    def __init__(self, msg, rank, error, code=1):
        super().__init__(msg)
        self.rank, self.error, self.code = rank, error, code


# ------------------------------------------------ a process, per thread

class _RankEnviron(type(os.environ)):
    """``os.environ`` whose rank keys read, in a simulated rank's thread,
    as that rank's (writes to them stay in the thread); every other key,
    and every key in other threads, is the process's environment."""

    def __init__(self, real):
        super().__init__(real._data, real.encodekey, real.decodekey,
                         real.encodevalue, real.decodevalue)

    @staticmethod
    def _own():
        return getattr(_tls, "env", None)

    def __getitem__(self, key):
        own = self._own()
        if own is not None and key in RANK_KEYS:
            return own[key]
        return super().__getitem__(key)

    def __setitem__(self, key, value):
        own = self._own()
        if own is not None and key in RANK_KEYS:
            own[key] = str(value)
        else:
            super().__setitem__(key, value)

    def __delitem__(self, key):
        own = self._own()
        if own is not None and key in RANK_KEYS:
            del own[key]
        else:
            super().__delitem__(key)

    def __iter__(self):
        own = self._own() or {}
        yield from own
        for k in super().__iter__():
            if k not in own:
                yield k

    def __len__(self):
        return sum(1 for _ in self)

    def copy(self):
        return dict(self)


class _RankStream:
    """sys.stdout/stderr for the dry run: rank 0's lines prefixed, other
    ranks' dropped, other threads' (the dry run's own) passed on."""

    def __init__(self, real):
        self._real, self._bol = real, True

    def write(self, s):
        rank = getattr(_tls, "rank", None)
        if rank is None:
            return self._real.write(s)
        if rank != 0 or not s:
            return len(s)
        out = []
        for line in s.splitlines(keepends=True):
            if self._bol:
                out.append("[rank 0] ")
            out.append(line)
            self._bol = line.endswith("\n")
        self._real.write("".join(out))
        return len(s)

    def __getattr__(self, name):      # flush, fileno, isatty, encoding...
        return getattr(self._real, name)


def _signal_from_rank(real):
    def signal_(sig, handler):
        if threading.current_thread() is threading.main_thread():
            return real(sig, handler)
        # a simulated rank: the process keeps its handler (a real rank's
        # would work; the signal is not delivered to the dry run anyway)
        return signal.getsignal(sig)
    return signal_


@contextlib.contextmanager
def _process_as_ranks(argv, path_dir):
    """The process-wide stand-ins of one dry run, undone after it."""
    saved = (os.environ, sys.stdout, sys.stderr, signal.signal, sys.argv,
             list(sys.path))
    os.environ = _RankEnviron(os.environ)
    sys.stdout, sys.stderr = _RankStream(sys.stdout), _RankStream(sys.stderr)
    signal.signal = _signal_from_rank(signal.signal)
    sys.argv = list(argv)
    if path_dir is not None:
        sys.path.insert(0, path_dir)      # as `python script.py` does
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        (os.environ, sys.stdout, sys.stderr, signal.signal,
         sys.argv) = saved[:5]
        sys.path[:] = saved[5]


def _runner(target, module):
    """A function that runs the script (or module) as ``__main__`` in
    fresh globals: compiled once, executed once per rank."""
    if module:
        return lambda: runpy.run_module(target, run_name="__main__",
                                        alter_sys=False)
    path = os.path.abspath(target)
    with open(path, "rb") as f:
        code = compile(f.read(), path, "exec")

    def run():
        exec(code, {"__name__": "__main__", "__file__": path,
                    "__builtins__": builtins, "__package__": None,
                    "__spec__": None, "__loader__": None})
    return run


# ------------------------------------------------------------- the run

def run(target, args=(), nproc_per_node=1, nnodes=1, steps=DEFAULT_STEPS,
        module=False, timeout=None):
    """Dry-run ``target`` (a script path, or a module name with
    ``module``) with ``args`` as nproc_per_node x nnodes thread ranks for
    ``steps`` optimizer steps. Returns the report (a dict; ``ranks``: one
    summary per rank, see distributed/_accounting.py); raises DryRunError
    naming the rank when a rank fails. ``timeout``: seconds a collective
    waits for a rank that never comes (default DTORCH_COLLECTIVE_TIMEOUT,
    else 120: a dry run's steps are short)."""
    for name, v in (("nproc_per_node", nproc_per_node), ("nnodes", nnodes),
                    ("steps", steps)):
        if int(v) < 1:
            raise ValueError(f"{name} must be >= 1 (got {v})")
    world = nproc_per_node * nnodes
    if timeout is None:
        timeout = _c.env_number("DTORCH_COLLECTIVE_TIMEOUT", 120.0)
    script = _runner(target, module)
    ledgers = [_accounting.Ledger(r, world, stop_after=steps)
               for r in range(world)]
    failures = {}

    def rank(r, w):
        _tls.rank = r
        _tls.env = {"RANK": str(r), "WORLD_SIZE": str(w),
                    "LOCAL_RANK": str(r % nproc_per_node),
                    "LOCAL_WORLD_SIZE": str(nproc_per_node),
                    "GROUP_RANK": str(r // nproc_per_node)}
        led = ledgers[r]
        _accounting.start(led)
        try:
            script()
            led.ended = "finished"
        except _accounting.StopDryRun:
            led.ended = "stopped"
        except SystemExit as e:
            if e.code not in (None, 0):
                failures[r] = e
                raise
            led.ended = "exited"
        except BaseException as e:
            failures[r] = e
            raise
        finally:
            _accounting.stop()
            _tls.rank = _tls.env = None
        return led.summary()

    argv = [target] + list(args)
    path_dir = None if module else os.path.dirname(os.path.abspath(target))
    wall, cpu = time.perf_counter(), _cpu()
    with _process_as_ranks(argv, path_dir):
        try:
            ranks = spawn_threads(rank, world, timeout=timeout,
                                  deferred=True)
        except BaseException as e:
            r = next((r for r, x in failures.items() if x is e), None)
            if r is None:
                raise
            raise _failure(r, world, e) from e
    return {"script": target, "args": list(args), "module": module,
            "world_size": world, "nproc_per_node": nproc_per_node,
            "nnodes": nnodes, "steps": steps,
            "wall_s": round(time.perf_counter() - wall, 3),
            "cpu_s": round(_cpu() - cpu, 3), "ranks": ranks}


def _cpu():
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _failure(r, world, e):
    where = f"rank {r} of {world}"
    if isinstance(e, SystemExit):
        code = e.code if isinstance(e.code, int) else 1
        what = (f"exited with status {e.code}" if isinstance(e.code, int)
                else str(e.code))
        return DryRunError(f"{where}: {what}", r, e, code)
    return DryRunError(f"{where} failed: {type(e).__name__}: {e}", r, e)


# ------------------------------------------------------------- output

def _size(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def kinds(report):
    """The collective kinds that moved bytes on some rank, table order."""
    seen = {k for r in report["ranks"]
            for k, v in r.get("collective_bytes", {}).items() if v}
    order = list(_accounting.KINDS)
    return [k for k in order if k in seen] + sorted(seen - set(order))


def format_table(report):
    """The report as text: a heading and one row per rank."""
    ks = kinds(report)
    head = (f"dry run of {report['script']}: {report['world_size']} ranks "
            f"({report['nnodes']} node(s) x {report['nproc_per_node']}), "
            f"{report['steps']} step(s) each; {report['wall_s']:.1f} s wall,"
            f" {report['cpu_s']:.1f} s CPU\n"
            f"bytes per rank; collectives: the last step's payload per kind")
    cols = ["rank", "steps", "parameters", "gradients", "optimizer",
            "activations"] + ks
    rows = []
    for r in report["ranks"]:
        cb = r.get("collective_bytes", {})
        rows.append([str(r["rank"]), str(r["steps"])] + [
            _size(r.get(k, 0)) for k in (
                "parameter_bytes", "gradient_bytes",
                "optimizer_state_bytes", "activation_bytes")] + [
            _size(cb.get(k, 0)) for k in ks])
    widths = [max(len(c), *(len(row[i]) for row in rows))
              for i, c in enumerate(cols)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(cols, widths))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths))
              for row in rows]
    short = [r["rank"] for r in report["ranks"]
             if r["steps"] < report["steps"]]
    if short:
        lines.append(f"ranks {short} ended before {report['steps']} "
                     f"optimizer steps (the script finished or exited)")
    return head + "\n" + "\n".join(lines)


def build_parser():
    # allow_abbrev=False: a script's own "--n 5" is not taken for an
    # abbreviation of --nnodes/--nproc-per-node (dtorch-launch passes the
    # options here spelled out)
    p = argparse.ArgumentParser(
        prog="python -m dtorch.distributed.dry_run", allow_abbrev=False,
        description="Run a job's first optimizer steps in one process, its "
                    "ranks simulated as threads, and print each rank's "
                    "memory and collective bytes. The script really runs "
                    "those steps, in the current directory: what it writes "
                    "(checkpoints, logs) is written.")
    p.add_argument("--nproc-per-node", type=int, default=1)
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS,
                   help=f"optimizer steps per rank (default "
                        f"{DEFAULT_STEPS})")
    p.add_argument("--json", default=None, help="write the report here")
    p.add_argument("-m", "--module", action="store_true",
                   help="the target is a module, run as python -m")
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    return p


def main(argv=None):
    a = build_parser().parse_args(argv)
    if not any(os.environ.get(v) for v in blas_threads.THREAD_VARS):
        # the ranks share one BLAS: one thread, or they contend for it
        # (4 ranks of examples/gpt.py on 2 cores: 12x slower)
        blas_threads.set_blas_threads(1)
    try:
        report = run(a.script, a.args, a.nproc_per_node, a.nnodes, a.steps,
                     a.module)
    except DryRunError as e:
        if not isinstance(e.error, SystemExit):
            traceback.print_exception(e.error, file=sys.stderr)
        print(f"dtorch-launch --dry-run: {e}", file=sys.stderr, flush=True)
        return e.code
    print(format_table(report), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

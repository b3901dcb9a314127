"""Straggler detection for DDP: which rank is slow, in which phase.

Each rank measures every synchronised step (a backward that reduces
gradients) in two phases of its own:

- ``compute``: from the step's first forward to the end of its backward,
  less the time backward waited for the gradient all-reduce;
- ``data``: from the end of the previous step's backward to this step's
  first forward - loading the batch, the optimizer step and whatever else
  the loop does outside forward and backward.

Every ``every`` steps (``DTORCH_STRAGGLER_EVERY``, default 20) the ranks
share each phase's median step over the window (a one-off stall is not a
straggler) in one small all-reduce (2 x world numbers),
issued where backward already waits for the gradients, so no rank waits
for it longer than for the buckets. A rank whose phase is more than
``threshold`` (``DTORCH_STRAGGLER_THRESHOLD``, default 0.2) above the median
of the other ranks, by at least 5% of the median step and 0.5 ms (below
that, scheduling noise), is named on group
rank 0's log ("rank 3 is 31% slower in data loading over the last 20
steps") and in ``DistributedDataParallel.straggler_reports``.

Communication is not scored: the time a rank waits for the all-reduce is
mostly the time the others (or the slowest link) take, so a slow rank
shows as a *short* wait on itself and long waits on everyone else; naming
the slow link needs per-peer timing from the transport. Under
``join()`` (uneven inputs, ranks step different numbers of times) nothing
is exchanged. ``DTORCH_STRAGGLER=0`` turns detection off.
"""
import logging
import time

import numpy as np

from collectives.env import env_flag, env_number
from ... import distributed as dist
from ...tensor import Tensor

_log = logging.getLogger("dtorch.distributed")
_PHASES = ("compute", "data")
_WORDS = {"compute": "compute (forward and backward)",
          "data": "data loading (outside forward and backward)"}


class StragglerDetector:
    def __init__(self, group, every=None, threshold=None, floor=0.05,
                 min_seconds=5e-4):
        self.group = group
        self.every = int(env_number("DTORCH_STRAGGLER_EVERY", 20, int)
                         if every is None else every)
        self.threshold = float(env_number("DTORCH_STRAGGLER_THRESHOLD", 0.2)
                               if threshold is None else threshold)
        if self.every < 1 or self.threshold <= 0:
            raise ValueError(f"straggler detection needs every >= 1 and "
                             f"threshold > 0, got {self.every} and "
                             f"{self.threshold}")
        self.floor, self.min_seconds = floor, min_seconds
        self.reports = []
        self.steps = 0
        self._window = []     # (compute, data) seconds of each step
        self._first_fwd = None
        self._prev_end = None
        self._wait0 = 0.0

    @staticmethod
    def enabled():
        return env_flag("DTORCH_STRAGGLER", True)

    def forward(self):
        """A forward with grad enabled began."""
        if self._first_fwd is None:
            self._first_fwd = time.perf_counter()

    def backward_end(self, wait_total, joined=False, device=None):
        """A synchronised backward ended; ``wait_total`` is the reducer's
        cumulative wait for buckets."""
        now = time.perf_counter()
        start = self._first_fwd if self._first_fwd is not None else now
        wait = wait_total - self._wait0
        self._wait0 = wait_total
        prev, self._first_fwd, self._prev_end = self._prev_end, None, now
        if joined:
            # ranks step different numbers of times under join(): neither
            # these steps nor the exchange count, so the ranks stay in step
            return
        self._window.append((max(0.0, now - start - wait),
                             max(0.0, start - prev) if prev is not None
                             else None))
        self.steps += 1
        if self.steps % self.every == 0:
            self._exchange(device)

    def _exchange(self, device):
        g = self.group
        n, me = dist.get_world_size(g), dist.get_rank(g)
        table = np.zeros((n, len(_PHASES)))
        # per phase the window's median step: a one-off stall (a warm-up,
        # a checkpoint written by one rank) is not a straggler
        for j in range(len(_PHASES)):
            vals = [w[j] for w in self._window if w[j] is not None]
            table[me, j] = float(np.median(vals)) if vals else 0.0
        self._window = []
        t = Tensor._wrap(table.reshape(-1))
        if device is not None and device.type != "cpu":
            t = t.to(device)
        dist.all_reduce(t, group=g)
        table = t.cpu().numpy().reshape(n, len(_PHASES))
        found = self.judge(table)
        for r in found:
            r["step"] = self.steps
        self.reports += found
        if me == 0:
            for r in found:
                _log.warning(
                    "rank %d is %.0f%% slower in %s over the last %d steps "
                    "(median step %.1f ms; the other ranks' %.1f ms)",
                    r["rank"], 100 * r["slower_by"], _WORDS[r["phase"]],
                    self.every, 1e3 * r["seconds"], 1e3 * r["reference"])

    def judge(self, table):
        """The stragglers in a (ranks x phases) table of per-step seconds:
        [{'rank', 'phase', 'slower_by', 'seconds', 'reference'}]."""
        n = table.shape[0]
        if n < 2:
            return []
        step = float(np.median(table.sum(axis=1)))
        out = []
        for j, phase in enumerate(_PHASES):
            col = table[:, j]
            for r in range(n):
                ref = float(np.median(np.delete(col, r)))
                v = float(col[r])
                if v > ref * (1 + self.threshold) and \
                        v - ref > max(self.floor * step, self.min_seconds):
                    out.append({"rank": r, "phase": phase,
                                "slower_by": v / ref - 1 if ref > 0
                                else float("inf"),
                                "seconds": v, "reference": ref})
        return out

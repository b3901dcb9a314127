"""Straggler detection for DDP and FSDP: which rank is slow, in which phase.

Each rank measures every synchronised step (a backward that reduces
gradients) in three phases:

- ``compute``: from the step's first forward to the end of its backward,
  less the time backward waited for the gradient all-reduce (FSDP: the
  root's forward to the end of backward, less the time in its all-gathers
  and reduce-scatters - they block, so all their time is wait);
- ``data``: from the end of the previous step's backward to this step's
  first forward - loading the batch, the optimizer step and whatever else
  the loop does outside forward and backward;
- ``network``: how long this rank blocked waiting for data *from each
  peer* - the transports add, per blocking wait, the seconds to the
  group's ``peer_wait`` list (tcp: the socket rings charge a wait to the
  rank whose block or chunk is due, the same-host shared-memory reducer
  to the rank whose counter is late; threads: to the rank that had not
  posted; the cost: a perf_counter pair per blocking
  wait and per late peer, nothing when the data is already there). A
  rank's network figure is how long the *others* waited for it
  (the column sums of the per-peer wait matrix, per other rank), less
  what its compute and data phases explain (a rank late from compute
  also makes the others wait on it).

Every ``every`` steps (``DTORCH_STRAGGLER_EVERY``, default 20) the ranks
share each phase's median step over the window (a one-off stall is not a
straggler) in one small all-reduce (3 x world numbers: each rank's
compute and data in its row, and its per-peer waits, which the sum turns
into the column sums),
issued where backward already waits for the gradients, so no rank waits
for it longer than for the buckets. A rank whose phase is more than
``threshold`` (``DTORCH_STRAGGLER_THRESHOLD``, default 0.2) above the median
of the other ranks, by at least 5% of the median step and 0.5 ms (below
that, scheduling noise), is named on group
rank 0's log ("rank 3 is 31% slower in data loading over the last 20
steps") and in ``straggler_reports`` (DDP and FSDP).

The network phase is judged with the same threshold, but as a share of
the step, not a ratio: a healthy rank makes nobody wait, so its
``slower_by`` is the share of the median step (compute + data) the
other ranks lose waiting for it ("rank 2 is 30% slower on the network":
they wait 30% of a step for its data), named above the threshold. It is
reported only when no rank is a compute or data straggler in the window
(that explains the waits). Backends
without per-peer timing (mpi, except its same-host shared-memory
all-reduce, which DDP's buckets take on one host: MPI's own collectives
do not say which peer they waited for) score 0 here; so do the
inter-host steps of the tcp backend's two-level all-reduce (their waits
go to the leaders' group, not to the job's). Under
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
          "data": "data loading (outside forward and backward)",
          "network": "the network"}


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
        self._waits = []      # per step: seconds waited for each peer
        self._wait_prev = None
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
        self._waits.append(self._peer_waits())
        self.steps += 1
        if self.steps % self.every == 0:
            self._exchange(device)

    def _peer_waits(self):
        """This step's seconds waited for each peer (the growth of the
        group's ``peer_wait``), or None where the backend has none."""
        acc = dist.get_peer_wait(self.group)
        if acc is None:
            return None
        acc = np.array(acc, dtype=np.float64)
        prev, self._wait_prev = self._wait_prev, acc
        return None if prev is None else acc - prev

    def _exchange(self, device):
        g = self.group
        n, me = dist.get_world_size(g), dist.get_rank(g)
        k = len(_PHASES)
        flat = np.zeros(n * k + n)
        table = flat[:n * k].reshape(n, k)
        # per phase the window's median step: a one-off stall (a warm-up,
        # a checkpoint written by one rank) is not a straggler
        for j in range(k):
            vals = [w[j] for w in self._window if w[j] is not None]
            table[me, j] = float(np.median(vals)) if vals else 0.0
        waits = [w for w in self._waits if w is not None]
        if waits:
            # my median wait for each peer; summed over ranks: how long
            # each rank was waited for
            flat[n * k:] = np.median(np.array(waits), axis=0)
            flat[n * k + me] = 0.0
        self._window, self._waits = [], []
        t = Tensor._wrap(flat)
        if device is not None and device.type != "cpu":
            t = t.to(device)
        dist.all_reduce(t, group=g)
        flat = t.cpu().numpy()
        found = self.judge(flat[:n * k].reshape(n, k), flat[n * k:])
        for r in found:
            r["step"] = self.steps
        self.reports += found
        if me == 0:
            for r in found:
                what = ("(the other ranks wait %.1f ms per step for its "
                        "data, %.1f ms for the others')"
                        if r["phase"] == "network" else
                        "(median step %.1f ms; the other ranks' %.1f ms)")
                _log.warning(
                    "rank %d is %.0f%% slower %s %s over the last %d steps "
                    + what, r["rank"], 100 * r["slower_by"],
                    "on" if r["phase"] == "network" else "in",
                    _WORDS[r["phase"]], self.every, 1e3 * r["seconds"],
                    1e3 * r["reference"])

    def judge(self, table, waited=None):
        """The stragglers in a (ranks x phases) table of per-step seconds
        and ``waited`` (per rank, the seconds per step the other ranks
        together waited for its data; None: not measured):
        [{'rank', 'phase', 'slower_by', 'seconds', 'reference'}]."""
        n = table.shape[0]
        if n < 2:
            return []
        busy = table.sum(axis=1)
        step = float(np.median(busy))
        out = []
        for j, phase in enumerate(_PHASES):
            out += self._outliers(phase, table[:, j], step, ratio=True)
        if waited is not None and not out:
            # per other rank, less the lateness compute and data explain
            late = np.array([max(0.0, busy[r] - np.median(np.delete(busy, r)))
                             for r in range(n)])
            net = np.maximum(0.0, np.asarray(waited) / (n - 1) - late)
            out += self._outliers("network", net, step, ratio=False)
        return out

    def _outliers(self, phase, col, step, ratio):
        """The ranks whose figure in col is more than the threshold above
        the others' median (by the floors too). slower_by: the ratio less
        one, or (ratio=False, the network) the excess over the step, which
        must then pass the threshold too."""
        out = []
        floor = (self.floor if ratio else max(self.floor, self.threshold)) \
            * step
        for r in range(len(col)):
            ref = float(np.median(np.delete(col, r)))
            v = float(col[r])
            if v > ref * (1 + self.threshold) and \
                    v - ref > max(floor, self.min_seconds):
                by = ((v / ref - 1 if ref > 0 else float("inf")) if ratio
                      else (v - ref) / step if step > 0 else float("inf"))
                out.append({"rank": r, "phase": phase, "slower_by": by,
                            "seconds": v, "reference": ref})
        return out

"""DDP's straggler detection (dtorch/nn/parallel/_straggler.py): a rank
slowed in compute, in data loading or on the network is named with its
phase within two windows; equal ranks are never named; join() and the off
switch. (3 tcp processes: tests/distributed/test_straggler_tcp.py.)"""
import logging
import time

import numpy as np
import pytest

import dtorch
import dtorch.distributed as dist
from dtorch.distributed import spawn_threads
from dtorch.nn.parallel import DistributedDataParallel as DDP
from dtorch.distributed.fsdp import FullyShardedDataParallel as FSDP
from dtorch.nn.parallel._straggler import StragglerDetector
from collectives.threads import ThreadGroup


class Sleepy(dtorch.nn.Module):
    def __init__(self, seconds):
        super().__init__()
        self.fc = dtorch.nn.Linear(4, 2)
        self.seconds = seconds

    def forward(self, x):
        time.sleep(self.seconds)
        return self.fc(x)


def late_sends(monkeypatch, rank, seconds, ops):
    """Thread rank ``rank``'s contributions to ``ops`` reach the others
    ``seconds`` late, as over a slow link: the post moves into the op's
    wait (where DDP's bucket wait already is), after a sleep."""
    post = ThreadGroup._exchange

    def exchange(self, payload, opname, then, like=None):
        if self.rank != rank or opname not in ops:
            return post(self, payload, opname, then, like)

        def fin(deadline):
            time.sleep(seconds)
            post(self, payload, opname, then, like)(deadline)
        return fin
    monkeypatch.setattr(ThreadGroup, "_exchange", exchange)


def run(world, steps, compute, data, slow=None, every=None, wrap=DDP):
    """``slow``: (rank, phase, factor); ``wrap``: DDP or FSDP. Returns
    rank 0's reports."""
    reports = {}

    def rank(r, w):
        me = dist.get_rank()
        c, d = compute, data
        if slow is not None and slow[0] == me:
            if slow[1] == "compute":
                c *= slow[2]
            elif slow[1] == "data":
                d *= slow[2]
        model = wrap(Sleepy(c))
        if every is not None:
            model._straggler.every = every
        opt = dtorch.optim.SGD(model.parameters(), lr=0.01)
        x = dtorch.ones(2, 4)
        for _ in range(steps):
            time.sleep(d)                   # the loader
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
        reports[me] = model.straggler_reports
    spawn_threads(rank, world)
    # every rank judged the same table
    assert all(reports[r] == reports[0] for r in reports)
    return reports[0]


@pytest.mark.parametrize("wrap", [DDP, FSDP], ids=["ddp", "fsdp"])
@pytest.mark.parametrize("phase", ["compute", "data"])
def test_slow_rank_is_named_with_its_phase(phase, wrap, caplog):
    # two windows of 20 steps: on a loaded machine one window's medians can
    # miss by scheduling noise; every report must still be the right one.
    # (FSDP recomputes the forward in backward: its compute is 2 sleeps)
    with caplog.at_level(logging.WARNING, logger="dtorch.distributed"):
        found = run(3, 40, compute=0.02, data=0.02, slow=(1, phase, 1.3),
                    wrap=wrap)
    assert found, "no straggler found within 40 steps"
    assert {(r["rank"], r["phase"]) for r in found} == {(1, phase)}
    assert 0.15 < found[0]["slower_by"] < 0.6
    words = "compute" if phase == "compute" else "data loading"
    assert any("rank 1 is" in m and words in m and "over the last 20 steps"
               in m for m in caplog.messages)


@pytest.mark.parametrize("wrap", [DDP, FSDP], ids=["ddp", "fsdp"])
def test_slow_link_is_named_on_the_network(wrap, monkeypatch, caplog):
    # rank 2's contributions arrive 6 ms late in a 20 ms step: the others
    # wait 30% of a step for it; its compute and data are like theirs.
    # (DDP: its one bucket all-reduce a step; FSDP: its reduce-scatter)
    late_sends(monkeypatch, 2, 0.006,
               ("all_reduce",) if wrap is DDP else ("reduce_scatter",))
    with caplog.at_level(logging.WARNING, logger="dtorch.distributed"):
        found = run(3, 40, compute=0.01 if wrap is DDP else 0.005,
                    data=0.01, wrap=wrap)
    assert found, "no network straggler found within 40 steps"
    # rank 2 only, on the network; on a loaded 2-core machine one window
    # may also see its compute pushed over the line (FSDP's collectives
    # block in backward), never another rank
    got = {(r["rank"], r["phase"]) for r in found}
    assert (2, "network") in got and {r for r, _ in got} == {2}, got
    net = [r for r in found if r["phase"] == "network"]
    assert 0.15 < net[0]["slower_by"] < 0.6
    assert any("rank 2 is" in m and "on the network" in m
               for m in caplog.messages)


def test_compute_straggler_is_not_a_network_one():
    # the others wait for a rank late from compute: that is its compute
    found = run(3, 40, compute=0.02, data=0.005, slow=(0, "compute", 1.5))
    assert found and {(r["rank"], r["phase"]) for r in found} == \
        {(0, "compute")}


def test_equal_ranks_are_never_named():
    assert run(3, 100, compute=0.015, data=0.015, every=10) == []


def test_judge_two_ranks_and_small_phases():
    det = StragglerDetector(None, every=1, threshold=0.2)
    # two ranks: each compared with the other
    got = det.judge(np.array([[1.0, 0.1], [1.3, 0.1]]))
    assert [(r["rank"], r["phase"]) for r in got] == [(1, "compute")]
    # a phase far below 5% of the step is not worth a report, nor 0.4 ms
    assert det.judge(np.array([[1.0, 0.001], [1.0, 0.005]])) == []
    assert det.judge(np.array([[0.001, 0], [0.0014, 0]])) == []
    with pytest.raises(ValueError, match="every >= 1"):
        StragglerDetector(None, every=0)
    # the network: the others waited 2 x 6 ms for rank 2 (3 ranks, 20 ms
    # steps); 0.3 ms of waits is noise; a compute straggler explains waits
    even = np.full((3, 2), 0.01)
    got = det.judge(even, np.array([0.0, 0.0, 0.012]))
    assert [(r["rank"], r["phase"]) for r in got] == [(2, "network")]
    assert got[0]["slower_by"] == pytest.approx(0.3)
    assert det.judge(even, np.array([0.0003, 0.0, 0.0003])) == []
    slow = np.array([[0.01, 0.01], [0.01, 0.01], [0.016, 0.01]])
    assert [(r["rank"], r["phase"]) for r in det.judge(
        slow, np.array([0.0, 0.0, 0.012]))] == [(2, "compute")]
    # a compute lead below the threshold (10%) does not become network
    assert det.judge(np.array([[0.01, 0.01], [0.01, 0.01], [0.012, 0.01]]),
                     np.array([0.0, 0.0, 0.004])) == []


def test_off_switch_and_join(monkeypatch):
    monkeypatch.setenv("DTORCH_STRAGGLER", "0")
    seen = {}

    def rank(r, w):
        model = DDP(Sleepy(0.0))
        seen[dist.get_rank()] = model._straggler
    spawn_threads(rank, 2)
    assert seen == {0: None, 1: None}
    monkeypatch.delenv("DTORCH_STRAGGLER")
    done = {}

    def uneven(r, w):
        me = dist.get_rank()
        model = DDP(Sleepy(0.0))
        model._straggler.every = 2
        x = dtorch.ones(2, 4)
        with model.join():
            for _ in range(3 + 2 * me):      # ranks step 3 and 5 times
                model(x).sum().backward()
        for _ in range(4):                   # and go on together
            model(x).sum().backward()
        done[me] = model._straggler.steps
    spawn_threads(uneven, 2)
    # steps under join() do not count, so both ranks exchanged in step
    assert done == {0: 4, 1: 4}

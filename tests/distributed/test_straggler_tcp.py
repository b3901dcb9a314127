"""Straggler detection's network phase with 3 tcp processes on 127.0.0.1:
for 40 steps nobody is named; then a rank whose bucket all-reduces reach
the others late (a sleep where it starts sending) is named on the network
within 40 steps, through the same-host shared-memory reducer DDP's
buckets take by default and through the socket ring (DTORCH_TCP_SHM=0).
This file is also the ranks' script."""
import json
import os
import sys
import time

import pytest

_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# tests/ (the shared helpers) and the checkout above it: run as a script
# under an editable install, a rank would otherwise import tests/collectives
# and tests/launch (namespace directories) as the packages of those names
sys.path[:0] = [_TESTS, os.path.dirname(_TESTS)]

pytestmark = pytest.mark.timeout(120)

if 'OMPI_COMM_WORLD_SIZE' in os.environ or 'PMI_SIZE' in os.environ:
    pytest.skip("single-process tests; not run under mpiexec",
                allow_module_level=True)


CLEAN, SLOW = 40, 40      # steps


def _slow_sends(seconds):
    """This rank starts sending each all-reduce ``seconds[0]`` late, in
    the collectives' lane (not in backward): the shared-memory reducer's
    all_reduce, or the socket ring's."""
    from collectives import shm_reduce
    from collectives.tcp import rings
    for cls, name in ((shm_reduce.ShmReducer, "all_reduce"),
                      (rings.RingAlgorithms, "_all_reduce")):
        orig = getattr(cls, name)

        def late(self, *a, _orig=orig, **k):
            time.sleep(seconds[0])
            return _orig(self, *a, **k)
        setattr(cls, name, late)


def _rank_main(argv):
    _, rank, world, port, token, slow = argv[:6]
    os.environ["DTORCH_RDZV_TOKEN"] = token
    import dtorch
    import dtorch.distributed as dist
    from dtorch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("tcp", init_method=f"tcp://127.0.0.1:{port}",
                            rank=int(rank), world_size=int(world),
                            timeout=60)
    late = [0.0]
    if int(rank) == int(slow):
        _slow_sends(late)
    dtorch.manual_seed(0)
    model = DDP(dtorch.nn.Linear(8, 4))
    opt = dtorch.optim.SGD(model.parameters(), lr=0.01)
    x = dtorch.ones(4, 8)
    for step in range(CLEAN + SLOW):
        if step == CLEAN:
            late[0] = 0.006               # 30% of the step from now on
        time.sleep(0.01)                  # the loader
        model(x).sum().backward()
        time.sleep(0.01)                  # compute, as a bigger model
        opt.step()
        opt.zero_grad()
    print(json.dumps({"reports": model.straggler_reports,
                      "red": dist.group.WORLD._red is not None}),
          flush=True)
    dist.destroy_process_group()


def _run(slow, shm):
    from collectives_helpers import run_ranks
    # run_ranks passes: mode (here the slow rank) rank world port token
    outs = run_ranks(str(slow), 3, timeout=100,
                     script=os.path.abspath(__file__),
                     env={} if shm else {"DTORCH_TCP_SHM": "0"})
    res = []
    for r, (out, err, code) in enumerate(outs):
        assert out is not None and code == 0, f"rank {r}:\n{err}"
        res.append(out)
    assert all(o["red"] == shm for o in res)     # the path under test
    assert all(o["reports"] == res[0]["reports"] for o in res)
    return res[0]["reports"]


@pytest.mark.parametrize("shm", [True, False], ids=["shm", "socket"])
def test_slow_link_is_named_on_the_network_tcp(shm):
    found = _run(2, shm)
    assert [r for r in found if r["step"] <= CLEAN] == [], \
        "a report while every rank was equal"
    assert found, f"no network straggler found within {SLOW} steps"
    assert {(r["rank"], r["phase"]) for r in found} == {(2, "network")}
    assert 0.15 < found[0]["slower_by"] < 0.6


if __name__ == "__main__":
    mode, *rest = sys.argv[1:]
    _rank_main([None] + rest + [mode])

"""dcp with real processes (2 ranks, tcp backend on 127.0.0.1):

- exact resume across processes: 10 steps == 5 steps + save + fresh
  processes + load + 5 steps, bitwise in float64 with dropout (a different
  stream per rank), DDP, Adam, a scheduler and a shuffled
  DistributedSampler stopped mid-epoch: parameters, optimizer state and
  the order of the samples;
- kill -9 of a rank while it writes its shard, and of rank 0 just before
  the commit: the previous checkpoint stays the latest and loads.

This file is also the ranks' script (``python test_dcp_process.py MODE
...``). Only pids started here are killed."""
import json
import os
import signal
import sys
import time

import pytest

_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# tests/ (the shared helpers) and the checkout above it: run as a script
# under an editable install, a rank would otherwise import tests/collectives
# and tests/launch (namespace directories) as the packages of those names
sys.path[:0] = [_TESTS, os.path.dirname(_TESTS)]
from helpers import finish, start_tcp_ranks  # noqa: E402

if __name__ != "__main__" and ("OMPI_COMM_WORLD_SIZE" in os.environ
                               or "PMI_SIZE" in os.environ):
    pytest.skip("single-process tests; not run under mpiexec",
                allow_module_level=True)

pytestmark = pytest.mark.timeout(180)


# ================================================================ ranks ==

def _train(path, mode, out):
    import dtorch
    import dtorch.distributed as dist
    import dtorch.distributed.checkpoint as dcp
    from dtorch import nn
    from dtorch.distributed.checkpoint.state_dict import (get_state_dict,
                                                          set_state_dict)
    from dtorch.nn.parallel import DistributedDataParallel as DDP
    from dtorch.utils.data import (DataLoader, DistributedSampler,
                                   TensorDataset)
    F64 = dtorch.float64
    dist.init_process_group("tcp")
    rank = dist.get_rank()
    dtorch.manual_seed(0)
    ds = TensorDataset(dtorch.randn(36, 5, dtype=F64),
                       dtorch.randn(36, 3, dtype=F64), dtorch.arange(36))
    model = DDP(nn.Sequential(nn.Linear(5, 16), nn.Dropout(0.3), nn.Tanh(),
                              nn.Linear(16, 3)).to(F64))
    dtorch.manual_seed(100 + rank)        # dropout differs per rank
    sampler = DistributedSampler(ds, shuffle=True, seed=5)
    loader_g = dtorch.Generator().manual_seed(9)
    loader = DataLoader(ds, batch_size=4, sampler=sampler,
                        generator=loader_g)
    opt = dtorch.optim.Adam(model.parameters(), lr=0.02)
    sched = dtorch.optim.lr_scheduler.StepLR(opt, 4, gamma=0.5)
    msd, osd = get_state_dict(model, opt)
    st = {"model": msd, "optim": osd, "sched": sched, "sampler": sampler,
          "rng": dcp.RNGState(loader_g), "step": 0}
    step, seen = 0, []
    if mode == "resume":
        dcp.load(st, checkpoint_id=path)
        set_state_dict(model, opt, model_state_dict=msd,
                       optim_state_dict=osd)
        step = st["step"]
    while step < 10:
        for x, y, idx in loader:
            seen.append(idx.numpy().tolist())
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            sched.step()
            step += 1
            if mode == "save" and step == 5:
                msd, osd = get_state_dict(model, opt)
                st.update(model=msd, optim=osd, step=step)
                dcp.save(st, checkpoint_id=path)
                return
            if step == 10:
                break
        else:
            sampler.set_epoch(sampler.epoch + 1)
    snap = {k: v for k, v in model.module.state_dict().items()}
    for i, s in opt.state_dict()["state"].items():
        for k, v in s.items():
            snap[f"opt.{i}.{k}"] = v
    dtorch.save({"state": snap, "seen": seen[-5:]}, f"{out}.{rank}")


def _kill_target(root, which, flag):
    """Save step 1, then step 2 with this rank stalled where the test
    kills it (``which``: 'write' = rank 1 inside its shard file, 'commit'
    = rank 0 after every rank wrote, before the rename)."""
    import dtorch
    import dtorch.distributed as dist
    import dtorch.distributed.checkpoint as dcp
    from dtorch.distributed.checkpoint import _save
    dist.init_process_group("tcp")
    rank = dist.get_rank()
    mgr = dcp.CheckpointManager(root, keep_last=3)
    t = dtorch.full((1 << 16,), 1.0) + rank
    mgr.save({"t": t, "w": dtorch.ones(8), "step": 1}, step=1)

    def stall():
        open(flag, "w").close()
        time.sleep(120)                    # killed here

    if which == "write" and rank == 1:
        real = _save._write_file

        def write_half(path, *a):
            with open(path, "wb") as fh:
                fh.write(b"\0" * 1000)      # a partial shard on disk
            stall()
            return real(path, *a)
        _save._write_file = write_half
    if which == "commit" and rank == 0:
        real_commit = _save._commit

        def commit(*a):
            stall()
            return real_commit(*a)
        _save._commit = commit
    t += 1
    mgr.save({"t": t, "w": dtorch.ones(8) * 2, "step": 2}, step=2)


# ================================================================ tests ==

HERE = os.path.abspath(__file__)


def _start(args, world=2, extra=None):
    return start_tcp_ranks([HERE] + args, world, **(extra or {}))


def _run(args):
    outs = finish(_start(args))
    for r, (rc, out, err) in enumerate(outs):
        assert rc == 0, f"rank {r} exited {rc}:\n{err[-3000:]}"


def test_exact_resume_in_fresh_processes_with_dropout(tmp_path):
    import dtorch
    ck, out = str(tmp_path / "ck"), str(tmp_path / "out")
    _run(["train", ck, "full", out + ".full"])
    _run(["train", ck, "save", out + ".x"])
    _run(["train", ck, "resume", out + ".resumed"])
    meta = json.loads(open(os.path.join(ck, ".metadata")).read())
    # the RNG states differ between ranks: each rank kept its own
    assert set(meta["state_dict_metadata"]["rng.default.state"]["per_rank"]) \
        == {"0", "1"}
    for r in range(2):
        a = dtorch.load(f"{out}.full.{r}")
        b = dtorch.load(f"{out}.resumed.{r}")
        assert a["seen"] == b["seen"] and len(a["seen"]) == 5
        assert a["state"].keys() == b["state"].keys()
        for k in a["state"]:
            x, y = a["state"][k].numpy(), b["state"][k].numpy()
            assert x.dtype == y.dtype and x.tobytes() == y.tobytes(), \
                f"rank {r}: {k}"


@pytest.mark.parametrize("which,victim", [("write", 1), ("commit", 0)])
def test_kill_9_during_save_leaves_previous_checkpoint(tmp_path, which,
                                                       victim):
    import dtorch
    import dtorch.distributed.checkpoint as dcp
    root, flag = str(tmp_path / "ck"), str(tmp_path / "stalled")
    procs = _start(["kill", root, which, flag],
                   extra={"DTORCH_COLLECTIVE_TIMEOUT": "20"})
    try:
        deadline = time.monotonic() + 120
        while not os.path.exists(flag):
            assert time.monotonic() < deadline, "the rank never stalled"
            assert all(p.poll() is None for p in procs), finish(procs)
            time.sleep(0.05)
        procs[victim].send_signal(signal.SIGKILL)
        procs[victim].wait()
        # the survivor fails (its peer is gone) instead of hanging
        other = procs[1 - victim]
        other.wait(timeout=90)
        assert other.returncode != 0
    finally:
        finish(procs, timeout=5)
    mgr = dcp.CheckpointManager(root)
    assert mgr.steps() == [1]
    assert mgr.latest().endswith("step_00000001")
    assert not os.path.exists(os.path.join(root, "step_00000002"))
    st = {"t": dtorch.zeros(1 << 16), "w": dtorch.zeros(8), "step": 0}
    assert mgr.load(st) == 1
    assert st["t"].numpy().tolist()[:2] == [1.0, 1.0]   # rank 0's, step 1
    assert st["w"].numpy().tolist() == [1.0] * 8
    # the next save clears the dead save's temporary directory
    left = [n for n in os.listdir(root) if n.endswith(".tmp")]
    # a surviving rank 0 removed its own; a killed one could not
    assert len(left) == (1 if victim == 0 else 0), left
    mgr.save({"t": dtorch.ones(2)}, step=3)
    assert [n for n in os.listdir(root) if n.endswith(".tmp")] == []
    assert mgr.steps() == [1, 3]


if __name__ == "__main__":
    if sys.argv[1] == "train":
        _train(*sys.argv[2:5])
    elif sys.argv[1] == "kill":
        _kill_target(*sys.argv[2:5])

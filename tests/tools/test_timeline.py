"""DTORCH_TIMELINE=DIR (issue 19): per-rank Chrome traces of autograd ops,
DDP buckets and collectives, clocks aligned across ranks, merged by
``python -m dtorch.utils.timeline merge``; off means no file and no hook.

Run as a script, this file is one rank of the two-process tcp test:
``test_timeline.py OUTDIR SKEW_NS`` (its clock shifted by SKEW_NS).
"""
import json
import os
import subprocess
import sys

import pytest

_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# tests/ (the shared helpers) and the checkout above it: run as a script
# under an editable install, a rank would otherwise import tests/collectives
# and tests/launch (namespace directories) as the packages of those names
sys.path[:0] = [_TESTS, os.path.dirname(_TESTS)]
from helpers import finish, free_port, tcp_rank_env  # noqa: E402

HERE = os.path.abspath(__file__)
SYMMETRIC = ("all_reduce", "all_reduce_coalesced", "barrier")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))


def _model(nn):
    # four Linear layers, 0.01 MB buckets: several buckets per step
    return nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64),
                         nn.ReLU(), nn.Linear(64, 32), nn.ReLU(),
                         nn.Linear(32, 2))


def _ddp_steps(steps=2):
    """Two DDP steps on this rank; returns (bucket count, param bytes)."""
    import dtorch
    import dtorch.nn as nn
    from dtorch.nn.parallel import DistributedDataParallel as DDP
    dtorch.manual_seed(0)
    m = _model(nn)
    d = DDP(m, bucket_cap_mb=0.01)
    x = dtorch.randn(4, 8)
    for _ in range(steps):
        d(x).sum().backward()
    nbytes = sum(p._data.nbytes for p in m.parameters())
    return len(d._reducer.buckets), nbytes


def _load(path):
    with open(path) as f:
        return json.load(f)       # strict JSON: the file must be complete


def _events(doc, cat=None):
    return [e for e in doc["traceEvents"]
            if e.get("ph") != "M" and (cat is None or e.get("cat") == cat)]


def _check_rank_file(doc, rank, world, nbuckets, nbytes, steps=2):
    info = doc["dtorchTimeline"]
    assert info["rank"] == rank and info["world_size"] == world
    assert all(e["pid"] == rank for e in doc["traceEvents"])
    ops = _events(doc, "op")
    lin = [e for e in ops if e["name"] == "Linear"]
    assert len(lin) == 4 * steps
    assert lin[0]["args"]["shapes"] == [[4, 8], [64, 8], [64]]
    back = {e["name"] for e in _events(doc, "backward")}
    assert {"LinearBackward", "ReluBackward", "SumBackward"} <= back
    coll = _events(doc, "collective")
    ar = [e for e in coll if e["name"] == "all_reduce_coalesced"]
    assert len(ar) == nbuckets * steps
    for e in coll:
        a = e["args"]
        assert a["peers"] == list(range(world)) and a["group"] == "world"
        assert a["seq"] >= 1 and e["dur"] >= 0
    # every step's buckets carry exactly the model's gradient bytes
    assert sum(e["args"]["bytes"] for e in ar) == steps * nbytes
    ddp = _events(doc, "ddp")
    reduce = [e for e in ddp if e["name"] == "allreduce"]
    assert len(reduce) == nbuckets * steps
    assert sum(e["args"]["bytes"] for e in reduce) == steps * nbytes
    assert {e["name"] for e in ddp} >= {"queued", "allreduce",
                                        "DDP wait for buckets"}
    # each bucket has its own row, named
    names = {e["args"]["name"] for e in doc["traceEvents"]
             if e.get("name") == "thread_name"}
    assert {f"DDP bucket {i}" for i in range(nbuckets)} <= names
    # a bucket is reduced after it was queued, on its row
    for e in reduce:
        q = [x for x in ddp if x["name"] == "queued" and x["tid"] == e["tid"]
             and abs(x["ts"] + x["dur"] - e["ts"]) < 1.0]
        assert q, e


def _merge(d, out):
    r = subprocess.run([sys.executable, "-m", "dtorch.utils.timeline",
                        "merge", str(d), "-o", str(out)],
                       capture_output=True, text=True, timeout=120,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr
    return _load(out)


def _check_aligned(merged, world, slack_us):
    """Causality in the merged trace: no rank leaves a blocking collective
    before the last rank entered it (+ the clock error and slack)."""
    by = {}
    for e in _events(merged, "collective"):
        a = e["args"]
        if not a.get("async") and e["name"] in SYMMETRIC:
            by.setdefault((a["group"], a["seq"]), []).append(e)
    full = [evs for evs in by.values() if len(evs) == world]
    assert full
    err = merged["dtorchTimeline"]["clock_error_us"]
    for evs in full:
        last_in = max(e["ts"] for e in evs)
        for e in evs:
            assert e["ts"] + e["dur"] >= last_in - err - slack_us, evs
            a = e["args"]
            assert abs(a["wait_us"] + a["transfer_us"] - e["dur"]) < 0.01
    return len(full)


def test_thread_ranks_ddp_and_merge(tmp_path, monkeypatch):
    import dtorch.distributed as dist
    from dtorch.autograd import function as F
    from dtorch.distributed import _timeline
    from collectives import timeline as T
    monkeypatch.setenv("DTORCH_TIMELINE", str(tmp_path))
    monkeypatch.setattr(T, "FLUSH_EVERY", 7)     # written in many pieces
    hooks = []

    def fn(rank, world):
        out = _ddp_steps()
        hooks.append(F._profile)
        return out

    try:
        res = dist.spawn_threads(fn, 2)
    finally:
        paths = _timeline.close()
    assert all(h is _timeline._recorder for h in hooks)
    assert F._profile is None            # closed: the hook is gone
    assert sorted(os.path.basename(p) for p in paths) == ["rank0.json",
                                                          "rank1.json"]
    nbuckets, nbytes = res[0]
    assert nbuckets >= 3
    for r in range(2):
        _check_rank_file(_load(tmp_path / f"rank{r}.json"), r, 2, nbuckets,
                         nbytes)
    merged = _merge(tmp_path, tmp_path / "all.json")
    assert {e["pid"] for e in merged["traceEvents"]} == {0, 1}
    n = _check_aligned(merged, 2, slack_us=50)
    assert merged["dtorchTimeline"]["collectives_matched"] == n == \
        2 * nbuckets
    assert any(e["name"] == "wait" for e in merged["traceEvents"])


def test_off_means_no_file_and_no_hook(tmp_path, monkeypatch):
    import dtorch.distributed as dist
    from dtorch.autograd import function as F
    monkeypatch.delenv("DTORCH_TIMELINE", raising=False)
    monkeypatch.chdir(tmp_path)
    seen = []

    def fn(rank, world):
        _ddp_steps(1)
        seen.append((F._profile, dist.group.WORLD._timeline))
        return 0

    dist.spawn_threads(fn, 2)
    assert seen == [(None, None), (None, None)]
    assert os.listdir(tmp_path) == []


def test_profiler_inside_a_timeline(tmp_path, monkeypatch):
    """A profile opened while a timeline records: both see the ops, and
    the timeline's hook survives the profile's end."""
    import dtorch
    import dtorch.distributed as dist
    from dtorch.autograd import function as F
    from dtorch.distributed import _timeline
    from dtorch.profiler import profile
    monkeypatch.setenv("DTORCH_TIMELINE", str(tmp_path))
    after = []

    def fn(rank, world):
        x = dtorch.ones(3, requires_grad=True)
        if rank == 0:
            with profile() as p:
                (x * 2).sum().backward()
            after.append(F._profile)
            return [e.name for e in p.events()]
        (x * 2).sum().backward()
        return None

    try:
        names = dist.spawn_threads(fn, 2)[0]
    finally:
        _timeline.close()
    assert "dtorch::Mul" in names and any("MulBackward" in n for n in names)
    assert after == [_timeline._recorder]
    doc = _load(tmp_path / "rank0.json")
    got = {e["name"] for e in _events(doc)}
    assert {"Mul", "Sum", "MulBackward", "SumBackward"} <= got


def test_merge_a_cut_short_file_and_errors(tmp_path):
    from collectives import timeline as T
    d = tmp_path / "tl"
    d.mkdir()
    ev = {"ph": "X", "name": "all_reduce", "cat": "collective", "pid": 0,
          "tid": 1, "ts": 10.0, "dur": 5.0,
          "args": {"group": "world", "seq": 1, "bytes": 4}}
    ev1 = dict(ev, pid=1, ts=12.0, dur=3.0)
    # rank 0 died mid-write: no closing brackets, half an event at the end
    (d / "rank0.json").write_text('{"traceEvents":[\n' + json.dumps(ev)
                                  + ',\n{"ph":"X","na')
    (d / "rank1.json").write_text(json.dumps({"traceEvents": [ev1]}))
    s = T.merge(T.rank_files(str(d)), str(tmp_path / "m.json"))
    assert s["ranks"] == [] and s["collectives_matched"] == 1
    m = _load(tmp_path / "m.json")
    r0 = [e for e in m["traceEvents"] if e["pid"] == 0
          and e["name"] == "all_reduce"][0]
    # rank 0 entered at 10, rank 1 at 12: rank 0 waited 2 us of its 5
    assert r0["args"]["wait_us"] == 2.0 and r0["args"]["transfer_us"] == 3.0
    with pytest.raises(FileNotFoundError, match="no rank"):
        T.merge([], str(tmp_path / "x.json"))
    (d / "rank2.json").write_text("not json")
    with pytest.raises(ValueError, match="rank2.json is not a dtorch"):
        T.merge(T.rank_files(str(d)), str(tmp_path / "y.json"))
    r = subprocess.run([sys.executable, "-m", "dtorch.utils.timeline",
                        "merge", str(tmp_path / "missing")],
                       capture_output=True, text=True, timeout=120,
                       cwd=ROOT)
    assert r.returncode != 0 and "is not a directory" in r.stderr


SKEW_NS = 3_000_000_000     # rank 1's clock runs 3 s ahead of rank 0's


def test_tcp_processes_clock_aligned(tmp_path):
    """Two processes, tcp backend, DDP; rank 1's clock is shifted by 3 s:
    the timeline measures the shift and the merged trace is causal."""
    port, token = free_port(), os.urandom(8).hex()
    procs = [subprocess.Popen(
        [sys.executable, HERE, str(SKEW_NS if r == 1 else 0)],
        env=tcp_rank_env(r, 2, port, token, DTORCH_TIMELINE=str(tmp_path)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=ROOT) for r in range(2)]
    outs = finish(procs)
    for r, (rc, out, err) in enumerate(outs):
        assert rc == 0, f"rank {r} exited {rc}:\n{err[-3000:]}"
    nbuckets, nbytes = json.loads(outs[0][1].strip().splitlines()[-1])
    docs = [_load(tmp_path / f"rank{r}.json") for r in range(2)]
    for r in range(2):
        _check_rank_file(docs[r], r, 2, nbuckets, nbytes)
    info = docs[1]["dtorchTimeline"]
    assert info["clock_synced"]
    # the measured offset is the injected shift, within the sync's error
    # bound (half a loopback round trip) plus a loaded machine's margin
    off_err = abs(info["clock_offset_us"] - SKEW_NS / 1e3)
    assert off_err <= info["clock_error_us"] + 1000, info
    assert info["clock_error_us"] < 100_000
    merged = _merge(tmp_path, tmp_path / "merged.json")
    _check_aligned(merged, 2, slack_us=200)
    # both ranks' first events lie within one run, not 3 s apart
    starts = [min(e["ts"] for e in _events(d)) for d in docs]
    assert abs(starts[0] - starts[1]) < 2e6


def _rank_main(skew_ns):
    import time
    real = time.perf_counter_ns
    if skew_ns:
        # this rank's clock runs ahead (before dtorch binds the function)
        time.perf_counter_ns = lambda: real() + skew_ns
    sys.path.insert(0, ROOT)
    import dtorch.distributed as dist
    dist.init_process_group("tcp")
    try:
        out = _ddp_steps()
    finally:
        dist.destroy_process_group()
    print(json.dumps(list(out)))


if __name__ == "__main__":
    _rank_main(int(sys.argv[1]))

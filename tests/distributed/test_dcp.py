"""dtorch.distributed.checkpoint: round trips of a whole training state,
what each rank writes, async_save's snapshot, atomicity and keep-last,
and bad input (missing shard, checksum mismatch, truncated file, shapes
that differ: a clear error naming the file and tensor, nothing loaded).
Ranks are threads here (spawn_threads); test_dcp_kill.py runs real
processes, test_dcp_mpi.py runs under mpiexec."""
import json
import os
import threading

import numpy as np
import pytest

import dtorch
import dtorch.distributed as dist
import dtorch.distributed.checkpoint as dcp
from dtorch import nn
from dtorch.distributed.checkpoint.state_dict import (
    StateDictOptions, get_state_dict, set_state_dict)
from dtorch.nn.parallel import DistributedDataParallel as DDP
from dtorch.utils.data import DataLoader, DistributedSampler, TensorDataset
from helpers import train_steps

if "OMPI_COMM_WORLD_SIZE" in os.environ or "PMI_SIZE" in os.environ:
    pytest.skip("single-process tests; not run under mpiexec",
                allow_module_level=True)

F64 = dtorch.float64


def arr(t):
    return np.array(t.detach().cpu().numpy(), copy=True)


def make(seed=0, p=0.0):
    dtorch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(5, 7), nn.Dropout(p), nn.Tanh(),
                      nn.Linear(7, 3)).to(F64)
    opt = dtorch.optim.AdamW(m.parameters(), lr=0.05)
    sched = dtorch.optim.lr_scheduler.StepLR(opt, 2, gamma=0.5)
    return m, opt, sched


def train(m, opt, sched, steps, seed=1):
    g = dtorch.Generator().manual_seed(seed)
    train_steps(opt, lambda: m(dtorch.randn(4, 5, generator=g, dtype=F64))
                .pow(2).mean(), steps, sched)


def state(m, opt, sched, **extra):
    msd, osd = get_state_dict(m, opt)
    return dict(model=msd, optim=osd, sched=sched, **extra)


def restore(m, opt, st):
    set_state_dict(m, opt, model_state_dict=st["model"],
                   optim_state_dict=st["optim"])


def snapshot(m, opt):
    out = {k: arr(v) for k, v in m.state_dict().items()}
    for i, st in opt.state_dict()["state"].items():
        for k, v in st.items():
            out[f"opt.{i}.{k}"] = arr(v)
    return out


def same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert a[k].tobytes() == b[k].tobytes(), k


# ------------------------------------------------------------ round trip --

def test_round_trip_training_state_single_process(tmp_path):
    m, opt, sched = make()
    train(m, opt, sched, 3)
    dtorch.manual_seed(42)
    st = state(m, opt, sched, step=3, rng=dcp.RNGState(), note="x",
               inf=float("inf"))
    dcp.save(st, checkpoint_id=tmp_path / "c")
    want, want_rng = snapshot(m, opt), dtorch.get_rng_state()
    want_sched = sched.state_dict()
    draw = dtorch.rand(3)

    m2, opt2, sched2 = make(seed=5)
    dtorch.manual_seed(7)
    st2 = state(m2, opt2, sched2, step=0, rng=dcp.RNGState(), note="",
                inf=0.0)
    meta = dcp.load(st2, checkpoint_id=tmp_path / "c")
    restore(m2, opt2, st2)
    same(snapshot(m2, opt2), want)
    assert sched2.state_dict() == want_sched
    assert st2["step"] == 3 and st2["note"] == "x" and st2["inf"] == \
        float("inf")
    assert dtorch.get_rng_state() == want_rng
    assert dtorch.equal(dtorch.rand(3), draw)
    assert meta.step == 3 and meta.world_size == 1
    # then training continues identically
    train(m, opt, sched, 2, seed=3)
    train(m2, opt2, sched2, 2, seed=3)
    same(snapshot(m2, opt2), snapshot(m, opt))


def test_files_are_safetensors_named_by_key(tmp_path):
    safetensors = pytest.importorskip("safetensors.numpy")
    m, opt, sched = make()
    train(m, opt, sched, 1)
    dcp.save(state(m, opt, sched), checkpoint_id=tmp_path / "c")
    assert sorted(os.listdir(tmp_path / "c")) == [".metadata",
                                                 "__0_0.safetensors"]
    got = safetensors.load_file(str(tmp_path / "c" / "__0_0.safetensors"))
    assert np.array_equal(got["model.0.weight"], arr(m[0].weight))
    assert np.array_equal(got["optim.state.3.bias.exp_avg"],
                          arr(opt.state[m[3].bias]["exp_avg"]))
    meta = json.loads((tmp_path / "c" / ".metadata").read_text())
    e = meta["state_dict_metadata"]["model.0.weight"]
    assert e["size"] == [7, 5] and e["dtype"] == "F64"
    assert e["chunks"][0]["file"] == "__0_0.safetensors"
    assert meta["files"]["__0_0.safetensors"]["size"] == os.path.getsize(
        tmp_path / "c" / "__0_0.safetensors")
    assert meta["world_size"] == 1


def test_fresh_optimizer_is_filled_in_place(tmp_path):
    """A never-stepped optimizer is the template: its state is created
    (lr 0: the parameters do not move) and then overwritten."""
    m, opt, sched = make()
    train(m, opt, sched, 2)
    dcp.save(state(m, opt, sched), checkpoint_id=tmp_path / "c")
    m2, opt2, sched2 = make(seed=3)
    before = snapshot(m2, opt2)
    st = state(m2, opt2, sched2)
    same({k: v for k, v in snapshot(m2, opt2).items()
          if not k.startswith("opt.")}, before)
    dcp.load(st, checkpoint_id=tmp_path / "c")
    restore(m2, opt2, st)
    same(snapshot(m2, opt2), snapshot(m, opt))


# ---------------------------------------------------- who writes what --

def test_replicated_written_once_per_rank_values_kept(tmp_path):
    path = str(tmp_path / "c")

    def body(rank, world):
        w = dtorch.arange(12.0).reshape(3, 4)          # equal everywhere
        own = dtorch.full((2,), float(rank))          # differs by rank
        st = {"w": w, "own": own, "rank": rank, "epoch": 4}
        dcp.save(st, checkpoint_id=path)
        st2 = {"w": dtorch.zeros(3, 4), "own": dtorch.zeros(2),
               "rank": -1, "epoch": 0}
        dcp.load(st2, checkpoint_id=path)
        return arr(st2["w"]), arr(st2["own"]), st2["rank"], st2["epoch"]

    res = dist.spawn_threads(body, 3, timeout=60)
    for r, (w, own, rank, epoch) in enumerate(res):
        assert np.array_equal(w, np.arange(12.0).reshape(3, 4))
        assert np.array_equal(own, [r, r]) and rank == r and epoch == 4
    meta = json.loads(open(os.path.join(path, ".metadata")).read())
    sdm = meta["state_dict_metadata"]
    assert [c["file"] for c in sdm["w"]["chunks"]] == ["__0_0.safetensors"]
    assert sorted(sdm["own"]["per_rank"]) == ["0", "1", "2"]
    assert sdm["epoch"] == {"type": "object", "value": "4"}
    assert sorted(sdm["rank"]["per_rank"]) == ["0", "1", "2"]
    assert meta["layout"]["per_rank"] == ["own"]
    sizes = {f: os.path.getsize(os.path.join(path, f))
             for f in os.listdir(path) if f.endswith(".safetensors")}
    # rank 0 holds w (48 bytes) and its own; ranks 1, 2 only their own
    assert sizes["__0_0.safetensors"] > sizes["__1_0.safetensors"] == \
        sizes["__2_0.safetensors"]


def test_ddp_model_state_is_written_by_rank_zero_only(tmp_path):
    path = str(tmp_path / "c")

    def body(rank, world):
        dtorch.manual_seed(0)
        m = DDP(nn.Linear(6, 4).to(F64))
        opt = dtorch.optim.Adam(m.parameters(), lr=0.1)
        x = dtorch.randn(2, 6, dtype=F64) + rank
        opt.zero_grad()
        m(x).sum().backward()
        opt.step()
        msd, osd = get_state_dict(m, opt)
        assert set(msd) == {"weight", "bias"}       # no "module." prefix
        assert set(osd["state"]) == {"weight", "bias"}
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=path)
        return True

    assert all(dist.spawn_threads(body, 2, timeout=60))
    assert sorted(os.listdir(path)) == [".metadata", "__0_0.safetensors"]


# ----------------------------------------------------------- async_save --

def test_async_save_writes_the_state_at_call_time(tmp_path):
    m, opt, sched = make()
    train(m, opt, sched, 1)
    want = snapshot(m, opt)
    fut = dcp.async_save(state(m, opt, sched), checkpoint_id=tmp_path / "a")
    train(m, opt, sched, 2)          # changes the state right after
    assert fut.result(timeout=60) == str(tmp_path / "a")
    m2, opt2, sched2 = make(seed=9)
    st = state(m2, opt2, sched2)
    dcp.load(st, checkpoint_id=tmp_path / "a")
    restore(m2, opt2, st)
    same(snapshot(m2, opt2), want)


def test_async_save_on_ranks_in_order_and_error_in_future(tmp_path):
    root = str(tmp_path)

    def body(rank, world):
        t = dtorch.zeros(4) + rank
        futs = []
        for i in range(3):
            t += 10
            futs.append(dcp.async_save({"t": t, "i": i},
                                       checkpoint_id=f"{root}/s{i}"))
        # a sync save waits for the queued async ones
        dcp.save({"t": t}, checkpoint_id=f"{root}/sync")
        assert all(f.done() for f in futs)
        bad = dcp.async_save({"x": object()} if rank == 1 else {"x": 1},
                             checkpoint_id=f"{root}/bad")
        with pytest.raises(dcp.CheckpointException, match="rank 1"):
            bad.result(timeout=60)
        out = []
        for i in range(3):
            st = {"t": dtorch.zeros(4), "i": -1}
            dcp.load(st, checkpoint_id=f"{root}/s{i}")
            out.append((arr(st["t"])[0], st["i"]))
        return out

    res = dist.spawn_threads(body, 2, timeout=60)
    for r, out in enumerate(res):
        assert out == [(r + 10.0 * (i + 1), i) for i in range(3)]
    assert not os.path.exists(os.path.join(root, "bad"))
    assert [n for n in os.listdir(root) if n.endswith(".tmp")] == []


# ----------------------------------------------- atomic, latest, keep K --

def test_failed_save_leaves_previous_checkpoint(tmp_path):
    path = str(tmp_path / "c")

    def body(rank, world):
        dcp.save({"t": dtorch.ones(3), "v": 1}, checkpoint_id=path)
        bad = {"t": dtorch.zeros(3), "v": 2}
        if rank == 1:
            bad["x"] = {1, 2}            # a set: no JSON encoding
        with pytest.raises(dcp.CheckpointException, match="rank 1.*set"):
            dcp.save(bad, checkpoint_id=path)
        st = {"t": dtorch.zeros(3), "v": 0}
        dcp.load(st, checkpoint_id=path)
        return arr(st["t"]).tolist(), st["v"]

    assert dist.spawn_threads(body, 2, timeout=60) == [([1.0] * 3, 1)] * 2
    assert sorted(os.listdir(tmp_path)) == ["c"]


def test_overwrite_same_checkpoint_id(tmp_path):
    for v in (1.0, 2.0):
        dcp.save({"t": dtorch.full((2,), v)}, checkpoint_id=tmp_path / "c")
    st = {"t": dtorch.zeros(2)}
    dcp.load(st, checkpoint_id=tmp_path / "c")
    assert arr(st["t"]).tolist() == [2.0, 2.0]
    assert sorted(os.listdir(tmp_path)) == ["c"]


def test_manager_keep_last_and_latest(tmp_path):
    mgr = dcp.CheckpointManager(tmp_path / "ck", keep_last=2)
    assert mgr.latest() is None
    assert mgr.load({"t": dtorch.zeros(1)}) is None
    for step in (1, 2, 3):
        mgr.save({"t": dtorch.full((1,), float(step)), "step": step},
                 step=step)
    mgr.async_save({"t": dtorch.full((1,), 4.0), "step": 4},
                   step=4).result(timeout=60)
    assert mgr.steps() == [3, 4]
    assert (tmp_path / "ck" / "latest").read_text().strip() == \
        "step_00000004"
    st = {"t": dtorch.zeros(1), "step": 0}
    assert mgr.load(st) == 4 and st["step"] == 4
    # dcp.load of the folder resolves `latest`; a bad pointer falls back
    st = {"t": dtorch.zeros(1)}
    dcp.load(st, checkpoint_id=tmp_path / "ck")
    assert arr(st["t"]).tolist() == [4.0]
    (tmp_path / "ck" / "latest").write_text("step_00000099\n")
    assert dcp.latest_checkpoint(tmp_path / "ck").endswith("step_00000004")
    assert mgr.load(st, step=3) == 3 and arr(st["t"]).tolist() == [3.0]
    with pytest.raises(ValueError, match="keep_last"):
        dcp.CheckpointManager(tmp_path, keep_last=0)


def test_stale_temporary_directory_of_a_dead_save_is_removed(tmp_path):
    import subprocess
    import sys
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()                                    # a pid that is gone
    from dtorch.distributed.checkpoint._files import _host_tag
    stale = tmp_path / f".c.dcp-{_host_tag()}-{p.pid}-0badf00d.tmp"
    stale.mkdir()
    (stale / "__0_0.safetensors").write_bytes(b"partial")
    live = tmp_path / f".c.dcp-{_host_tag()}-{os.getpid()}-00000000.tmp"
    live.mkdir()
    dcp.save({"t": dtorch.ones(1)}, checkpoint_id=tmp_path / "d")
    assert not stale.exists() and live.exists()


# ------------------------------------------------------------ bad input --

def _saved(tmp_path, world=1):
    path = str(tmp_path / "c")

    def body(rank, n):
        dcp.save({"a": dtorch.arange(6.0).reshape(2, 3) + rank,
                  "b": dtorch.ones(4), "n": 1}, checkpoint_id=path)
    dist.spawn_threads(body, world, timeout=60)
    return path


def _load_fails(path, world, match, template=None):
    """Every rank raises, naming the problem; nothing is changed."""
    def body(rank, n):
        st = template() if template else {
            "a": dtorch.full((2, 3), -1.0), "b": dtorch.full((4,), -1.0),
            "n": -1}
        with pytest.raises(dcp.CheckpointException) as e:
            dcp.load(st, checkpoint_id=path)
        assert all((v == -1).all().item() if isinstance(v, dtorch.Tensor)
                   else v == -1 for v in st.values()), st
        return str(e.value)
    msgs = dist.spawn_threads(body, world, timeout=60)
    for m in msgs:
        assert all(s in m for s in match), m
    return msgs


def test_missing_shard_file(tmp_path):
    path = _saved(tmp_path, 2)
    os.remove(os.path.join(path, "__1_0.safetensors"))
    msgs = _load_fails(path, 2, ["missing shard file",
                                 "__1_0.safetensors", "'a'",
                                 "nothing was loaded"])
    # rank 0 could read its file but loaded nothing either
    assert "rank 1" in msgs[0]


def test_checksum_mismatch_names_file_and_tensor(tmp_path):
    path = _saved(tmp_path)
    f = os.path.join(path, "__0_0.safetensors")
    raw = bytearray(open(f, "rb").read())
    raw[-3] ^= 0x40                       # inside the last tensor's data
    open(f, "wb").write(bytes(raw))
    _load_fails(path, 1, ["__0_0.safetensors", "checksum mismatch"])


def test_truncated_shard_file(tmp_path):
    path = _saved(tmp_path)
    f = os.path.join(path, "__0_0.safetensors")
    os.truncate(f, os.path.getsize(f) - 5)
    _load_fails(path, 1, ["__0_0.safetensors", "truncated", "'a'"])


def test_shape_differs_from_the_model(tmp_path):
    path = _saved(tmp_path)
    _load_fails(path, 1, ["size mismatch for 'a'", "[2, 3]", "[3, 2]"],
                template=lambda: {"a": dtorch.full((3, 2), -1.0),
                                  "b": dtorch.full((4,), -1.0), "n": -1})


def test_missing_key_and_corrupt_metadata(tmp_path):
    path = _saved(tmp_path)
    _load_fails(path, 1, ["missing key 'c'"], template=lambda: {
        "a": dtorch.full((2, 3), -1.0), "c": dtorch.full((1,), -1.0)})
    meta = os.path.join(path, ".metadata")
    text = open(meta).read()
    open(meta, "w").write(text.replace('"world_size": 1',
                                       '"world_size": 2'))
    _load_fails(path, 1, [".metadata", "checksum"])
    open(meta, "w").write(text[:len(text) // 2])
    _load_fails(path, 1, [".metadata", "corrupt"])
    os.remove(meta)
    _load_fails(path, 1, ["no distributed checkpoint"])


def test_file_from_another_checkpoint_is_refused(tmp_path):
    a = _saved(tmp_path)
    b = str(tmp_path / "other")
    dcp.save({"a": dtorch.zeros(2, 3), "b": dtorch.zeros(4), "n": 1},
             checkpoint_id=b)
    os.replace(os.path.join(b, "__0_0.safetensors"),
               os.path.join(a, "__0_0.safetensors"))
    _load_fails(a, 1, ["__0_0.safetensors", "checksum mismatch",
                       "another checkpoint"])


def test_module_and_full_state_dict_options(tmp_path):
    m, opt, sched = make()
    dcp.save({"model": m}, checkpoint_id=tmp_path / "c")   # a Stateful
    m2, _, _ = make(seed=4)
    dcp.load({"model": m2}, checkpoint_id=tmp_path / "c")
    same(snapshot(m2, dtorch.optim.SGD(m2.parameters(), lr=1)),
         snapshot(m, dtorch.optim.SGD(m.parameters(), lr=1)))
    msd, _ = get_state_dict(m, opt, options=StateDictOptions(
        full_state_dict=True, ignore_frozen_params=True))
    assert set(msd) == set(m.state_dict())


def test_threads_do_not_leak(tmp_path):
    before = threading.active_count()
    dcp.async_save({"t": dtorch.ones(2)},
                   checkpoint_id=tmp_path / "c").result(timeout=60)
    for _ in range(50):
        if threading.active_count() <= before:
            break
        threading.Event().wait(0.05)
    assert threading.active_count() <= before


# ------------------------------------------------ exact resume, 2 ranks --

def _net():
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3)).to(F64)


# made once: rank threads share the default generator, so they must not
# draw from it (the order of their draws is the scheduler's)
dtorch.manual_seed(0)
_DATA = (dtorch.randn(40, 5, dtype=F64), dtorch.randn(40, 3, dtype=F64),
         dtorch.arange(40))
_INIT = _net().state_dict()


def _dp_run(path, steps_before, steps_after, rank, world, mode):
    """DDP float64 on a DistributedSampler; returns the final state and
    the sample indices seen after the split point."""
    ds = TensorDataset(*_DATA)
    sampler = DistributedSampler(ds, shuffle=True, seed=3)
    loader_g = dtorch.Generator().manual_seed(3)
    loader = DataLoader(ds, batch_size=4, sampler=sampler,
                        generator=loader_g)
    net = _net()
    net.load_state_dict(_INIT)
    model = DDP(net)
    opt = dtorch.optim.Adam(model.parameters(), lr=0.01)
    sched = dtorch.optim.lr_scheduler.StepLR(opt, 3, gamma=0.5)
    msd, osd = get_state_dict(model, opt)
    st = {"model": msd, "optim": osd, "sched": sched, "sampler": sampler,
          "rng": dcp.RNGState(loader_g), "step": 0}
    seen, step = [], 0
    if mode == "resume":
        dcp.load(st, checkpoint_id=path)
        set_state_dict(model, opt, model_state_dict=msd,
                       optim_state_dict=osd)
        step = st["step"]
    total = steps_before + steps_after
    epoch = sampler.epoch
    while step < total:
        for x, y, idx in loader:
            if step >= steps_before:
                seen.append(arr(idx).tolist())
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            sched.step()
            step += 1
            if mode == "save" and step == steps_before:
                msd, osd = get_state_dict(model, opt)
                st.update(model=msd, optim=osd, step=step)
                dcp.save(st, checkpoint_id=path)
                return None
            if step == total:
                break
        else:
            epoch += 1
            sampler.set_epoch(epoch)
    return snapshot(model.module, opt), seen


def test_exact_resume_in_process_two_ranks(tmp_path):
    """10 steps == 5 + save + fresh objects + load + 5, bitwise (float64,
    DDP, sampler mid-epoch, scheduler, loader RNG)."""
    path = str(tmp_path / "c")
    full = dist.spawn_threads(
        lambda r, w: _dp_run(path, 5, 5, r, w, "full"), 2, timeout=120)
    dist.spawn_threads(lambda r, w: _dp_run(path, 5, 5, r, w, "save"), 2,
                       timeout=120)
    resumed = dist.spawn_threads(
        lambda r, w: _dp_run(path, 5, 5, r, w, "resume"), 2, timeout=120)
    for r in range(2):
        same(resumed[r][0], full[r][0])
        assert resumed[r][1] == full[r][1] and len(full[r][1]) == 5


# ---------------------------------------------------------------- devices --

def test_device_round_trip_and_async_snapshot(tmp_path, device):
    """Tensors on the device are saved from host copies (async_save's
    snapshot too) and loaded back onto the device, bitwise."""
    m, opt, sched = make()
    m.to(device)
    opt = dtorch.optim.Adam(m.parameters(), lr=0.1)
    x = dtorch.randn(3, 5, dtype=F64).to(device)
    opt.zero_grad()
    m(x).sum().backward()
    opt.step()
    want = snapshot(m, opt)
    fut = dcp.async_save(state(m, opt, sched), checkpoint_id=tmp_path / "a")
    with dtorch.no_grad():
        for p in m.parameters():
            p.add_(1.0)                    # after the call: not saved
    fut.result(timeout=60)
    m2, _, sched2 = make(seed=4)
    m2.to(device)
    opt2 = dtorch.optim.Adam(m2.parameters(), lr=0.1)
    st = state(m2, opt2, sched2)
    dcp.load(st, checkpoint_id=tmp_path / "a")
    restore(m2, opt2, st)
    assert all(p.device.type == dtorch.device(device).type
               for p in m2.parameters())
    same(snapshot(m2, opt2), want)


def test_async_save_staging_cache_reuses_buffers_safely(tmp_path):
    """cache_staged_state_dict: the second snapshot goes into the first
    one's buffers once that save is done, and every checkpoint still holds
    the values of its own call."""
    from dtorch.distributed.checkpoint import _groups
    t = dtorch.zeros(1000)
    saved = []
    for i in range(3):
        t.fill_(float(i))
        w = dcp.FileSystemWriter(tmp_path / f"c{i}",
                                 cache_staged_state_dict=True)
        f = dcp.async_save({"t": t}, storage_writer=w)
        if i == 1:
            t.fill_(-1.0)             # right after the call: not saved
        f.result(timeout=60)
        saved.append(_groups._staging[_groups._key(None)]["t"])
    # one buffer, reused (the saves did not overlap)
    assert saved[0] is saved[1] is saved[2] and saved[2][0] == 2.0
    for i in range(3):
        st = {"t": dtorch.zeros(1000)}
        dcp.load(st, checkpoint_id=tmp_path / f"c{i}")
        assert (st["t"] == i).all().item()

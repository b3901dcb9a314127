"""dcp.save / dcp.load throughput next to raw numpy.tofile / fromfile of
the same bytes on the same disk in the same run, and async_save's stall
on a training step.

Throughput: a state of ``--gb`` GB (float32 tensors of 64 MiB or less)
split over the ranks as shards (each rank owns 1/world of it, as tensor
parallel or ZeRO shards), so every rank writes its own part. Per repeat,
in alternating order: raw = every rank ``tofile`` + fsync of its arrays
(then ``readinto`` of existing arrays, and ``fromfile``); dcp =
``dcp.save`` (checksums, safetensors, fsync, metadata, the directory
rename) then ``dcp.load`` into existing tensors (checksums verified).
Both again without fsync (``FileSystemWriter(sync_files=False)``).
Times run from a barrier to the last rank's end. Reads hit the page
cache for raw and dcp alike (the cache is not dropped: this machine is
shared). Each rate is given as min..max (median) over the repeats, and
each ratio over the runs' own pairs.

Stall: an MLP whose parameters plus Adam's two moments are about
``--gb`` GB trains on one rank; the time of a step that calls
``dcp.async_save`` first is compared with plain steps, and so are the
steps that run while the background thread writes.

    python benchmarks/checkpoint.py [--gb 1.0] [--repeats 3] [--ranks 1 2]
        [--dir DIR] [--out benchmarks/results/checkpoint.json]
"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                ".."))
import dtorch  # noqa: E402
import dtorch.distributed as dist  # noqa: E402
import dtorch.distributed.checkpoint as dcp  # noqa: E402

MIB = 1 << 20


def _state(gb, world, rank):
    """This rank's shards: float32 tensors of at most 64 MiB each."""
    total = int(gb * (1 << 30)) // 4
    per = 16 * MIB                      # elements (64 MiB) per tensor
    sizes = [per] * (total // per) + ([total % per] if total % per else [])
    out = {}
    g = np.random.default_rng(rank)
    for i, n in enumerate(sizes):
        rows = n // world // 1024 * world * 1024 or world
        k = rows // world
        part = g.standard_normal(k, dtype=np.float32)
        out[f"layer{i}.weight"] = dcp.shard_of(dtorch.from_numpy(part),
                                               (rows,), (rank * k,))
    return out


def _sync_time(fn):
    """Seconds from a barrier to the end of the slowest rank."""
    dist.barrier() if dist.is_initialized() else None
    t = time.perf_counter()
    fn()
    if dist.is_initialized():
        dist.barrier()
    return time.perf_counter() - t


def _raw_write(folder, arrays, sync=True):
    os.makedirs(folder, exist_ok=True)
    for name, a in arrays.items():
        path = os.path.join(folder, name)
        with open(path, "wb") as fh:
            a.tofile(fh)
            fh.flush()
            if sync:
                os.fsync(fh.fileno())


def _raw_fromfile(folder, arrays):
    return {n: np.fromfile(os.path.join(folder, n), dtype=a.dtype)
            for n, a in arrays.items()}


def _raw_readinto(folder, out):
    """Into existing arrays, as dcp.load fills existing tensors."""
    for n, a in out.items():
        with open(os.path.join(folder, n), "rb", buffering=0) as fh:
            fh.readinto(memoryview(a).cast("B"))


def throughput(gb, repeats, root):
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    st = _state(gb, world, rank)
    arrays = {k: v.numpy() for k, v in st.items()}
    nbytes = sum(a.nbytes for a in arrays.values()) * world
    res = {"raw_write": [], "raw_read": [], "raw_fromfile": [],
           "dcp_save": [], "dcp_load": [], "raw_write_nosync": [],
           "dcp_save_nosync": []}
    out = {k: np.empty_like(a) for k, a in arrays.items()}
    target = {k: dcp.shard_of(dtorch.zeros(v.shape), v._dcp_shard[0],
                              v._dcp_shard[1]) for k, v in st.items()}
    for i in range(repeats):
        raw_dir = os.path.join(root, f"raw{i}", str(rank))
        ck = os.path.join(root, f"ck{i}")
        order = ["raw", "dcp"] if i % 2 == 0 else ["dcp", "raw"]
        for what in order:
            if what == "raw":
                res["raw_write_nosync"].append(_sync_time(
                    lambda: _raw_write(raw_dir + "n", arrays, False)))
                res["raw_write"].append(_sync_time(
                    lambda: _raw_write(raw_dir, arrays)))
                res["raw_read"].append(_sync_time(
                    lambda: _raw_readinto(raw_dir, out)))
                res["raw_fromfile"].append(_sync_time(
                    lambda: _raw_fromfile(raw_dir, arrays)))
            else:
                res["dcp_save_nosync"].append(_sync_time(
                    lambda: dcp.save(st, storage_writer=dcp.FileSystemWriter(
                        ck + "n", sync_files=False))))
                res["dcp_save"].append(_sync_time(
                    lambda: dcp.save(st, checkpoint_id=ck)))
                res["dcp_load"].append(_sync_time(
                    lambda: dcp.load(target, checkpoint_id=ck)))
        assert all(np.array_equal(target[k].numpy(), arrays[k])
                   for k in arrays)
        if dist.is_initialized():
            dist.barrier()
        if rank == 0:
            shutil.rmtree(ck, ignore_errors=True)
            shutil.rmtree(ck + "n", ignore_errors=True)
            shutil.rmtree(os.path.join(root, f"raw{i}"), ignore_errors=True)
    gbs = {k: [nbytes / t / 1e9 for t in v] for k, v in res.items()}
    return {"world": world, "bytes": nbytes, "seconds": res, "GB/s": gbs}


def stall(gb, steps, root):
    """Step times: plain, the step calling async_save, the steps during
    the background write."""
    from dtorch import nn
    # parameters x 3 (Adam's moments) ~ gb; square layers of width w
    width = 2048
    layers = max(1, int(gb * (1 << 30) / 4 / 3 / (width * width)))
    dtorch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(layers)
                            for m in (nn.Linear(width, width), nn.Tanh())])
    opt = dtorch.optim.Adam(model.parameters(), lr=1e-4)
    x = dtorch.randn(256, width)

    def step():
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()

    from dtorch.distributed.checkpoint.state_dict import get_state_dict
    for _ in range(2):
        step()
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd}
    state_bytes = sum(a.numel() * a.element_size()
                      for a in list(msd.values()) + [
                          v for s in osd["state"].values()
                          for v in s.values()])
    out = {"state_bytes": state_bytes, "layers": layers, "width": width}
    for cache in (False, True):
        plain, trigger, during, call = [], [], [], []
        for i in range(steps + cache):      # (the first fills the cache)
            t = time.perf_counter()
            step()
            plain.append(time.perf_counter() - t)
            t = time.perf_counter()
            fut = dcp.async_save(state, storage_writer=dcp.FileSystemWriter(
                os.path.join(root, f"a{i}"),
                cache_staged_state_dict=cache))
            call.append(time.perf_counter() - t)
            step()
            trigger.append(time.perf_counter() - t)
            while not fut.done():
                t = time.perf_counter()
                step()
                during.append(time.perf_counter() - t)
            fut.result()
            shutil.rmtree(os.path.join(root, f"a{i}"), ignore_errors=True)
        if cache:
            call, trigger = call[1:], trigger[1:]
        out["cached" if cache else "fresh"] = {
            "plain_step_s": plain, "async_save_call_s": call,
            "trigger_step_s": trigger, "steps_during_write_s": during}
    return out


def _rng(v):
    """min..max (median)"""
    m = sorted(v)[len(v) // 2]
    return f"{min(v):.2f}..{max(v):.2f} (median {m:.2f})"


def _ratio(a, b):
    return _rng([x / y for x, y in zip(a, b)])


def _worker(args):
    dist.init_process_group("tcp")
    out = throughput(args.gb, args.repeats, args.dir)
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(out), flush=True)
    dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(world, args):
    port, token = _free_port(), os.urandom(8).hex()
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world),
                   LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(world),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   DTORCH_RDZV_TOKEN=token, OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker",
             "--gb", str(args.gb), "--repeats", str(args.repeats),
             "--dir", args.dir], env=env, stdout=subprocess.PIPE,
            text=True))
    outs = [p.communicate()[0] for p in procs]
    for p in procs:
        if p.returncode:
            raise SystemExit(f"a worker exited {p.returncode}")
    line = [ln for ln in outs[0].splitlines() if ln.startswith("RESULT ")]
    return json.loads(line[-1][len("RESULT "):])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ranks", type=int, nargs="*", default=[1, 2],
                    help="world sizes of the throughput runs (none: only "
                         "the stall)")
    ap.add_argument("--stall-steps", type=int, default=3)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--worker", action="store_true")
    args = ap.parse_args()
    if args.worker:
        return _worker(args)
    own = args.dir is None
    args.dir = args.dir or tempfile.mkdtemp(prefix="dcp-bench-",
                                            dir=os.getcwd())
    report = {"gb": args.gb, "repeats": args.repeats, "runs": []}
    try:
        for world in args.ranks:
            r = throughput(args.gb, args.repeats, args.dir) if world == 1 \
                else _spawn(world, args)
            report["runs"].append(r)
            g = r["GB/s"]
            print(f"{world} rank(s), {r['bytes'] / 1e9:.2f} GB, GB/s over "
                  f"{args.repeats} runs, min..max (median); ratio = dcp / "
                  f"raw of the same run:\n"
                  f"  save, fsync: dcp {_rng(g['dcp_save'])}  raw tofile "
                  f"{_rng(g['raw_write'])}  ratio "
                  f"{_ratio(g['dcp_save'], g['raw_write'])}\n"
                  f"  save, no fsync: dcp {_rng(g['dcp_save_nosync'])}  raw "
                  f"{_rng(g['raw_write_nosync'])}  ratio "
                  f"{_ratio(g['dcp_save_nosync'], g['raw_write_nosync'])}\n"
                  f"  load: dcp {_rng(g['dcp_load'])}  raw readinto "
                  f"{_rng(g['raw_read'])} (fromfile "
                  f"{_rng(g['raw_fromfile'])})  ratio "
                  f"{_ratio(g['dcp_load'], g['raw_read'])}", flush=True)
        if args.stall_steps:
            s0 = stall(args.gb, args.stall_steps, args.dir)
            report["stall"] = s0
            print(f"async_save stall, state {s0['state_bytes'] / 1e9:.2f} "
                  f"GB ({s0['layers']} x Linear({s0['width']}) + Adam):",
                  flush=True)
            for kind in ("fresh", "cached"):
                s = s0[kind]
                base = sorted(s["plain_step_s"])[len(s["plain_step_s"]) // 2]
                slow = [t / base * 100 - 100 for t in s["trigger_step_s"]]
                print(f"  {kind} staging buffers: plain step "
                      f"{_rng(s['plain_step_s'])} s; the step calling "
                      f"async_save {_rng(s['trigger_step_s'])} s (slower by "
                      f"{_rng(slow)} %; the call itself "
                      f"{_rng(s['async_save_call_s'])} s); steps while it "
                      f"writes {_rng(s['steps_during_write_s'] or [0])} s",
                      flush=True)
    finally:
        if own:
            shutil.rmtree(args.dir, ignore_errors=True)
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as fh:
            json.dump(report, fh, indent=1)


if __name__ == "__main__":
    main()

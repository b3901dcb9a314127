"""An alpha-beta model of a DDP step, calibrated from the timeline, checked
on two namespace "nodes", and projected to 8-1024 nodes.

The model (one rank per node, weak scaling: a fixed batch per rank). From a
rank's DTORCH_TIMELINE trace: forward time F, backward time B (from
loss.backward() to DDP's end-of-backward callback), the optimizer and the
rest of the step O, and for each DDP bucket b its bytes S_b and the moment
r_b (after the start of backward) its last gradient was ready. The link: a
per-message latency alpha and a time per byte beta, fitted to a ping-pong
sweep. An all-reduce of S bytes over p ranks costs the cheaper of a ring,
2(p-1) alpha + 2 (p-1)/p S beta', and recursive halving/doubling
(Rabenseifner), 2 log2(p) alpha + 2 (p-1)/p S beta', where beta' = beta +
gamma adds what the implementation spends per byte beyond the wire (packing,
reducing): gamma is fitted from a 2-rank all-reduce sweep on the same link.
Buckets are reduced one after another on DDP's communication thread, each
starting when it is ready and the previous one is done:

    e_b = max(r_b, e_{b-1}) + T_allreduce(S_b, p)
    T_step(p) = F + max(B, e_last) + O,       efficiency = T_step(1) / T_step(p)

Commands:
    rank  --workload gpt|cnn   one rank of a run (launcher environment; with
                               DTORCH_TIMELINE its trace): prints JSON
    sweep                      one rank of a ping-pong + all-reduce sweep
    validate --out DIR         root: for each --rates, two namespace nodes
                               (slurm/netns-nodes.sh via tests/netns_nodes.py)
                               with the link shaped by tc; the sweep, both
                               workloads on 2 nodes, and on 1 rank alone;
                               writes DIR/validate.json
    report --out DIR           the prediction-vs-measurement table, the
                               projection to 8-1024 nodes and DIR/scaling_model.png

The GPT and CNN are examples/gpt.py's GPT (4 layers, d_model 64, context
64, batch 16) and examples/digits_common.py's DigitsCNN (batch 64).
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))

import numpy as np  # noqa: E402

# ----------------------------------------------------------- workloads --


def build(workload, bucket_mb):
    """(model, step(i) -> None, loss_fn) on this rank, built before the
    process group (examples' TP layers then hold the whole layer)."""
    import dtorch
    if workload == "gpt":
        from gpt import GPT
        dtorch.manual_seed(0)
        model = GPT(64, n_layer=4, n_head=4, d_model=128, block_size=64)
        rng = np.random.default_rng(1)
        x = dtorch.tensor(rng.integers(0, 64, (8, 64)))
        y = dtorch.tensor(rng.integers(0, 64, (8, 64)))

        def loss_of(m):
            out = m(x)
            return dtorch.nn.functional.cross_entropy(
                out.reshape(-1, out.shape[-1]), y.reshape(-1))
        opt_cls = dtorch.optim.AdamW
    elif workload == "cnn":
        from digits_common import DigitsCNN
        dtorch.manual_seed(0)
        model = DigitsCNN()
        rng = np.random.default_rng(1)
        x = dtorch.tensor(rng.random((64, 1, 8, 8)).astype(np.float32))
        y = dtorch.tensor(rng.integers(0, 10, 64))

        def loss_of(m):
            return dtorch.nn.functional.cross_entropy(m(x), y)
        opt_cls = dtorch.optim.SGD
    else:
        raise SystemExit(f"unknown workload {workload!r}: gpt or cnn")
    return model, loss_of, opt_cls


def cmd_rank(a):
    import dtorch.distributed as dist
    from dtorch.nn.parallel import DistributedDataParallel as DDP
    model, loss_of, opt_cls = build(a.workload, a.bucket_mb)
    dist.init_process_group()
    ddp = DDP(model, bucket_cap_mb=a.bucket_mb)
    opt = opt_cls(ddp.parameters(), lr=1e-3)
    tl = dist.group.WORLD._timeline
    now = time.perf_counter_ns
    times = []
    for i in range(a.warmup + a.steps):
        t0 = now()
        opt.zero_grad()
        loss = loss_of(ddp)
        t1 = now()
        loss.backward()
        t2 = now()
        opt.step()
        t3 = now()
        times.append((t3 - t0) / 1e9)
        if tl is not None and i >= a.warmup:
            tl.complete("step", "step", t0, t3, {"step": i})
            tl.complete("forward", "step", t0, t1)
            tl.complete("backward", "step", t1, t2)
            tl.complete("optimizer", "step", t2, t3)
    dist.barrier()
    res = {"workload": a.workload, "world": dist.get_world_size(),
           "rank": dist.get_rank(),
           "step_s": statistics.median(times[a.warmup:]),
           "steps_s": times[a.warmup:],
           "params": sum(p.numel() for p in model.parameters()),
           "buckets": len(ddp._reducer.buckets),
           "bucket_bytes": [int(b.flat.nbytes)
                            for b in ddp._reducer.buckets]}
    dist.destroy_process_group()
    print(json.dumps(res))


def cmd_sweep(a):
    """Rank 0 <-> 1: ping-pong times (one-way = half the round trip) and
    2-rank all-reduce times over message sizes; medians."""
    import collectives
    g = collectives.init()
    out = {"pingpong": [], "allreduce": []}
    sizes = [2 ** k for k in range(3, 25, 2)]       # 8 B .. 8 MiB
    for n in sizes:
        buf = np.zeros(max(1, n // 4), np.float32)
        reps = max(3, min(30, int(4e6 // max(n, 1))))
        ts = []
        for _ in range(reps + 1):
            g.barrier()
            t0 = time.perf_counter()
            if g.rank == 0:
                g.send(buf, 1)
                g.recv(buf, 1)
            else:
                g.recv(buf, 0)
                g.send(buf, 0)
            ts.append((time.perf_counter() - t0) / 2)
        out["pingpong"].append([buf.nbytes, statistics.median(ts[1:])])
        ts = []
        for _ in range(reps + 1):
            g.barrier()
            t0 = time.perf_counter()
            g.all_reduce(buf, op="avg")
            ts.append(time.perf_counter() - t0)
        out["allreduce"].append([buf.nbytes, statistics.median(ts[1:])])
    g.barrier()
    g.destroy()
    if g.rank == 0:
        print(json.dumps(out))
    else:
        print(json.dumps({}))


# ------------------------------------------------------------ the model --

def fit_line(points):
    """(intercept, slope) of t = a + b * bytes, least squares weighted to
    relative error."""
    x = np.array([p[0] for p in points], float)
    y = np.array([p[1] for p in points], float)
    w = 1.0 / y
    A = np.stack([np.ones_like(x), x], 1) * w[:, None]
    (a, b), *_ = np.linalg.lstsq(A, y * w, rcond=None)
    return float(a), max(float(b), 0.0)


def link_params(sweep):
    """The link from the sweeps: alpha (one-way time of messages <= 2 KiB),
    beta (time per byte: the slope over messages >= 512 KiB, where the
    shaped rate rules; tc's token bucket - 2 ms at the rate, >= 128 KiB -
    did not measurably speed up smaller ones in the sweeps, so it is left
    out), gamma (what a 2-rank all-reduce spends per byte beyond 2 alpha +
    S beta: packing, reducing, its threads)."""
    pp = sweep["pingpong"]
    alpha = statistics.median(t for n, t in pp if n <= 2048)
    big = [(n, t) for n, t in pp if n >= 512 * 1024]
    beta = fit_line(big)[1]
    if beta <= 0:       # noisy points: the largest message alone
        n, t = big[-1]
        beta = (t - alpha) / n
    ar = [(n, t) for n, t in sweep["allreduce"] if n >= 512 * 1024]
    gamma = max(0.0, statistics.median(
        (t - 2 * alpha - n * beta) / n for n, t in ar))
    return {"alpha_s": alpha, "beta_s_per_B": beta, "gamma_s_per_B": gamma}


def t_allreduce(nbytes, p, alpha, beta, gamma=0.0):
    """The cheaper of a ring and recursive halving/doubling (no burst)."""
    if p <= 1:
        return 0.0
    vol = 2.0 * (p - 1) / p * nbytes * (beta + gamma)
    ring = 2 * (p - 1) * alpha + vol
    rhd = 2 * math.ceil(math.log2(p)) * alpha + vol
    return min(ring, rhd)


def profile_from_trace(path):
    """Per-step medians from a rank's timeline: forward, backward (to DDP's
    end-of-backward callback), the rest of the step, and each bucket's
    (bytes, ready time after backward began)."""
    from collectives.timeline import load
    evs = [e for e in load(path)["traceEvents"] if e.get("ph") == "X"]
    steps = sorted((e for e in evs if e["name"] == "step"),
                   key=lambda e: e["ts"])
    fwd, bwd, rest, buckets = [], [], [], []
    for s in steps:
        t0, t1 = s["ts"], s["ts"] + s["dur"]
        inside = [e for e in evs if t0 <= e["ts"] <= t1]
        f = next(e for e in inside if e["name"] == "forward")
        b = next(e for e in inside if e["name"] == "backward")
        wait = [e for e in inside if e["name"] == "DDP wait for buckets"]
        b_end = wait[0]["ts"] if wait else b["ts"] + b["dur"]
        fwd.append(f["dur"])
        bwd.append(b_end - b["ts"])
        # the optimizer and whatever else the step does, without the wait
        rest.append(s["dur"] - f["dur"] - b["dur"])
        ready = {}
        for e in inside:
            if e["name"] in ("pending", "queued") and e.get("cat") == "ddp":
                i = e["args"]["bucket"]
                ready[i] = min(ready.get(i, 1e30), e["ts"] - b["ts"])
                ready.setdefault(("bytes", i), e["args"]["bytes"])
        buckets.append([(ready[("bytes", i)], ready[i])
                        for i in sorted(k for k in ready
                                        if not isinstance(k, tuple))])
    nb = min(len(b) for b in buckets)
    med = statistics.median
    # the first bucket of a step finds the communication thread idle: its
    # "queued" time is the hand-off alone
    first = [e["dur"] for e in evs if e["name"] == "queued"
             and e["args"]["bucket"] == 0
             and any(s["ts"] <= e["ts"] <= s["ts"] + s["dur"]
                     for s in steps)]
    # how long this rank waited in its all-reduces for the other ranks
    # (the merged timeline's split; 0 without the other ranks' files)
    waits = _waits(path)
    return {"forward_s": med(fwd) / 1e6, "backward_s": med(bwd) / 1e6,
            "rest_s": med(rest) / 1e6, "steps": len(steps),
            # delays add up over a step: their means, not medians
            "handoff_s": statistics.fmean(first) / 1e6 if first else 0.0,
            "skew_s": statistics.fmean(waits) / 1e6 if waits else 0.0,
            "buckets": [(buckets[0][i][0],
                         med(b[i][1] for b in buckets) / 1e6)
                        for i in range(nb)]}


def _waits(path):
    """rank 0's wait (us) in each DDP all-reduce, from all ranks' files."""
    from collectives.timeline import load, rank_files, split_wait
    files = rank_files(os.path.dirname(path))
    if len(files) < 2:
        return []
    evs = []
    for f in files:
        evs += [e for e in load(f)["traceEvents"]
                if e.get("name") == "all_reduce_coalesced"]
    split_wait(evs)
    return [e["args"]["wait_us"] for e in evs
            if e["pid"] == 0 and "wait_us" in e.get("args", {})]


def predict(prof, p, alpha, beta, gamma=0.0, compute_scale=1.0,
            skew=True):
    """Step time on p ranks (see the module docstring); compute_scale
    shrinks every compute time (a faster device, same model). From the
    timeline also: the hand-off of a ready bucket to the idle communication
    thread, and (skew) how long this rank waited in each all-reduce for
    the last rank to arrive."""
    F = prof["forward_s"] * compute_scale
    B = prof["backward_s"] * compute_scale
    O = prof["rest_s"] * compute_scale
    wait = prof.get("skew_s", 0.0) if skew and p > 1 else 0.0
    end = 0.0
    for nbytes, ready in prof["buckets"]:
        # the hand-off is host software too: it scales with the compute
        start = max((ready + prof["handoff_s"]) * compute_scale, end)
        end = start + wait + t_allreduce(nbytes, p, alpha, beta, gamma)
    return F + max(B, end) + O


# ---------------------------------------------------------- validation --

def _run_pair(nodes, argv, env, timeout=900):
    """Rank 0 in node0, rank 1 in node1 (tcp, flat ring); their JSON."""
    import secrets
    token = secrets.token_hex(8)
    port = 29000 + secrets.randbelow(2000)
    procs = []
    for r, node in enumerate(("node0", "node1")):
        e = dict(os.environ, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK="0",
                 LOCAL_WORLD_SIZE="1", MASTER_ADDR=nodes.addr["node0"],
                 MASTER_PORT=str(port), DTORCH_RDZV_TOKEN=token,
                 DTORCH_HIERARCHICAL="0", DTORCH_COLLECTIVE_TIMEOUT="300",
                 **env)
        procs.append(nodes.popen(node, [sys.executable] + argv, env=e,
                                 stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True,
                                 cwd=ROOT))
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            if p.returncode:
                raise RuntimeError(f"{argv} failed:\n{err[-3000:]}")
            outs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return outs


def _run_alone(argv, env, timeout=900):
    e = {k: v for k, v in os.environ.items()
         if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    e.update(env)
    out = subprocess.run([sys.executable] + argv, env=e, capture_output=True,
                         text=True, timeout=timeout, cwd=ROOT)
    if out.returncode:
        raise RuntimeError(f"{argv} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def cmd_validate(a):
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from netns_nodes import skip_reason, start_nodes
    why = skip_reason()
    if why:
        raise SystemExit(f"validate needs namespace nodes: {why}")
    os.makedirs(a.out, exist_ok=True)
    me = os.path.abspath(__file__)
    doc = {"rates": {}, "loadavg_start": os.getloadavg(),
           "cpus": os.cpu_count(), "steps": a.steps,
           "bucket_mb": a.bucket_mb}
    for rate in a.rates:
        res = doc["rates"][rate] = {}
        # the lone rank right before the pair, so that both see about the
        # same machine load (other jobs share these 2 cores)
        for w in a.workloads:
            d = os.path.join(a.out, f"tl-{w}-1-{rate}")
            r = _run_alone([me, "rank", "--workload", w, "--steps",
                            str(a.steps), "--bucket-mb", str(a.bucket_mb)],
                           {"DTORCH_TIMELINE": d})
            res[f"alone_{w}"] = r
            print(f"1 rank {w}: {r['step_s'] * 1e3:.1f} ms/step", flush=True)
        with start_nodes(2, rate=rate) as nodes:
            res["sweep"] = _run_pair(nodes, [me, "sweep"], {})[0]
            lp = link_params(res["sweep"])
            print(f"{rate}: alpha {lp['alpha_s'] * 1e6:.0f} us, "
                  f"{8 / max(lp['beta_s_per_B'], 1e-15) / 1e9:.2f} Gbit/s",
                  flush=True)
            for w in a.workloads:
                d = os.path.join(a.out, f"tl-{w}-{rate}")
                outs = _run_pair(nodes, [me, "rank", "--workload", w,
                                         "--steps", str(a.steps),
                                         "--bucket-mb", str(a.bucket_mb)],
                                 {"DTORCH_TIMELINE": d})
                res[w] = outs[0]
                print(f"{rate} {w}: {outs[0]['step_s'] * 1e3:.1f} ms/step",
                      flush=True)
        with open(os.path.join(a.out, "validate.json"), "w") as f:
            json.dump(doc, f, indent=1)
    doc["loadavg_end"] = os.getloadavg()
    with open(os.path.join(a.out, "validate.json"), "w") as f:
        json.dump(doc, f, indent=1)


# -------------------------------------------------------------- report --

def _alone_trace(out, w, rate):
    d = os.path.join(out, f"tl-{w}-1-{rate}")
    if not os.path.isdir(d):             # a run of the first layout
        d = os.path.join(out, f"tl-{w}-1")
    return os.path.join(d, "rank0.json")


def cmd_report(a):
    with open(os.path.join(a.out, "validate.json")) as f:
        doc = json.load(f)
    rows = []
    for rate, res in doc["rates"].items():
        lp = link_params(res["sweep"])
        for w in a.workloads:
            if w not in res:
                continue
            prof2 = profile_from_trace(
                os.path.join(a.out, f"tl-{w}-{rate}", "rank0.json"))
            prof1 = profile_from_trace(_alone_trace(a.out, w, rate))
            t1 = (res.get(f"alone_{w}") or doc[f"alone_{w}"])["step_s"]
            meas = res[w]["step_s"]
            # the run's own compute (from its timeline) + the link model
            ab = (lp["alpha_s"], lp["beta_s_per_B"], lp["gamma_s_per_B"])
            pred = predict(prof2, 2, *ab)
            # compute from the lone rank's timeline: a true forecast
            pred1 = predict(prof1, 2, *ab)
            rows.append({
                "rate": rate, "workload": w,
                "alpha_us": lp["alpha_s"] * 1e6,
                "link_gbit": 8 / max(lp["beta_s_per_B"], 1e-15) / 1e9,
                "gamma_ns_per_B": lp["gamma_s_per_B"] * 1e9,
                "grad_MB": sum(b for b, _ in prof2["buckets"]) / 1e6,
                "buckets": len(prof2["buckets"]),
                "measured_ms": meas * 1e3, "predicted_ms": pred * 1e3,
                "error_pct": 100 * (pred - meas) / meas,
                "forecast_ms": pred1 * 1e3,
                "forecast_error_pct": 100 * (pred1 - meas) / meas,
                "alone_ms": t1 * 1e3, "eff_measured": t1 / meas,
                "eff_predicted": t1 / pred})
    lines = ["| link | model | grad MB | buckets | alpha us | fitted Gbit/s "
             "| measured ms | predicted ms | error | forecast ms (1-rank "
             "compute) | error | efficiency meas / pred |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['rate']} | {r['workload']} | {r['grad_MB']:.2f} | "
            f"{r['buckets']} | {r['alpha_us']:.0f} | {r['link_gbit']:.2f} | "
            f"{r['measured_ms']:.1f} | {r['predicted_ms']:.1f} | "
            f"{r['error_pct']:+.0f}% | {r['forecast_ms']:.1f} | "
            f"{r['forecast_error_pct']:+.0f}% | {r['eff_measured']:.2f} / "
            f"{r['eff_predicted']:.2f} |")
    table = "\n".join(lines)
    print(table)
    # projection: the stated interconnect, the 1-rank compute profiles
    alpha, gbit = a.alpha_us * 1e-6, a.gbit
    beta = 8 / (gbit * 1e9)
    nodes = [8, 16, 32, 64, 128, 256, 512, 1024]
    proj, used = {}, {}
    for w in a.workloads:
        # the quietest lone-rank run: the least disturbed compute profile
        runs = [profile_from_trace(_alone_trace(a.out, w, r))
                for r in doc["rates"]]
        prof1 = used[w] = min(runs, key=lambda p: p["forward_s"] +
                              p["backward_s"])
        for scale, tag in ((1.0, "CPU compute as measured"),
                           (a.gpu_scale, f"compute / {1 / a.gpu_scale:.0f}")):
            t1 = predict(prof1, 1, alpha, beta, compute_scale=scale)
            proj[f"{w}: {tag}"] = [
                t1 / predict(prof1, p, alpha, beta, compute_scale=scale)
                for p in nodes]
    doc_out = {"rows": rows, "table_md": table, "projection": {
        "nodes": nodes, "alpha_us": a.alpha_us, "gbit": gbit,
        "efficiency": proj, "profiles": used},
        "loadavg": [doc.get("loadavg_start"), doc.get("loadavg_end")]}
    with open(os.path.join(a.out, "scaling_model.json"), "w") as f:
        json.dump(doc_out, f, indent=1)
    for k, v in proj.items():
        print(f"{k}: " + " ".join(f"{p}:{e:.2f}" for p, e in zip(nodes, v)))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for k, v in proj.items():
        ax.plot(nodes, v, marker="o", label=k)
    ax.set_xscale("log", base=2)
    ax.set_xticks(nodes, [str(n) for n in nodes])
    ax.set_ylim(0, 1.3)
    ax.set_yticks([0, 0.2, 0.4, 0.6, 0.8, 1.0])
    ax.set_xlabel("nodes (one rank each)")
    ax.set_ylabel("weak-scaling efficiency  T(1) / T(N)")
    ax.set_title(f"dtorch DDP, alpha-beta model: {gbit:g} Gbit/s, "
                 f"{a.alpha_us:g} us per message")
    ax.axvline(256, color="grey", ls=":", lw=1)
    ax.text(256 * 1.05, 0.05, "Li et al., VLDB 2020:\nPyTorch DDP "
            "'near-linear\nscalability using 256 GPUs'\n(NCCL; abstract)",
            fontsize=7, color="grey")
    steps = ", ".join(
        f"{w} {1e3 * (p['forward_s'] + p['backward_s'] + p['rest_s']):.0f} "
        f"ms, {sum(b for b, _ in p['buckets']) / 1e6:.2f} MB in "
        f"{len(p['buckets'])} buckets" for w, p in used.items())
    ax.text(0.99, 0.99, f"compute per step from a 1-rank timeline on a "
            f"loaded 2-core CPU:\n{steps}; 'compute / "
            f"{1 / a.gpu_scale:.0f}': an assumed GPU-class device (not "
            f"measured)\nall-reduce: min(ring, halving-doubling), "
            f"buckets serial, overlapped with backward",
            transform=ax.transAxes, ha="right", va="top", fontsize=6.5)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(os.path.join(a.out, "scaling_model.png"), dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("rank")
    r.add_argument("--workload", default="gpt")
    r.add_argument("--steps", type=int, default=12)
    r.add_argument("--warmup", type=int, default=3)
    r.add_argument("--bucket-mb", type=float, default=0.25)
    sub.add_parser("sweep")
    v = sub.add_parser("validate")
    v.add_argument("--out", default=os.path.join(HERE, "results",
                                                 "scaling_model"))
    v.add_argument("--rates", default="100mbit,1gbit,10gbit",
                   type=lambda s: s.split(","))
    v.add_argument("--workloads", default="gpt,cnn",
                   type=lambda s: s.split(","))
    v.add_argument("--steps", type=int, default=12)
    v.add_argument("--bucket-mb", type=float, default=0.25)
    p = sub.add_parser("report")
    p.add_argument("--out", default=os.path.join(HERE, "results",
                                                 "scaling_model"))
    p.add_argument("--workloads", default="gpt,cnn",
                   type=lambda s: s.split(","))
    p.add_argument("--gbit", type=float, default=100.0)
    p.add_argument("--alpha-us", type=float, default=5.0)
    p.add_argument("--gpu-scale", type=float, default=0.01,
                   help="compute-time factor of the second projection")
    a = ap.parse_args()
    {"rank": cmd_rank, "sweep": cmd_sweep, "validate": cmd_validate,
     "report": cmd_report}[a.cmd](a)


if __name__ == "__main__":
    main()

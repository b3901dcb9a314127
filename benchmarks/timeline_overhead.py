"""What DTORCH_TIMELINE costs: per-op time of autograd and of a collective
call, timeline off vs the code before the timeline existed, and on.

    python benchmarks/timeline_overhead.py --before DIR [--after DIR2]

DIR is a copy of the tree without the timeline's hooks, DIR2 (default: this
tree) one with them: e.g. ``git archive HEAD | tar -x -C DIR2``, then the same
in DIR with the files the timeline commit changed taken from its parent
(``git show 960e06d^:collectives/group.py > DIR/collectives/group.py``...), so
that nothing else differs. Each round runs one fresh process per variant - before, off,
on - in turn (interleaved, so that all see the same machine load); each
process reports the fastest of its repeats (the least disturbed on a loaded
machine); the table gives the median and range over rounds, and of the
per-round ratios to "before". Workloads (one thread, one rank):

- chain: 1,000 tiny ops forward + backward (a Mul and an Add per pair),
  per op = time / 1,000 (dispatch overhead, as core_overhead.py);
- all_reduce: 1-element all_reduce on a one-rank group, per call.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

CHILD = r"""
import os, sys, time, statistics, json
sys.path.insert(0, sys.argv[1])
import numpy as np
import dtorch
import dtorch.distributed as dist
on = sys.argv[2] == 'on'
g = dist.init_process_group('threads') if hasattr(dist, 'init_process_group') else None
if on:
    from dtorch.autograd import function as F
    assert F._profile is not None, 'timeline hook not installed'
x = dtorch.ones(4, requires_grad=True)
def chain():
    y = x
    for i in range(500):
        y = y * 1.0001
        y = y + 0.5
    y.sum().backward()
    x.grad = None
a = np.zeros(1, np.float32)
def ar():
    for _ in range(200):
        g.all_reduce(a)
def best(f, n):
    # the minimum over repeats: on a loaded machine the least disturbed
    # run is the closest to the code's own cost
    f()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter(); f(); ts.append(time.perf_counter() - t0)
    return min(ts)
res = {'chain_us_per_op': best(chain, int(sys.argv[3])) / 1000 * 1e6,
       'all_reduce_us': best(ar, int(sys.argv[3])) / 200 * 1e6}
if on:
    # the recorder's own cost, paired in this process: hook removed and
    # restored between repeats (what a timeline adds to an op)
    from dtorch.distributed import _timeline as T
    pairs = []
    for _ in range(int(sys.argv[3])):
        T._install(False)
        off_t = best(chain, 1)
        T._install(True)
        pairs.append((best(chain, 1), off_t))
    res['on_minus_off_us_per_op'] = (min(p[0] for p in pairs)
                                     - min(p[1] for p in pairs)) / 1000 * 1e6
print(json.dumps(res))
"""


def run(tree, mode, repeats, tl_dir):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               PYTHONPATH=tree)
    env.pop("DTORCH_TIMELINE", None)
    if mode == "on":
        env["DTORCH_TIMELINE"] = tl_dir
    out = subprocess.run([sys.executable, "-c", CHILD, tree, mode,
                          str(repeats)], env=env, capture_output=True,
                         text=True, timeout=600, cwd=tempfile.gettempdir())
    if out.returncode:
        raise RuntimeError(f"{mode} run failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True,
                    help="a copy of the tree before the timeline")
    ap.add_argument("--after", default=ROOT,
                    help="a copy of the tree with the timeline")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--out", default=os.path.join(
        HERE, "results", "timeline_overhead.json"))
    a = ap.parse_args()
    variants = (("before", a.before, "off"), ("off", a.after, "off"),
                ("on", a.after, "on"))
    res = {v[0]: [] for v in variants}
    with tempfile.TemporaryDirectory() as tl:
        for i in range(a.rounds):
            for name, tree, mode in variants:
                res[name].append(run(tree, mode, a.repeats, tl))
            print(f"round {i + 1}/{a.rounds}: " + ", ".join(
                f"{n} {res[n][-1]['chain_us_per_op']:.2f} us/op "
                f"{res[n][-1]['all_reduce_us']:.2f} us/ar" for n in res),
                flush=True)
    table = {}
    d = [r["on_minus_off_us_per_op"] for r in res["on"]]
    table["recorder_us_per_op"] = {"on-off": {
        "median": statistics.median(d), "min": min(d), "max": max(d)}}
    for key in ("chain_us_per_op", "all_reduce_us"):
        table[key] = {}
        for n in res:
            vals = [r[key] for r in res[n]]
            table[key][n] = {"median": statistics.median(vals),
                             "min": min(vals), "max": max(vals)}
        # paired ratios: each round's variants ran back to back
        for n in ("off", "on"):
            ratios = [r[key] / b[key] for r, b in zip(res[n],
                                                      res["before"])]
            table[key][f"{n}/before"] = {
                "median": statistics.median(ratios), "min": min(ratios),
                "max": max(ratios)}
    load = os.getloadavg()
    doc = {"table": table, "rounds": a.rounds, "repeats": a.repeats,
           "loadavg": load, "cpus": os.cpu_count(), "raw": res}
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1)
    for key, t in table.items():
        print(key)
        for n, v in t.items():
            print(f"  {n:12s} median {v['median']:.3f}  range "
                  f"{v['min']:.3f}-{v['max']:.3f}")
    print(f"load average {load[0]:.1f} on {os.cpu_count()} cpus")


if __name__ == "__main__":
    main()

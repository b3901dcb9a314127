"""``dtorch-launch --dry-run`` of examples/gpt.py: its cost at 64 simulated
ranks, and its per-rank byte predictions against real tcp jobs.

    python benchmarks/dry_run.py [--ranks 64] [--repeats 2] [--out F]

(a) cost: ``dtorch-launch --dry-run --nproc-per-node 16 --nnodes 4
    examples/gpt.py --dp 16 --tp 2 --pp 2 --steps 2`` as a whole command
    (launcher, child start-up, 2 steps of 64 thread ranks, the table): wall
    seconds and CPU seconds of the child processes (getrusage), with the
    load average before each run;
(b) accuracy: for 2 ranks (--pp 2, --dp 2) and 4 ranks (--tp 2 --pp 2,
    --dp 2 --tp 2) the dry run's figures against those of a real job of that
    many tcp processes under DTORCH_DRY_RUN_REPORT (the same ledger code,
    dtorch/distributed/_accounting.py): the largest relative difference of
    any figure of any rank (goal: within 10%).
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPT = os.path.join(ROOT, "examples", "gpt.py")
FIGURES = ("parameter_bytes", "gradient_bytes", "optimizer_state_bytes",
           "activation_bytes")


def _launch(args, env=None):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "launch"] + args, cwd=ROOT,
                       env=dict(os.environ, **(env or {})),
                       capture_output=True, text=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode:
        sys.exit(p.stdout[-2000:] + p.stderr[-2000:])
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime
                                                - before.ru_stime)
    return wall, cpu


def _gpt(tmp, layout):
    return layout + ["--steps", "2", "--sample", "0", "--checkpoint",
                     os.path.join(tmp, "gpt.safetensors")]


def cost(ranks, repeats, tmp):
    out = []
    per_node = ranks // 4
    for _ in range(repeats):
        load = os.getloadavg()[0]
        wall, cpu = _launch(["--dry-run", "--nproc-per-node", str(per_node),
                             "--nnodes", "4", GPT]
                            + _gpt(tmp, ["--dp", str(ranks // 4), "--tp",
                                         "2", "--pp", "2"]))
        out.append({"ranks": ranks, "wall_s": round(wall, 2),
                    "cpu_s": round(cpu, 2), "load_before": load})
        print(f"{ranks} simulated ranks: {wall:.1f} s wall, {cpu:.1f} s "
              f"CPU (load {load:.1f})", flush=True)
    return out


def _rel(a, b):
    return 0.0 if a == b else abs(a - b) / max(abs(a), abs(b))


def accuracy(n, layout, tmp):
    js = os.path.join(tmp, "dry.json")
    real = os.path.join(tmp, f"real{n}{''.join(layout)}")
    _launch(["--dry-run", "--nproc-per-node", str(n), "--dry-run-json", js,
             GPT] + _gpt(tmp, layout))
    _launch(["--nproc-per-node", str(n), GPT] + _gpt(tmp, layout),
            env={"DTORCH_DRY_RUN_REPORT": real})
    worst = 0.0
    with open(js) as f:
        pred = json.load(f)["ranks"]
    for p in pred:
        with open(os.path.join(real, f"rank{p['rank']}.json")) as f:
            m = json.load(f)
        pairs = [(p[k], m[k]) for k in FIGURES]
        kinds = set(p["collective_bytes"]) | set(m["collective_bytes"])
        pairs += [(p["collective_bytes"].get(k, 0),
                   m["collective_bytes"].get(k, 0)) for k in kinds]
        worst = max([worst] + [_rel(a, b) for a, b in pairs])
    print(f"{n} ranks {' '.join(layout)}: largest relative difference "
          f"{worst:.2%} over {len(pred)} ranks", flush=True)
    return {"ranks": n, "layout": layout, "max_rel_diff": worst}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=64,
                    help="simulated ranks of (a): a multiple of 16")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default=None, help="write the results here")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        res = {"cost": cost(a.ranks, a.repeats, tmp), "accuracy": [
            accuracy(n, layout, tmp) for n, layout in (
                (2, ["--pp", "2"]), (2, ["--dp", "2"]),
                (4, ["--tp", "2", "--pp", "2"]),
                (4, ["--dp", "2", "--tp", "2"]))]}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()

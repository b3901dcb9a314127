"""Elastic training (issue 27): seconds from a SIGKILL to the first step the
survivors complete, and from starting a joiner to its first step.

    python benchmarks/elastic_recovery.py [--runs 3] [--nproc 3] [--example gpt]

Runs ``dtorch-launch --elastic 2:4 --nproc-per-node N
examples/elastic_digits.py`` (``--example gpt``: examples/elastic_gpt.py)
on loopback, SIGKILLs one rank (a different
one each run, rank 0 included) once training is under way, then starts a
``dtorch-launch --join`` and lets the job finish. The ranks' trace
(DTORCH_ELASTIC_TRACE) gives when each survivor saw the failure, had the
new group and finished its first step; the figures are from the kill (or
the joiner's start). The machine's load is printed with them: on a shared
machine the import of a joiner dominates its figure. ``--zero``: the
example with ZeroRedundancyOptimizer (the shards rebuilt from buddy
replicas).
"""
import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = {name: os.path.join(ROOT, "examples", f"elastic_{name}.py")
            for name in ("digits", "gpt")}


def _children(pid, script):
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rfind(")") + 2:].split()[1])
        if ppid == pid and os.fsencode(script) in cmd:
            out.append(int(name))
    return sorted(out)


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_run(victim, nproc, epochs, extra=(), example=EXAMPLES["digits"],
            delay=0.0):
    trace = tempfile.NamedTemporaryFile(suffix=".jsonl", delete=False).name
    port = _port()
    env = dict(os.environ, PYTHONPATH=ROOT, DTORCH_ELASTIC_TRACE=trace,
               DTORCH_RDZV_TOKEN=f"bench-{port}")
    args = [example, "--epochs", str(epochs)] + list(extra)
    host = subprocess.Popen(
        [sys.executable, "-m", "launch", "--elastic", "2:4",
         "--nproc-per-node", str(nproc), "--master-port", str(port)] + args,
        env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    # training is under way once rank 0 printed its first epoch
    first = host.stdout.readline()
    while first and "epoch" not in first:
        first = host.stdout.readline()
    pids = _children(host.pid, example)
    time.sleep(delay)                   # into the next epoch
    t_kill = time.time()
    os.kill(pids[victim], signal.SIGKILL)
    time.sleep(0.5)
    t_join = time.time()
    joiner = subprocess.run(
        [sys.executable, "-m", "launch", "--join", "--master-port",
         str(port)] + args, env=env, cwd=ROOT, capture_output=True,
        text=True)
    out, err = host.communicate()
    with open(trace) as f:
        recs = [json.loads(line) for line in f]
    os.remove(trace)
    shrink = [r for r in recs if r["t_fail"] is not None]
    join = [r for r in recs if r["joined"]]
    res = {"code": host.returncode, "join_code": joiner.returncode,
           "victim": victim,
           "seen_s": min(r["t_fail"] for r in shrink) - t_kill,
           "formed_s": max(r["t_formed"] for r in shrink) - t_kill,
           "first_step_s": max(r["t_step"] for r in shrink) - t_kill}
    if join:
        j = join[0]
        res["join_start_to_first_step_s"] = j["t_step"] - t_join
        res["join_register_to_first_step_s"] = j["t_step"] - j["t_register"]
        res["join_register_to_formed_s"] = j["t_formed"] - j["t_register"]
    # the first epoch's seconds: is the kill (``delay`` after it) mid-epoch?
    res["epoch_1"] = first.strip()
    res["final"] = [ln for ln in out.splitlines() if "final" in ln]
    if joiner.returncode:
        res["join_err"] = joiner.stderr[-600:]
    return res


OVERHEAD = """
import time, numpy as np, dtorch as torch
from dtorch.distributed import elastic
m = torch.nn.Linear(4, 2)
job = elastic.ElasticJob(m, torch.optim.SGD(m.parameters(), lr=0.1),
                         torch.utils.data.TensorDataset(torch.zeros(8, 4)), 8)
ts = []
for _ in range(300):
    t = time.perf_counter(); job._joins_waiting()
    ts.append(time.perf_counter() - t)
if job.rank == 0:
    print("per-step join check: median %.0f us, p90 %.0f us" % (
        1e6 * np.median(ts), 1e6 * np.percentile(ts, 90)), flush=True)
job.close()
"""


def overhead(nproc):
    """What elastic costs each step when nothing happens: the join check
    (one store read and an 8-byte all-reduce)."""
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(OVERHEAD)
    env = dict(os.environ, PYTHONPATH=ROOT)
    try:
        r = subprocess.run([sys.executable, "-m", "launch", "--elastic",
                            f"1:{nproc}", "--nproc-per-node", str(nproc),
                            f.name], env=env, cwd=ROOT, capture_output=True,
                           text=True, timeout=300)
    finally:
        os.remove(f.name)
    return [ln for ln in r.stdout.splitlines() if "join check" in ln]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--nproc", type=int, default=3)
    ap.add_argument("--example", choices=sorted(EXAMPLES), default="digits")
    ap.add_argument("--epochs", type=int, default=None,
                    help="default: 20 (digits), 4 (gpt)")
    ap.add_argument("--kill-delay", type=float, default=None,
                    help="seconds from rank 0's first epoch line to the "
                         "kill (default: 0 digits, 1 gpt: mid-epoch)")
    ap.add_argument("--zero", action="store_true",
                    help="the example with ZeRO-1 (buddy replicas)")
    ap.add_argument("--overhead", action="store_true",
                    help="only the per-step cost of the join check")
    a = ap.parse_args()
    if a.zero and a.example != "digits":
        ap.error("--zero: only with --example digits")
    print("load:", os.getloadavg(), "example:", a.example)
    if a.overhead:
        print(overhead(a.nproc))
        return
    for k in range(a.runs):
        epochs = a.epochs or {"digits": 20, "gpt": 4}[a.example]
        print(json.dumps(one_run(k % a.nproc, a.nproc, epochs,
                                 ["--zero"] if a.zero else [],
                                 EXAMPLES[a.example],
                                 a.kill_delay if a.kill_delay is not None
                                 else float(a.example == "gpt"))),
              flush=True)
    print("load:", os.getloadavg())


if __name__ == "__main__":
    main()

"""What the tcp backend's message header costs: (tag, bytes) before issue
25, (tag, bytes, dtype/op) now, so that ranks whose all_reduce buffers
agree in size but not in dtype or op raise instead of returning garbage.

    python benchmarks/tcp_frames.py [--trees OLD NEW] [--repeats 5]

1. In one process, interleaved: packing and checking one header, the old
   16-byte struct against the new 32-byte one with its kind() (once per
   collective, as the ring algorithms compute it).
2. With ``--trees``: a 2-rank all_reduce over loopback (processes), each
   tree's ``collectives`` in turn, repeat by repeat; CPU time per call
   (both ranks, getrusage) and wall time per call, for 4 B, 4 KiB and
   256 KiB float32. Prints ranges over the repeats; state the load.
"""
import argparse
import os
import resource
import socket
import struct
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = (1, 1024, 64 * 1024)         # float32 elements
_RANK = r"""
import os, resource, sys, time
import numpy as np
from collectives.tcp import tcp_group
rank, port, iters = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
g = tcp_group(rank, 2, '127.0.0.1', port, 'bench', timeout=120)
out = []
for n in %r:
    buf = np.zeros(n, np.float32)   # sums stay finite
    for _ in range(20):
        g.all_reduce(buf)
    g.barrier()
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for _ in range(iters):
        g.all_reduce(buf)
    r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    cpu = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
    out.append((cpu / iters, (t1 - t0) / iters))
g.barrier()
print(repr(out), flush=True)
""" % (SIZES,)


def headers(repeats, count=200_000):
    old = struct.Struct('<qq')
    new = struct.Struct('<qq16s')
    sys.path.insert(0, ROOT)
    from collectives.tcp.transport import kind
    what = kind(np.float32, 'sum')

    def run_old():
        for i in range(count):
            b = old.pack(i, 64)
            if old.unpack(b) != (i, 64):
                raise AssertionError

    def run_new():
        w = kind(np.float32, 'sum')      # per collective
        for i in range(count):
            b = new.pack(i, 64, w)
            if new.unpack(b) != (i, 64, what):
                raise AssertionError

    res = {"old": [], "new": []}
    for _ in range(repeats):
        for name, fn in (("old", run_old), ("new", run_new)):
            t = time.thread_time()
            fn()
            res[name].append((time.thread_time() - t) / count * 1e9)
    t = time.thread_time()
    for _ in range(count):
        kind(np.float32, 'sum')
    k_ns = (time.thread_time() - t) / count * 1e9
    print("header pack + unpack + compare, ns per message (CPU):")
    for name in ("old", "new"):
        print(f"  {name}: {min(res[name]):.0f} - {max(res[name]):.0f}")
    print(f"  kind() once per collective: {k_ns:.0f} ns")


def one_job(tree, iters):
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=tree, OMP_NUM_THREADS='1')
    procs = [subprocess.Popen([sys.executable, '-c', _RANK, str(r),
                               str(port), str(iters)], env=env,
                              stdout=subprocess.PIPE, text=True)
             for r in range(2)]
    outs = [eval(p.communicate(timeout=600)[0].strip().splitlines()[-1])
            for p in procs]
    # CPU of both ranks, wall of the slower
    return [(outs[0][i][0] + outs[1][i][0],
             max(outs[0][i][1], outs[1][i][1])) for i in range(len(SIZES))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--trees', nargs=2, metavar=('OLD', 'NEW'))
    ap.add_argument('--repeats', type=int, default=5)
    ap.add_argument('--iters', type=int, default=2000)
    args = ap.parse_args()
    print(f"load: {os.getloadavg()}")
    headers(args.repeats)
    if not args.trees:
        return
    res = {t: [] for t in args.trees}
    for _ in range(args.repeats):
        for t in args.trees:
            res[t].append(one_job(t, args.iters))
    print(f"2-rank tcp all_reduce float32, {args.iters} calls, "
          f"{args.repeats} repeats (min - max); CPU = both ranks")
    for i, n in enumerate(SIZES):
        for label, t in zip(("old", "new"), args.trees):
            cpu = [r[i][0] * 1e6 for r in res[t]]
            wall = [r[i][1] * 1e6 for r in res[t]]
            print(f"  {4 * n:>7} B {label}: CPU {min(cpu):7.1f} - "
                  f"{max(cpu):7.1f} us/call, wall {min(wall):7.1f} - "
                  f"{max(wall):7.1f} us/call")
    print(f"load: {os.getloadavg()}")


if __name__ == '__main__':
    main()

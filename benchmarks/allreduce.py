"""All-reduce bandwidth: raw mpi4py Allreduce vs dtorch's mpi and tcp
backends, in the same run, float32, 4 KiB .. 256 MiB.

    mpiexec -n 2 python benchmarks/allreduce.py [--out PATH] [--max-mib 256]

For each size: median over repeats of the time per call (each repeat times
a loop of calls; the slowest rank's time counts), algbw = bytes / time and
busbw = algbw * 2(n-1)/n (nccl-tests' convention). raw and dtorch-mpi
alternate repeat by repeat so that drift hits both alike. The tcp group is
made inside the same MPI processes (rank 0 serves the store on 127.0.0.1;
port and token travel by MPI bcast). Prints a table and writes JSON.
"""
import argparse
import json
import os
import socket
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))


def timed(comm, fn, buf, iters):
    from mpi4py import MPI
    comm.Barrier()
    t = time.perf_counter()
    for _ in range(iters):
        fn(buf)
    dt = (time.perf_counter() - t) / iters
    return comm.allreduce(dt, op=MPI.MAX)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--out', default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), 'results',
        'allreduce.json'))
    ap.add_argument('--max-mib', type=int, default=256)
    ap.add_argument('--repeats', type=int, default=7)
    ap.add_argument('--no-tcp', action='store_true')
    args = ap.parse_args()

    from mpi4py import MPI
    import collectives
    from collectives.mpi import world_group
    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), comm.Get_size()
    g = world_group(timeout=300)
    tg = None
    if not args.no_tcp:
        port = None
        if rank == 0:
            with socket.socket() as s:
                s.bind(('127.0.0.1', 0))
                port = s.getsockname()[1]
        port, token = comm.bcast((port, os.urandom(16).hex()), root=0)
        from collectives.tcp import tcp_group
        tg = tcp_group(rank, n, '127.0.0.1', port, token, timeout=300)

    def raw(b):
        comm.Allreduce(MPI.IN_PLACE, b, MPI.SUM)
    impls = [('raw', raw), ('mpi', g.all_reduce)]
    if tg is not None:
        impls.append(('tcp', tg.all_reduce))

    sizes = []
    s = 4 * 1024
    while s <= args.max_mib * 1024 * 1024:
        sizes.append(s)
        s *= 4
    factor = 2 * (n - 1) / n
    rows = []
    if rank == 0:
        print(f"all-reduce float32, {n} ranks, median of {args.repeats}; "
              f"busbw = algbw * {factor:g}")
        hdr = (f"{'size':>9} | {'raw us':>9} {'mpi us':>9} {'tcp us':>9} |"
               f" {'raw GB/s':>8} {'mpi GB/s':>8} {'tcp GB/s':>8} |"
               f" {'mpi/raw':>7} {'tcp/raw':>7}   (busbw ratios)")
        print(hdr)
        print('-' * len(hdr))
    for size in sizes:
        # zeros: repeated in-place sums must not overflow to inf
        buf = np.zeros(size // 4, np.float32)
        # aim at ~50 ms per timed loop, at least 1 call
        t1 = timed(comm, raw, buf, 3)
        iters = max(1, min(5000, int(0.05 / max(t1, 1e-7))))
        for _, fn in impls:          # warm up (tcp connects lazily)
            timed(comm, fn, buf, min(iters, 20))
        times = {k: [] for k, _ in impls}
        for _ in range(args.repeats):
            for k, fn in impls:
                times[k].append(timed(comm, fn, buf, iters))
        row = {'bytes': size, 'iters': iters}
        for k in times:
            t = statistics.median(times[k])
            row[f"{k}_us"] = t * 1e6
            row[f"{k}_algbw_GBps"] = size / t / 1e9
            row[f"{k}_busbw_GBps"] = size / t / 1e9 * factor
        rows.append(row)
        if rank == 0:
            def f(k, fmt):
                key = f"{k}_{fmt}"
                return f"{row[key]:9.1f}" if key in row else f"{'-':>9}"

            def bw(k):
                key = f"{k}_busbw_GBps"
                return f"{row[key]:8.2f}" if key in row else f"{'-':>8}"
            mr = row['mpi_busbw_GBps'] / row['raw_busbw_GBps']
            tr = (row['tcp_busbw_GBps'] / row['raw_busbw_GBps']
                  if 'tcp_us' in row else float('nan'))
            print(f"{_human(size):>9} | {f('raw', 'us')} {f('mpi', 'us')} "
                  f"{f('tcp', 'us')} | {bw('raw')} {bw('mpi')} {bw('tcp')} "
                  f"| {mr:7.2f} {tr:7.2f}", flush=True)
    if rank == 0:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)),
                    exist_ok=True)
        meta = {'ranks': n, 'dtype': 'float32', 'repeats': args.repeats,
                'busbw_factor': factor, 'mpi4py': _version('mpi4py'),
                'numpy': np.__version__, 'host': socket.gethostname(),
                'cpus': os.cpu_count(), 'collectives': collectives.__name__,
                'time': time.strftime('%Y-%m-%dT%H:%M:%S')}
        with open(args.out, 'w') as fh:
            json.dump({'meta': meta, 'results': rows}, fh, indent=1)
        print(f"wrote {args.out}")
        # a PNG next to the JSON when matplotlib is installed
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import _plot
        _plot.plot_allreduce(args.out)
    comm.Barrier()
    if tg is not None:
        tg.destroy()


def _human(n):
    for unit in ('B', 'KiB', 'MiB', 'GiB'):
        if n < 1024:
            return f"{n} {unit}"
        n //= 1024
    return f"{n} TiB"


def _version(mod):
    try:
        return __import__(mod).__version__
    except Exception:
        return None


if __name__ == '__main__':
    main()

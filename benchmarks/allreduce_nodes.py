"""Cross-node all-reduce busbw: dtorch's hierarchical tcp all-reduce vs the
flat tcp ring vs Open MPI's MPI_Allreduce (mpi4py), in the same run, on 2
nodes x 2 ranks, float32, 1-256 MiB, the link shaped to each --rates value.

    python benchmarks/allreduce_nodes.py [--rates 1gbit,10gbit]
        [--max-mib 256] [--repeats 3] [--out PATH] [--loopback]

The nodes are Linux namespaces made by slurm/netns-nodes.sh (own network,
hostname, /dev/shm and PID namespace; a veth link shaped by tc tbf; needs
root). One mpiexec runs in this (root) namespace with a --host-link and
starts its daemons in the nodes through a stand-in for ssh
(`netns-nodes.sh exec`), so MPI_Allreduce crosses the same link (Open MPI's
tcp btl on the nodes' subnet, shared memory inside a node). In that job the
ranks also build two tcp groups (store on node0): the hierarchical one
(default) and a flat ring (DTORCH_HIERARCHICAL=0). Sizes are timed with
the three alternating, repeat by repeat, so drift hits all alike; the
slowest rank's time per call counts; busbw = bytes / time * 2(n-1)/n
(nccl-tests' convention, n = 4 ranks). Also printed: bytes that left node0
on eth0 per 64 MiB call, the link traffic each algorithm needs.

--loopback: no namespaces (e.g. not root): 4 ranks on this host, two
"hosts" simulated with DTORCH_HOST_ID, links unshaped (loopback); MPI then
uses shared memory between all four, so its figures are not cross-node.

Measured (2026-12-01, 3 runs of 3 repeats; the range of the per-run medians,
busbw GB/s; 2 cores shared with other jobs, load average 8-13 throughout):

    link    size | hierarchical | flat ring   | MPI_Allreduce
    1gbit   1 MiB | 0.144-0.163 | 0.105-0.116 | 0.013-0.044
            4 MiB | 0.135-0.169 | 0.105-0.113 | 0.009-0.022
           16 MiB | 0.124-0.174 | 0.100-0.109 | 0.014-0.024
           64 MiB | 0.168-0.175 | 0.109-0.114 | 0.018-0.021
          256 MiB | 0.160-0.176 | 0.099-0.110 | 0.037-0.049
    10gbit  1 MiB | 0.195-0.231 | 0.130-0.203 | 0.028-0.067
            4 MiB | 0.221-0.375 | 0.167-0.207 | 0.024-0.043
           16 MiB | 0.258-0.341 | 0.184-0.281 | 0.024-0.059
           64 MiB | 0.228-0.325 | 0.219-0.353 | 0.029-0.077
          256 MiB | 0.260-0.391 | 0.193-0.368 | 0.035-0.061

Bytes out of node0's eth0 per 64 MiB call: hierarchical 67.2 MB (1 x the
buffer), MPI 67.7 MB, flat ring 100.8 MB (1.5 x). At 1 Gbit/s (0.12 GB/s
measured by a plain stream) the ideal busbw is 0.18 (hierarchical) and
0.12 (flat): both run near it. At 10 Gbit/s all three are CPU-bound (4
ranks on 2 loaded cores). Open MPI's figures are not the link's: its tcp
btl needs the rank to poll for progress, and 4 polling ranks on 2 busy
cores starve (unshaped: the same 0.01-0.06; busy-polling without
mpi_yield_when_idle: 0.003 at 1 MiB; on one host through shared memory it
reaches 1.3 GB/s at 16 MiB), so they say little about MPI on real nodes.
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
NETNS = os.path.join(ROOT, 'slurm', 'netns-nodes.sh')
MIB = 1 << 20


# ----------------------------------------------------------- rank side

def _eth0_tx():
    try:
        with open('/sys/class/net/eth0/statistics/tx_bytes') as fh:
            return int(fh.read())
    except OSError:
        return None


def rank_main(args):
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), comm.Get_size()
    from collectives.tcp import tcp_group
    if args.loopback:
        os.environ['DTORCH_HOST_ID'] = f"fake{rank * 2 // n}"
    host = None
    port = None
    if rank == 0:
        host = '127.0.0.1' if args.loopback else \
            socket.gethostbyname(socket.gethostname())
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
    host, port, token = comm.bcast((host, port, os.urandom(16).hex()), 0)
    g = tcp_group(rank, n, host, port, token, timeout=900)
    os.environ['DTORCH_HIERARCHICAL'] = '0'
    flat = g.new_group(range(n))
    del os.environ['DTORCH_HIERARCHICAL']

    def mpi(b):
        comm.Allreduce(MPI.IN_PLACE, b, MPI.SUM)
    impls = {'mpi': mpi, 'hier': g.all_reduce, 'flat': flat.all_reduce}

    # same answer from all three (exact: small integers)
    ref = None
    for name, fn in impls.items():
        x = ((np.arange(MIB // 4 + 3) * 7 + rank) % 13).astype(np.float32)
        fn(x)
        if ref is None:
            ref = x
        assert np.array_equal(x, ref), f"{name} disagrees with mpi"

    # bytes leaving this node on eth0 per call (both ranks of node0)
    traffic = {}
    buf = np.zeros(64 * MIB // 4, np.float32)
    for name, fn in impls.items():
        comm.Barrier()
        t0 = _eth0_tx()
        fn(buf)
        comm.Barrier()
        t1 = _eth0_tx()
        if t0 is not None:
            traffic[name] = t1 - t0

    factor = 2 * (n - 1) / n
    rows = []
    sizes = [s * MIB for s in (1, 4, 16, 64, 256) if s <= args.max_mib]
    for nbytes in sizes:
        buf = np.zeros(nbytes // 4, np.float32)
        iters = {}
        for name, fn in impls.items():      # warm-up, and the loop length
            comm.Barrier()
            t = time.perf_counter()
            fn(buf)
            t = comm.allreduce(time.perf_counter() - t, op=MPI.MAX)
            iters[name] = int(min(20, max(1, 0.4 / t)))
        times = {name: [] for name in impls}
        order = list(impls)
        for rep in range(args.repeats):
            for name in order[rep % 3:] + order[:rep % 3]:
                fn, k = impls[name], iters[name]
                comm.Barrier()
                t = time.perf_counter()
                for _ in range(k):
                    fn(buf)
                dt = (time.perf_counter() - t) / k
                times[name].append(comm.allreduce(dt, op=MPI.MAX))
        if rank == 0:
            row = {'bytes': nbytes, 'iters': iters}
            for name, ts in times.items():
                bw = [nbytes / t * factor / 1e9 for t in ts]
                row[name] = {'times': ts, 'busbw_GBps': bw}
            rows.append(row)
            print(_fmt_row(row), file=sys.stderr, flush=True)
    if rank == 0:
        print('RESULT ' + json.dumps({
            'hierarchy': g.hierarchy, 'flat': flat.hierarchy,
            'hosts': socket.gethostname(), 'ranks': n,
            'node0_eth0_tx_per_64MiB_call': traffic, 'rows': rows}),
            flush=True)
    comm.Barrier()
    flat.destroy()
    g.destroy()


def _fmt_row(row):
    cells = []
    for name in ('hier', 'flat', 'mpi'):
        bw = row[name]['busbw_GBps']
        cells.append(f"{statistics.median(bw):6.3f} "
                     f"[{min(bw):.3f}-{max(bw):.3f}]")
    return f"{row['bytes'] // MIB:>5} MiB | " + ' | '.join(cells)


# --------------------------------------------------------- driver side

AGENT = r"""#!/bin/bash
# stand-in for ssh: mpiexec's daemons start inside the netns nodes
while [[ "$1" == -* ]]; do shift; done
host=$1; shift
case "$host" in
%s
  *) echo "no netns node for $host" >&2; exit 255;;
esac
exec bash %s exec --prefix %s "$node" /bin/sh -c "$*"
"""


def _mpi_env(oversubscribe):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT='1',
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM='1', OMP_NUM_THREADS='1',
               OPENBLAS_NUM_THREADS='1',
               # waiting ranks yield the core (dtorch's do): 4 ranks
               # share 2 cores here, and busy-polling starves the others
               OMPI_MCA_mpi_yield_when_idle='1')
    if oversubscribe:   # 4 ranks on 2 cores; the nodes get 2 slots each
        env.update(OMPI_MCA_rmaps_base_oversubscribe='1',
                   PRTE_MCA_rmaps_default_mapping_policy=':oversubscribe')
    return env


def _run_job(cmd, env, timeout):
    p = subprocess.run(cmd, env=env, capture_output=True, text=True,
                       timeout=timeout)
    sys.stderr.write(p.stderr[-4000:])
    for line in p.stdout.splitlines():
        if line.startswith('RESULT '):
            return json.loads(line[7:])
    raise RuntimeError(f"job failed ({p.returncode}):\n{p.stdout[-3000:]}"
                       f"\n{p.stderr[-3000:]}")


def _load():
    with open('/proc/loadavg') as fh:
        return float(fh.read().split()[0])


def driver(args):
    me = [sys.executable, os.path.abspath(__file__), '--rank',
          '--max-mib', str(args.max_mib), '--repeats', str(args.repeats)]
    runs = []
    if args.loopback:
        env = _mpi_env(True)
        load = _load()
        res = _run_job(['mpiexec', '-n', '4'] + me + ['--loopback'], env,
                       args.job_timeout)
        res.update(rate='loopback (unshaped)', load_before=load,
                   load_after=_load())
        runs.append(res)
    else:
        prefix = f"hb{os.getpid() % 100000}"
        out = subprocess.run(['bash', NETNS, 'start', '2', '--prefix',
                              prefix, '--host-link'], capture_output=True,
                             text=True, check=True).stdout
        try:
            nodes = [ln.split('\t') for ln in out.splitlines() if ln]
            net = nodes[0][1].rsplit('.', 1)[0] + '.0/24'
            with tempfile.TemporaryDirectory() as tmp:
                agent = os.path.join(tmp, 'agent.sh')
                with open(agent, 'w') as fh:
                    fh.write(AGENT % ('\n'.join(
                        f"  {a}) node={name};;" for name, a, *_ in nodes),
                        NETNS, prefix))
                os.chmod(agent, 0o755)
                env = dict(_mpi_env(False), PRTE_MCA_plm_ssh_agent=agent,
                           PRTE_MCA_plm_ssh_no_tree_spawn='1',
                           PRTE_MCA_oob_tcp_if_include=net,
                           OMPI_MCA_btl_tcp_if_include=net)
                hosts = ','.join(f"{a}:2" for _, a, *_ in nodes)
                for rate in args.rates.split(','):
                    subprocess.run(['bash', NETNS, 'rate', rate, '--prefix',
                                    prefix], check=True,
                                   capture_output=True)
                    print(f"--- link {rate}: size | busbw GB/s median "
                          f"[min-max] hier | flat | mpi", file=sys.stderr,
                          flush=True)
                    load = _load()
                    res = _run_job(['mpiexec', '--host', hosts, '-n', '4',
                                    '--map-by', 'slot'] + me, env,
                                   args.job_timeout)
                    res.update(rate=rate, load_before=load,
                               load_after=_load())
                    runs.append(res)
        finally:
            subprocess.run(['bash', NETNS, 'stop', '--prefix', prefix],
                           capture_output=True)
    report(runs)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, 'w') as fh:
        json.dump(runs, fh, indent=1)
    print(f"wrote {args.out}")


def report(runs):
    for res in runs:
        print(f"\nlink {res['rate']}: {res['hierarchy']}; load "
              f"{res['load_before']:.1f} -> {res['load_after']:.1f} (2 "
              f"cores); eth0 bytes out of node0 per 64 MiB call: "
              f"{res['node0_eth0_tx_per_64MiB_call']}")
        print(f"{'size':>9} | busbw GB/s, median [min-max] of "
              f"{len(res['rows'][0]['hier']['times'])} repeats")
        print(f"{'':>9} | {'hier':^21} | {'flat ring':^21} | "
              f"{'MPI_Allreduce':^21}")
        for row in res['rows']:
            print(_fmt_row(row))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--rates', default='1gbit,10gbit')
    ap.add_argument('--max-mib', type=int, default=256)
    ap.add_argument('--repeats', type=int, default=3)
    ap.add_argument('--loopback', action='store_true')
    ap.add_argument('--job-timeout', type=float, default=1800)
    ap.add_argument('--out', default=os.path.join(
        ROOT, 'benchmarks', 'results', 'allreduce_nodes.json'))
    ap.add_argument('--rank', action='store_true', help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank:
        rank_main(args)
    else:
        driver(args)


if __name__ == '__main__':
    main()

"""A job for tests/launch/test_two_nodes.py, run by dtorch-launch on each of two
netns nodes (tcp backend).

    two_nodes_job.py check   collectives + 3 DDP steps, checked; prints
                             `HOST rank hostname` and `OK rank`
    two_nodes_job.py loop    after init prints `READY rank pid`, then
                             all-reduces until a peer fails (test kills
                             a node)
    two_nodes_job.py fail_once   the last rank exits with 3 in the first
                             attempt, then as check
    two_nodes_job.py send_to_dead FILE   READY, then rank 0 waits for
                             FILE and sends to rank 1 (killed by then)"""
import os
import socket
import sys
import time

import numpy as np

import dtorch
import dtorch.distributed as dist
from dtorch import nn

mode = sys.argv[1]
dist.init_process_group()
rank, world = dist.get_rank(), dist.get_world_size()
host = socket.gethostname()

if mode == "fail_once":
    # the last rank fails in the first attempt; --max-restarts brings the
    # job back on both nodes, which then runs the checks
    dist.barrier()
    if os.environ["DTORCH_RESTART_COUNT"] == "0" and rank == world - 1:
        sys.exit(3)
    mode = "check"

if mode == "send_to_dead":
    # rank 0 sends to rank 1 only after the test has killed rank 1's node
    # (its first p2p connection to rank 1 is made after rank 1 is gone)
    print(f"READY {rank} {os.getpid()}", flush=True)
    if rank == 0:
        while not os.path.exists(sys.argv[2]):
            time.sleep(0.05)
        dist.send(dtorch.ones(8), dst=1)
        print("SENT", flush=True)
    time.sleep(600)

if mode == "loop":
    print(f"READY {rank} {os.getpid()}", flush=True)
    t = dtorch.ones(1024)
    while True:
        dist.all_reduce(t)
        t.fill_(1.0)
        time.sleep(0.02)

# 1. every rank sees who runs where
hosts = [None] * world
dist.all_gather_object(hosts, host)
print(f"HOST {rank} {host} {' '.join(hosts)}", flush=True)

# 2. all_reduce of 1 MiB (crosses the link whatever the algorithm) and a
# broadcast from the last rank, checked element by element
n = 1 << 18
x = dtorch.arange(n, dtype=dtorch.float32) * (rank + 1)
dist.all_reduce(x)
expect = np.arange(n, dtype=np.float32) * (world * (world + 1) / 2)
np.testing.assert_allclose(x.numpy(), expect, rtol=1e-6)
b = dtorch.full((1000,), float(rank), dtype=dtorch.float64)
dist.broadcast(b, src=world - 1)
assert (b.numpy() == world - 1).all(), b.numpy()[:4]

# 3. three DDP steps on a tiny model equal full-batch steps in one process
dtorch.manual_seed(0)
ref = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 2)).double()
dtorch.manual_seed(0)
model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 2)).double()
ddp = nn.parallel.DistributedDataParallel(model)
rng = np.random.default_rng(1)
X = dtorch.tensor(rng.standard_normal((3, 4 * world, 5)))
Y = dtorch.tensor(rng.standard_normal((3, 4 * world, 2)))
opt = dtorch.optim.SGD(ddp.parameters(), lr=0.1)
ref_opt = dtorch.optim.SGD(ref.parameters(), lr=0.1)
for step in range(3):
    mine = slice(4 * rank, 4 * rank + 4)
    opt.zero_grad()
    nn.functional.mse_loss(ddp(X[step][mine]), Y[step][mine]).backward()
    opt.step()
    ref_opt.zero_grad()
    nn.functional.mse_loss(ref(X[step]), Y[step]).backward()
    ref_opt.step()
for p, q in zip(model.parameters(), ref.parameters()):
    np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(),
                               rtol=1e-10, atol=1e-12)
dist.barrier()
dist.destroy_process_group()
print(f"OK {rank}", flush=True)

"""Two-GPU check, run by benchmarks/gpu_check.sh under
``python -m launch --nproc-per-node 2 benchmarks/gpu_ddp_check.py OUT.json``:
init_process_group picks NCCL and one GPU per LOCAL_RANK; device and host
all_reduce, broadcast_object, then DDP training (float64) equal to
single-process training on the concatenated batch. Rank 0 writes OUT.json
and prints one line: ``GPU_DDP_CHECK PASS|FAIL {...}``."""
import json
import sys

import numpy as np

import dtorch
import dtorch.distributed as dist
from dtorch import nn
from dtorch.nn import functional as F
from dtorch.nn.parallel import DistributedDataParallel as DDP


def model():
    dtorch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 4)).to(
        dtorch.float64)


def main(out):
    dist.init_process_group()
    rank, ws = dist.get_rank(), dist.get_world_size()
    res = {"backend": dist.get_backend(), "world_size": ws,
           "device": dtorch.cuda.current_device()}
    x = dtorch.full((4,), float(rank + 1), device="cuda")
    dist.all_reduce(x)
    res["device_all_reduce"] = x.cpu().tolist()
    h = dtorch.full((3,), float(rank + 1))           # host: bootstrap group
    dist.all_reduce(h)
    res["host_all_reduce"] = h.tolist()
    objs = [rank, "x"]
    dist.broadcast_object_list(objs, 1)
    res["broadcast_object"] = objs

    rng = np.random.default_rng(1)
    X = dtorch.tensor(rng.standard_normal((8 * ws, 16)))
    Y = dtorch.tensor(rng.standard_normal((8 * ws, 4)))
    ref = model().to("cuda")
    opt = dtorch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for _ in range(5):
        opt.zero_grad()
        F.mse_loss(ref(X.cuda()), Y.cuda()).backward()
        opt.step()
    m = DDP(model().to("cuda"), bucket_cap_mb=0.01)
    opt = dtorch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    xs, ys = X[rank * 8:(rank + 1) * 8].cuda(), Y[rank * 8:(rank + 1) * 8].cuda()
    for _ in range(5):
        opt.zero_grad()
        F.mse_loss(m(xs), ys).backward()
        opt.step()
    err = max(float((a - b).abs().max()) for a, b in
              zip(m.module.parameters(), ref.parameters()))
    res["ddp_max_abs_diff_vs_single"] = err
    res["ddp_param_device"] = str(next(m.parameters()).device)
    want = float(sum(range(1, ws + 1)))
    ok = (res["backend"] == "nccl" and res["device"] == rank
          and res["device_all_reduce"] == [want] * 4
          and res["host_all_reduce"] == [want] * 3 and err < 1e-9
          and res["broadcast_object"] == [1, "x"]
          and res["ddp_param_device"] == f"cuda:{rank}")
    res["pass"] = ok
    allres = [None] * ws
    dist.all_gather_object(allres, res)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(allres, f, indent=1)
        good = all(r["pass"] for r in allres)
        print("GPU_DDP_CHECK", "PASS" if good else "FAIL",
              json.dumps(allres), flush=True)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "gpu_ddp.json"))

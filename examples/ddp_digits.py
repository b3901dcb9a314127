"""The digits CNN under DistributedDataParallel.

    mpiexec -n 2 python -m mpi4py examples/ddp_digits.py
    dtorch-launch --nproc-per-node 2 examples/ddp_digits.py
    srun --mpi=pmix python -m mpi4py examples/ddp_digits.py   (slurm/train.sbatch)

Each rank trains on its DistributedSampler shard; gradients are averaged by
DDP. Rank 0 shows the progress bar and writes the checkpoint after every
epoch; a restarted job (dtorch-launch --max-restarts, SLURM requeue) resumes
from it, also on a different number of ranks. SIGUSR1 (SLURM's warning
before preemption) makes the job checkpoint at the next step and exit 0 so
the batch script can requeue it.
"""
import argparse
import os
import signal
import sys
import time

from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dtorch as torch  # noqa: E402
import dtorch.distributed as dist  # noqa: E402
from dtorch import nn  # noqa: E402
from dtorch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from dtorch.utils.data import (DataLoader, DistributedSampler,  # noqa: E402
                               TensorDataset)
from digits_common import (DigitsCNN, distributed_accuracy,  # noqa: E402
                           load_digits_split)

_stop = [False]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--batch-size", type=int, default=16,
                    help="per rank")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--checkpoint", default="runs/ddp_digits.safetensors")
    ap.add_argument("--no-resume", action="store_true")
    ap.add_argument("--fail-at-epoch", type=int, default=-1,
                    help="testing: rank 1 exits 3 at this epoch on the "
                         "first attempt (DTORCH_RESTART_COUNT=0)")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)

    dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    signal.signal(signal.SIGUSR1, lambda *a: _stop.__setitem__(0, True))
    torch.manual_seed(args.seed)
    xtr, ytr, xte, yte = load_digits_split(seed=args.seed)
    train_ds = TensorDataset(xtr, ytr)
    sampler = DistributedSampler(train_ds, shuffle=True, seed=args.seed)
    loader = DataLoader(train_ds, batch_size=args.batch_size,
                        sampler=sampler, drop_last=True)
    test_sampler = DistributedSampler(TensorDataset(xte, yte),
                                      shuffle=False, pad=False)
    test_loader = DataLoader(TensorDataset(xte, yte), batch_size=256,
                             sampler=test_sampler)
    model = DDP(DigitsCNN())
    opt = torch.optim.Adam(model.parameters(), lr=args.lr * world ** 0.5)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, args.epochs)

    start = 0
    if not args.no_resume and os.path.exists(args.checkpoint):
        ck = torch.load(args.checkpoint)
        model.module.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        sched.load_state_dict(ck["scheduler"])
        sampler.load_state_dict(ck["sampler"])
        start = ck["epoch"]
        if rank == 0:
            print(f"resumed from {args.checkpoint} at epoch {start + 1} "
                  f"(after {ck['sampler']['consumed']} samples of it)",
                  flush=True)

    t0 = time.time()
    acc = 0.0
    for epoch in range(start, args.epochs):
        if epoch != sampler.epoch:
            sampler.set_epoch(epoch)
        if (epoch == args.fail_at_epoch and rank == world - 1
                and os.environ.get("DTORCH_RESTART_COUNT", "0") == "0"):
            print(f"rank {rank}: failing on purpose at epoch {epoch}",
                  flush=True)
            os._exit(3)
        bar = tqdm(loader, desc=f"epoch {epoch + 1}/{args.epochs}",
                   disable=args.quiet or rank != 0, leave=False)
        for step, (x, y) in enumerate(bar):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            if _stop[0]:
                break
        if _stop[0]:
            save(args, model, opt, sched, sampler, epoch, rank)
            if rank == 0:
                print("SIGUSR1: checkpointed, exiting for requeue",
                      flush=True)
            dist.barrier()
            return 0
        sched.step()
        sampler.set_epoch(epoch + 1)
        acc = distributed_accuracy(model.module, test_loader)
        if rank == 0:
            print(f"epoch {epoch + 1:2d}  test acc {100 * acc:.2f}%  "
                  f"({time.time() - t0:.1f} s, {world} ranks)", flush=True)
        save(args, model, opt, sched, sampler, epoch + 1, rank)
    if rank == 0:
        print(f"final test accuracy {100 * acc:.2f}% on {world} ranks",
              flush=True)
    dist.barrier()
    return acc


def save(args, model, opt, sched, sampler, epoch, rank):
    if rank == 0:
        os.makedirs(os.path.dirname(args.checkpoint) or ".", exist_ok=True)
        torch.save({"model": model.module.state_dict(),
                    "optimizer": opt.state_dict(),
                    "scheduler": sched.state_dict(),
                    "sampler": sampler.state_dict(), "epoch": epoch},
                   args.checkpoint)
    dist.barrier()


if __name__ == "__main__":
    main()

"""The digits CNN under DistributedDataParallel.

    mpiexec -n 2 python -m mpi4py examples/ddp_digits.py
    dtorch-launch --nproc-per-node 2 examples/ddp_digits.py
    srun --mpi=pmix python -m mpi4py examples/ddp_digits.py   (slurm/train.sbatch)

Each rank trains on its DistributedSampler shard; gradients are averaged by
DDP. Rank 0 shows the progress bar (on a terminal). After every epoch the
ranks write a distributed checkpoint (dtorch.distributed.checkpoint, a
directory: DDP's replicated parameters once, each rank's RNG state if it
differs, atomic); a restarted job (dtorch-launch --max-restarts, SLURM
requeue) resumes from it, also on a different number of ranks, and so does
--resume. Otherwise a run starts fresh: running the example twice trains
twice. SIGUSR1 (SLURM's warning
before preemption) makes the job checkpoint at the next step and exit 0 so
the batch script can requeue it.
"""
import argparse
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dtorch as torch  # noqa: E402
import dtorch.distributed as dist  # noqa: E402
import dtorch.distributed.checkpoint as dcp  # noqa: E402
from dtorch.distributed.checkpoint.state_dict import (  # noqa: E402
    get_state_dict, set_state_dict)
from dtorch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from dtorch.utils.data import (DataLoader, DistributedSampler,  # noqa: E402
                               TensorDataset)
from digits_common import (DigitsCNN, add_run_args,  # noqa: E402
                           dcp_summary, discard, distributed_accuracy,
                           load_digits_split, plan_start, report_finished,
                           restart_count, train_epochs)
from digits_common import HelpFormatter  # noqa: E402

_stop = [False]


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        formatter_class=HelpFormatter)
    ap.add_argument("--epochs", type=int, default=15, help="epochs to train")
    ap.add_argument("--batch-size", type=int, default=16,
                    help="batch size per rank")
    add_run_args(ap, "ddp_digits", "rank")
    ap.add_argument("--fail-at-epoch", type=int, default=-1,
                    help="testing: the last rank exits 3 at the start of "
                         "this epoch (0-based) on the first attempt "
                         "(DTORCH_RESTART_COUNT=0)")
    args = ap.parse_args(argv)

    dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    signal.signal(signal.SIGUSR1, lambda *a: _stop.__setitem__(0, True))
    torch.manual_seed(args.seed)
    xtr, ytr, xte, yte = load_digits_split(seed=args.seed)
    train_ds = TensorDataset(xtr, ytr)
    sampler = DistributedSampler(train_ds, shuffle=True, seed=args.seed)
    # The loaders draw from their own generator, so the global stream is
    # dropout's alone and its state in the checkpoint is all a resumed run
    # needs to continue bitwise as the uninterrupted one.
    loader_g = torch.Generator().manual_seed(args.seed)
    loader = DataLoader(train_ds, batch_size=args.batch_size,
                        sampler=sampler, drop_last=True, generator=loader_g)
    test_sampler = DistributedSampler(TensorDataset(xte, yte),
                                      shuffle=False, pad=False)
    test_loader = DataLoader(TensorDataset(xte, yte), batch_size=256,
                             sampler=test_sampler, generator=loader_g)
    model = DDP(DigitsCNN())
    opt = torch.optim.Adam(model.parameters(), lr=args.lr * world ** 0.5)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, args.epochs)

    # the checkpoint, or the copy dcp.save keeps under its .old name while
    # it replaces it (found there after a kill between its two renames)
    found = dcp.latest_checkpoint(args.checkpoint) or args.checkpoint
    ck, finished, message = plan_start(found, args.epochs, args.resume,
                                       read=dcp_summary)
    if message and rank == 0:
        print(message, flush=True)
    if finished:
        return report_finished(ck, rank)
    start, acc = 0, 0.0
    if ck is not None:
        # in place into the live objects, on any number of ranks
        state = train_state(model, opt, sched, sampler, loader_g, 0, 0.0,
                            world)
        dcp.load(state, checkpoint_id=found)
        set_state_dict(model, opt, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"])
        start, acc = state["epoch"], state["test_acc"]
        consumed = sampler.state_dict()["consumed"]
        if rank == 0 and consumed:
            print(f"(after {consumed} samples of epoch {start + 1})",
                  flush=True)
    dist.barrier()           # every rank has read the checkpoint
    if ck is None and rank == 0:
        discard(found)
        discard(args.checkpoint)

    def fail_on_purpose(epoch):
        if (epoch == args.fail_at_epoch and rank == world - 1
                and restart_count() == 0):
            print(f"rank {rank}: failing on purpose at epoch {epoch}",
                  flush=True)
            os._exit(3)

    acc, stopped = train_epochs(
        model, opt, sched, sampler, loader, start, acc, args, rank=rank,
        stop=_stop, before_epoch=fail_on_purpose,
        save=lambda epoch, acc: save(args, model, opt, sched, sampler,
                                     loader_g, epoch, acc, rank, world),
        accuracy=lambda: distributed_accuracy(model.module, test_loader),
        report=lambda epoch, acc, loss, secs: (
            f"epoch {epoch + 1:2d}  test acc {100 * acc:.2f}%  "
            f"({secs:.1f} s, {world} ranks)"))
    if stopped:
        dist.barrier()
        return 0
    if rank == 0:
        print(f"final test accuracy {100 * acc:.2f}% on {world} ranks",
              flush=True)
    dist.barrier()
    return acc


def train_state(model, opt, sched, sampler, loader_g, epoch, acc, world):
    """Everything a run continues from; objects with state_dict() (the
    scheduler, the sampler's position, the RNG streams) are saved and
    loaded through it."""
    model_sd, optim_sd = get_state_dict(model, opt)
    return {"model": model_sd, "optimizer": optim_sd, "scheduler": sched,
            "sampler": sampler, "rng": dcp.RNGState(loader_g),
            "epoch": epoch, "test_acc": acc, "world": world}


def save(args, model, opt, sched, sampler, loader_g, epoch, acc, rank,
         world):
    # every rank takes part; the directory appears complete or not at all
    dcp.save(train_state(model, opt, sched, sampler, loader_g, epoch, acc,
                         world), checkpoint_id=args.checkpoint)

if __name__ == "__main__":
    main()

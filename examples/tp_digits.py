"""The digits MLP under data parallel x tensor parallel (Megatron style).

    # TP 2 on 2 ranks, then DP 2 x TP 2 on 4
    mpiexec -n 2 python -m mpi4py examples/tp_digits.py --tp-size 2
    mpiexec -n 4 python -m mpi4py examples/tp_digits.py --tp-size 2
    TP_SIZE=2 sbatch slurm/train_tp.sbatch

The world splits into groups of --tp-size consecutive ranks
(make_dp_tp_groups). Within a TP group the hidden layers are sharded: a
ColumnParallelLinear (each rank computes a slice of the hidden units) feeds
a RowParallelLinear (each rank multiplies its slice; one all-reduce sums
them). Ranks at the same place in their TP groups form a DP group:
DistributedDataParallel averages their gradients, and DistributedSampler
gives each DP replica its own share of the data (the TP ranks of one
replica read the same batches).

The checkpoint is a distributed checkpoint (dtorch.distributed.checkpoint,
a directory): each TP shard is written once, by the first DP replica that
holds it, with its place in the full tensor, so it resumes on any DP x TP
layout (resharded on load, optimizer state included), and
dcp.format_utils.dcp_to_torch_save makes one file of it whose "model"
entry loads into the same MLP at --tp-size 1 (plain nn.Linear layers, same
keys). The ranks write it after every epoch; a restarted job or --resume continues from it (otherwise a run
starts fresh); SIGUSR1 (SLURM's warning before preemption) makes every rank
stop at the same step, checkpoint and exit 0 for the batch script's requeue.
"""
import argparse
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dtorch as torch  # noqa: E402
import dtorch.distributed as dist  # noqa: E402
import dtorch.distributed.checkpoint as dcp  # noqa: E402
from dtorch import nn  # noqa: E402
from dtorch.distributed.checkpoint.state_dict import (  # noqa: E402
    get_state_dict, set_state_dict)
from dtorch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from dtorch.nn.parallel import tensor_parallel as tp  # noqa: E402
from dtorch.utils.data import (DataLoader, DistributedSampler,  # noqa: E402
                               TensorDataset)
from digits_common import (add_run_args, dcp_summary, discard,  # noqa: E402
                           distributed_accuracy, load_digits_split,
                           plan_start, report_finished, train_epochs)
from digits_common import HelpFormatter  # noqa: E402

_stop = [False]


class DigitsMLP(nn.Module):
    """Flatten - Column(64 -> hidden) - ReLU - Row(hidden -> 128) - ReLU -
    Linear(128 -> 10). The head is small and replicated on the TP ranks.
    The same seed gives the same model at every TP size."""

    def __init__(self, tp_group, hidden=256):
        super().__init__()
        self.body = nn.Sequential(
            nn.Flatten(),
            tp.ColumnParallelLinear(64, hidden, gather_output=False,
                                    process_group=tp_group),
            nn.ReLU(),
            tp.RowParallelLinear(hidden, 128, input_is_parallel=True,
                                 process_group=tp_group),
            nn.ReLU(),
            nn.Linear(128, 10))

    def forward(self, x):
        return self.body(x)


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        formatter_class=HelpFormatter)
    ap.add_argument("--tp-size", type=int, default=2,
                    help="ranks per tensor-parallel group")
    ap.add_argument("--epochs", type=int, default=10, help="epochs to train")
    ap.add_argument("--batch-size", type=int, default=32,
                    help="batch size per data-parallel replica")
    ap.add_argument("--hidden", type=int, default=256,
                    help="hidden units of the sharded layers")
    add_run_args(ap, "tp_digits", "replica")
    args = ap.parse_args(argv)

    dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    if world % args.tp_size:
        raise SystemExit(f"tp_digits: --tp-size {args.tp_size} does not "
                         f"divide the world size {world}")
    dp_group, tp_group = tp.make_dp_tp_groups(args.tp_size)
    dp_rank, dp_size = dp_group.rank, dp_group.size
    signal.signal(signal.SIGUSR1, lambda *a: _stop.__setitem__(0, True))

    torch.manual_seed(args.seed)          # same on every rank: see DigitsMLP
    xtr, ytr, xte, yte = load_digits_split(seed=args.seed)
    train_ds, test_ds = TensorDataset(xtr, ytr), TensorDataset(xte, yte)
    # samplers over DP replicas only: the TP ranks of a replica must see
    # the same batch
    sampler = DistributedSampler(train_ds, num_replicas=dp_size,
                                 rank=dp_rank, shuffle=True, seed=args.seed)
    # the loaders' own generator: the global stream stays the model's
    loader_g = torch.Generator().manual_seed(args.seed)
    loader = DataLoader(train_ds, batch_size=args.batch_size,
                        sampler=sampler, drop_last=True, generator=loader_g)
    test_loader = DataLoader(test_ds, batch_size=256, sampler=(
        DistributedSampler(test_ds, num_replicas=dp_size, rank=dp_rank,
                           shuffle=False, pad=False)), generator=loader_g)
    mlp = DigitsMLP(tp_group, args.hidden)
    model = DDP(mlp, process_group=dp_group)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr * dp_size ** 0.5)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, args.epochs)

    ck, finished, message = plan_start(args.checkpoint, args.epochs,
                                       args.resume, read=dcp_summary)
    if message and rank == 0:
        print(message, flush=True)
    if finished:
        return report_finished(ck, rank, f"TP {ck.get('tp_size', '?')}; ")
    start, acc = 0, 0.0
    if ck is not None:
        # this rank's shards of whatever layout wrote it, in place
        state = train_state(args, mlp, opt, sched, sampler, loader_g, 0,
                            0.0, world)
        dcp.load(state, checkpoint_id=args.checkpoint)
        set_state_dict(mlp, opt, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"])
        start, acc = state["epoch"], state["test_acc"]
    dist.barrier()           # every rank has read the checkpoint
    if ck is None and rank == 0:
        discard(args.checkpoint)

    if rank == 0:
        print(f"DP {dp_size} x TP {args.tp_size} on {world} ranks: {mlp}",
              flush=True)
    # every TP rank of a replica computes the same predictions: accuracy
    # counts over the DP group only
    acc, stopped = train_epochs(
        model, opt, sched, sampler, loader, start, acc, args, rank=rank,
        stop=_stop,
        save=lambda epoch, acc: save(args, mlp, opt, sched, sampler,
                                     loader_g, epoch, acc, rank, world),
        accuracy=lambda: distributed_accuracy(model.module, test_loader,
                                              dp_group),
        report=lambda epoch, acc, loss, secs: (
            f"epoch {epoch + 1:2d}  loss {loss.item():.4f}  test acc "
            f"{100 * acc:.2f}%  ({secs:.1f} s)"))
    if stopped:
        return 0
    if rank == 0:
        print(f"final test accuracy {100 * acc:.2f}% on {world} ranks "
              f"(DP {dp_size} x TP {args.tp_size})", flush=True)
    dist.barrier()
    return acc


def train_state(args, mlp, opt, sched, sampler, loader_g, epoch, acc,
                world):
    """Everything a run continues from; the TP shards (parameters and
    Adam's moments) carry their place in the full tensors."""
    model_sd, optim_sd = get_state_dict(mlp, opt)
    return {"model": model_sd, "optimizer": optim_sd, "scheduler": sched,
            "sampler": sampler, "rng": dcp.RNGState(loader_g),
            "epoch": epoch, "test_acc": acc, "world": world,
            "tp_size": args.tp_size}


def save(args, mlp, opt, sched, sampler, loader_g, epoch, acc, rank,
         world):
    # every rank takes part: each writes the shards it owns
    dcp.save(train_state(args, mlp, opt, sched, sampler, loader_g, epoch,
                         acc, world), checkpoint_id=args.checkpoint)

if __name__ == "__main__":
    main()

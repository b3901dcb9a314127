"""The digits CNN as an elastic job: ranks may die and join while it trains.

    dtorch-launch --elastic 2:4 --nproc-per-node 3 examples/elastic_digits.py
    dtorch-launch --join --master-port PORT examples/elastic_digits.py

(the first launcher prints PORT and the --join line). SIGKILL any rank, rank
0 included: the launcher names it and the new world size, the others carry
on from the last completed step (no restart, no checkpoint) and every
training sample of the epoch is used exactly once. A joined rank takes part
from the next step. Fewer than MIN ranks left: the job stops, saying so.
The loop is dtorch.distributed.elastic's (``job.epochs``, ``job.steps``,
``with step``); without --elastic the script runs as a fixed job
(``dtorch-launch --nproc-per-node 2 ...``) or in one process. ``--zero``:
Adam's state sharded over the ranks (ZeroRedundancyOptimizer, ZeRO-1), each
shard with a buddy replica in the next rank so that a lost rank's shard
survives it.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dtorch as torch  # noqa: E402
from dtorch.distributed import elastic  # noqa: E402
from dtorch.nn import functional as F  # noqa: E402
from dtorch.utils.data import DataLoader, TensorDataset  # noqa: E402
from digits_common import (DigitsCNN, HelpFormatter, evaluate,  # noqa: E402
                           load_digits_split)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=HelpFormatter)
    ap.add_argument("--epochs", type=int, default=8, help="epochs to train")
    ap.add_argument("--batch-size", type=int, default=48,
                    help="global batch size (split among the ranks)")
    ap.add_argument("--lr", type=float, default=4e-3,
                    help="Adam's learning rate (cosine schedule)")
    ap.add_argument("--seed", type=int, default=0,
                    help="seed of the model, the data split and order")
    ap.add_argument("--zero", action="store_true",
                    help="shard Adam's state over the ranks (ZeRO-1)")
    args = ap.parse_args(argv)

    torch.manual_seed(args.seed)
    xtr, ytr, xte, yte = load_digits_split(seed=args.seed)
    model = DigitsCNN()
    if args.zero:
        from dtorch.distributed.optim import ZeroRedundancyOptimizer
        if not elastic.is_elastic() and not torch.distributed.is_initialized():
            torch.distributed.init_process_group()     # a fixed job
        opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam,
                                      lr=args.lr)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, args.epochs)
    job = elastic.ElasticJob(model, opt, TensorDataset(xtr, ytr),
                             batch_size=args.batch_size, seed=args.seed,
                             state={"scheduler": sched})
    test_loader = DataLoader(TensorDataset(xte, yte), batch_size=256)
    t0, acc = time.time(), 0.0
    for epoch in job.epochs(args.epochs):
        for step in job.steps():
            with step:
                x, y = step.batch
                opt.zero_grad()
                loss = F.cross_entropy(job.model(x), y, reduction="sum") \
                    * step.scale
                loss.backward()
                opt.step()
        sched.step()
        # every rank holds the whole model: evaluating needs no collective
        correct, total, _ = evaluate(model, test_loader)
        acc = correct / total
        if job.rank == 0:
            print(f"epoch {epoch + 1:2d}  test acc {100 * acc:.2f}%  "
                  f"({time.time() - t0:.1f} s, {job.world_size} ranks)",
                  flush=True)
    if job.rank == 0:
        print(f"final test accuracy {100 * acc:.2f}% on {job.world_size} "
              f"ranks", flush=True)
    job.close()
    return acc


if __name__ == "__main__":
    main()

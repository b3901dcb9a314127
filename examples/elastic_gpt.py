"""examples/gpt.py's GPT, trained as an elastic data-parallel job.

Ranks may die and join while it trains:

    dtorch-launch --elastic 2:4 --nproc-per-node 3 examples/elastic_gpt.py
    dtorch-launch --join --master-port PORT examples/elastic_gpt.py

The model, the text and the LR schedule are examples/gpt.py's (imported,
with its --n-layer/--n-head/--d-model/--block-size/--lr/--seed options);
the loop is examples/elastic_digits.py's (``job.epochs``, ``job.steps``,
``with step``; see there and dtorch.distributed.elastic). Elastic means
plain data parallelism: gpt.py's --tp/--pp/--cp/--dp are refused here (a
TP shard or a pipeline stage has no replica to rebuild a lost rank from).
An epoch is --windows fixed windows of --block-size characters drawn once
from the training text with --seed (gpt.py draws fresh ones each step: the
elastic sampler needs a dataset, so that every window of an epoch is
trained on exactly once across a resize). Without --elastic the script
runs as a fixed job or in one process.
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dtorch as torch  # noqa: E402
from dtorch.distributed import elastic  # noqa: E402
from dtorch.nn import functional as F  # noqa: E402
from dtorch.utils.data import TensorDataset  # noqa: E402
import gpt  # noqa: E402

# the options of gpt.py that apply here; the others (--dp/--tp/--pp/--cp,
# checkpoints, --steps, ...) are refused
MODEL_OPTIONS = ("--n-layer", "--n-head", "--d-model", "--block-size",
                 "--lr", "--seed", "--dtype")


def parse(argv):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        formatter_class=gpt.HelpFormatter,
        epilog="and gpt.py's " + ", ".join(MODEL_OPTIONS)
        + " (python examples/gpt.py --help)")
    ap.add_argument("--epochs", type=int, default=4, help="epochs to train")
    ap.add_argument("--windows", type=int, default=768,
                    help="training windows per epoch")
    ap.add_argument("--batch-size", type=int, default=48,
                    help="global batch (windows per step, split among "
                         "the ranks)")
    args, rest = ap.parse_known_args(argv)
    bad = [a.split("=")[0] for a in rest if a.startswith("--")
           and a.split("=")[0] not in MODEL_OPTIONS]
    if bad:
        raise SystemExit(
            f"elastic_gpt: {bad[0]} is not supported: an elastic job is "
            f"plain data parallelism over a fixed epoch (gpt.py options "
            f"here: {', '.join(MODEL_OPTIONS)}); run examples/gpt.py for "
            f"DP x TP x PP x CP, checkpoints and --max-restarts")
    model_args = gpt.parse(rest)    # the rest are gpt.py's options
    model_args.steps = args.epochs * -(-args.windows // args.batch_size)
    return args, model_args


def windows(data, n, block_size, seed):
    """``n`` (input, target) windows of the text, drawn once."""
    x, y = gpt.get_batch(data, n, block_size, seed, step=0, replica=0)
    return TensorDataset(x, y)


def main(argv=None):
    args, margs = parse(argv)
    chars, train, val = gpt.load_text()
    # built before the job forms its group: every layer is whole (TP 1)
    torch.manual_seed(margs.seed)
    model = gpt.GPT(len(chars), margs.n_layer, margs.n_head, margs.d_model,
                    margs.block_size).to(getattr(torch, margs.dtype))
    opt = torch.optim.AdamW(model.parameters(), lr=margs.lr,
                            betas=(0.9, 0.95), weight_decay=0.01)
    job = elastic.ElasticJob(
        model, opt, windows(train, args.windows, margs.block_size,
                            margs.seed),
        batch_size=args.batch_size, seed=margs.seed)
    xv, yv = gpt.get_batch(val, 64, margs.block_size, margs.seed + 1, 0, 0)
    t0, val_loss = time.time(), float("nan")
    for epoch in job.epochs(args.epochs):
        for step in job.steps():
            with step:
                for g in opt.param_groups:      # job.done: the global step
                    g["lr"] = gpt.lr_at(job.done, margs)
                x, y = step.batch
                opt.zero_grad()
                logits = job.model(x)
                # summed over windows (step.scale: the global mean), each
                # window's loss the mean over its characters
                loss = F.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                    reduction="sum") * (step.scale / margs.block_size)
                loss.backward()
                opt.step()
        # every rank holds the whole model: evaluating needs no collective
        with torch.no_grad():
            val_loss = gpt.loss_fn(model(xv), yv).item()
        if job.rank == 0:
            print(f"epoch {epoch + 1:2d}  val loss {val_loss:.4f}  "
                  f"({time.time() - t0:.1f} s, {job.world_size} ranks)",
                  flush=True)
    if job.rank == 0:
        print(f"final val loss {val_loss:.4f} (uniform: "
              f"{np.log(len(chars)):.4f}) on {job.world_size} ranks",
              flush=True)
    job.close()
    return val_loss


if __name__ == "__main__":
    main()

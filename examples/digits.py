"""Train a CNN on scikit-learn's digits in one process: the main job.

    python examples/digits.py [--epochs 15] [--checkpoint runs/digits.safetensors]
    python examples/digits.py --resume          # continue from the checkpoint
    python examples/digits.py --plot            # + loss/accuracy PNG

Plain PyTorch code with ``import dtorch as torch``; prints per-epoch metrics
under a tqdm progress bar (on a terminal only) and saves a checkpoint
(model, optimizer, scheduler, epoch, both RNG streams) after every epoch.
Without --resume a run starts fresh; with it, an unfinished run continues
exactly where the uninterrupted run would be (bitwise) and a finished one
is only reported. Each epoch's metrics (train/test loss, test accuracy, lr,
time) go to a JSON-lines file next to the checkpoint (--metrics), and
--plot draws them into a PNG at the end.
"""
import argparse
import json
import os
import sys
import time

from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dtorch as torch  # noqa: E402
from dtorch import nn  # noqa: E402
from dtorch.utils.data import DataLoader, TensorDataset  # noqa: E402
from digits_common import (DigitsCNN, discard, evaluate,  # noqa: E402
                           load_digits_split, plan_start, metrics_path,
                           open_metrics, plot_metrics)
from digits_common import HelpFormatter  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        formatter_class=HelpFormatter)
    ap.add_argument("--epochs", type=int, default=15, help="epochs to train")
    ap.add_argument("--batch-size", type=int, default=32, help="batch size")
    ap.add_argument("--lr", type=float, default=2e-3,
                    help="Adam's learning rate (cosine schedule)")
    ap.add_argument("--seed", type=int, default=0,
                    help="seed of the model, the data split and order")
    ap.add_argument("--checkpoint", default="runs/digits.safetensors",
                    help="written after every epoch")
    ap.add_argument("--resume", action="store_true",
                    help="continue from --checkpoint (a finished run is "
                         "only reported); without it a run starts fresh")
    ap.add_argument("--amp", action="store_true",
                    help="mixed precision: forward under autocast (the "
                         "convolutions and linears in --amp-dtype), float32 "
                         "master weights; float16 adds a GradScaler")
    ap.add_argument("--amp-dtype", default="bfloat16",
                    choices=["bfloat16", "float16"],
                    help="the low dtype of --amp")
    ap.add_argument("--metrics", default=None,
                    help="JSON-lines metrics, one line per epoch "
                         "(default: next to --checkpoint, .metrics.jsonl)")
    ap.add_argument("--plot", nargs="?", const="", default=None,
                    metavar="PNG",
                    help="write a loss/accuracy plot (default path: the "
                         "metrics file's, .png); needs matplotlib")
    ap.add_argument("--quiet", action="store_true",
                    help="no progress bar (there is none when stderr is "
                         "not a terminal)")
    ap.add_argument("--fail-at-epoch", type=int, default=-1,
                    help="testing: exit 3 at the start of this epoch "
                         "(0-based), as an interrupted run would")
    args = ap.parse_args(argv)

    torch.manual_seed(args.seed)
    xtr, ytr, xte, yte = load_digits_split(seed=args.seed)
    g = torch.Generator().manual_seed(args.seed)
    train = DataLoader(TensorDataset(xtr, ytr), batch_size=args.batch_size,
                       shuffle=True, generator=g)
    # its own generator: the test loader draws no number from the global
    # stream, which is dropout's alone
    test = DataLoader(TensorDataset(xte, yte), batch_size=256,
                      generator=torch.Generator().manual_seed(args.seed))
    model = DigitsCNN()
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, args.epochs)
    amp_dtype = getattr(torch, args.amp_dtype)
    # bfloat16 has float32's range: only float16 needs loss scaling
    scaler = torch.amp.GradScaler(
        "cpu", enabled=args.amp and amp_dtype is torch.float16)
    ck, finished, message = plan_start(args.checkpoint, args.epochs,
                                       args.resume)
    if message:
        print(message, flush=True)
    mpath = args.metrics or metrics_path(args.checkpoint)
    png = args.plot or os.path.splitext(mpath)[0] + ".png"
    if finished:
        if args.plot is not None and os.path.exists(mpath):
            print(f"plot: {plot_metrics(mpath, png)}", flush=True)
        print(f"final test accuracy {100 * ck['test_acc']:.2f}% (from the "
              f"checkpoint); checkpoint: {args.checkpoint}", flush=True)
        return ck["test_acc"]
    start = 0
    if ck is not None:
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        sched.load_state_dict(ck["scheduler"])
        if ck.get("scaler"):
            scaler.load_state_dict(ck["scaler"])
        g.set_state(ck["loader_rng"])
        # dropout's stream: without it a resumed run differs from an
        # uninterrupted one
        torch.set_rng_state(ck["rng"])
        start = ck["epoch"]
    elif os.path.exists(args.checkpoint):
        discard(args.checkpoint)

    metrics = open_metrics(mpath, start)
    t0 = time.time()
    acc = 0.0
    for epoch in range(start, args.epochs):
        if epoch == args.fail_at_epoch:
            print(f"failing on purpose at epoch {epoch}", flush=True)
            sys.exit(3)
        bar = tqdm(train, desc=f"epoch {epoch + 1}/{args.epochs}",
                   disable=True if args.quiet else None, leave=False)
        train_loss, n_seen = 0.0, 0
        for x, y in bar:
            opt.zero_grad()
            with torch.autocast("cpu", dtype=amp_dtype, enabled=args.amp):
                loss = nn.functional.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
            train_loss += loss.item() * len(y)
            n_seen += len(y)
        lr = opt.param_groups[0]["lr"]
        sched.step()
        correct, total, test_loss = evaluate(model, test)
        acc = correct / total
        print(f"epoch {epoch + 1:2d}  test loss {test_loss / total:.4f}  "
              f"test acc {100 * acc:.2f}%  ({time.time() - t0:.1f} s)",
              flush=True)
        # before the checkpoint: a crash in between leaves a line past the
        # checkpoint's epoch, which a resume drops (never a missing line)
        metrics.write(json.dumps({
            "epoch": epoch + 1, "train_loss": train_loss / max(n_seen, 1),
            "test_loss": test_loss / total, "test_acc": acc, "lr": lr,
            "time_s": round(time.time() - t0, 3)}) + "\n")
        os.makedirs(os.path.dirname(args.checkpoint) or ".", exist_ok=True)
        torch.save({"model": model.state_dict(),
                    "optimizer": opt.state_dict(),
                    "scheduler": sched.state_dict(),
                    **({"scaler": scaler.state_dict()}
                       if scaler.is_enabled() else {}),
                    "loader_rng": g.get_state(), "rng": torch.get_rng_state(),
                    "epoch": epoch + 1, "test_acc": acc}, args.checkpoint)
    metrics.close()
    if args.plot is not None:
        print(f"plot: {plot_metrics(mpath, png)}", flush=True)
    print(f"final test accuracy {100 * acc:.2f}% in "
          f"{time.time() - t0:.1f} s; checkpoint: {args.checkpoint}")
    return acc

if __name__ == "__main__":
    main()

"""Train a CNN on scikit-learn's digits in one process: the main job.

    python examples/digits.py [--epochs 15] [--checkpoint runs/digits.safetensors]
    python examples/digits.py --resume          # continue from the checkpoint

Plain PyTorch code with ``import dtorch as torch``; prints per-epoch metrics
under a tqdm progress bar and saves a checkpoint (model, optimizer, epoch,
RNG state) after every epoch.
"""
import argparse
import os
import sys
import time

from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dtorch as torch  # noqa: E402
from dtorch import nn  # noqa: E402
from dtorch.utils.data import DataLoader, TensorDataset  # noqa: E402
from digits_common import DigitsCNN, evaluate, load_digits_split  # noqa


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--checkpoint", default="runs/digits.safetensors")
    ap.add_argument("--resume", action="store_true",
                    help="continue from --checkpoint")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)

    torch.manual_seed(args.seed)
    xtr, ytr, xte, yte = load_digits_split(seed=args.seed)
    g = torch.Generator().manual_seed(args.seed)
    train = DataLoader(TensorDataset(xtr, ytr), batch_size=args.batch_size,
                       shuffle=True, generator=g)
    test = DataLoader(TensorDataset(xte, yte), batch_size=256)
    model = DigitsCNN()
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, args.epochs)
    start = 0
    if args.resume:
        if not os.path.exists(args.checkpoint):
            sys.exit(f"--resume: no checkpoint at {args.checkpoint}")
        ck = torch.load(args.checkpoint)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        sched.load_state_dict(ck["scheduler"])
        g.set_state(ck["loader_rng"])
        start = ck["epoch"] + 1
        print(f"resumed from {args.checkpoint} at epoch {start + 1}")

    t0 = time.time()
    acc = 0.0
    for epoch in range(start, args.epochs):
        bar = tqdm(train, desc=f"epoch {epoch + 1}/{args.epochs}",
                   disable=args.quiet, leave=False)
        for x, y in bar:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            bar.set_postfix(loss=f"{loss.item():.3f}")
        sched.step()
        correct, total, test_loss = evaluate(model, test)
        acc = correct / total
        print(f"epoch {epoch + 1:2d}  test loss {test_loss / total:.4f}  "
              f"test acc {100 * acc:.2f}%  ({time.time() - t0:.1f} s)",
              flush=True)
        os.makedirs(os.path.dirname(args.checkpoint) or ".", exist_ok=True)
        torch.save({"model": model.state_dict(),
                    "optimizer": opt.state_dict(),
                    "scheduler": sched.state_dict(),
                    "loader_rng": g.get_state(), "epoch": epoch,
                    "test_acc": acc}, args.checkpoint)
    print(f"final test accuracy {100 * acc:.2f}% in "
          f"{time.time() - t0:.1f} s; checkpoint: {args.checkpoint}")
    return acc


if __name__ == "__main__":
    main()

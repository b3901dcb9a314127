"""What the digits examples share: the data (scikit-learn's bundled 8x8
digits, no download), the CNN, evaluation, and when to resume from a
checkpoint. PyTorch code with ``import dtorch as torch``."""
import argparse
import gzip
import importlib.util
import os
import time

import numpy as np
from tqdm import tqdm

import dtorch as torch
from dtorch import nn
from optional_deps import require


def _load_digits():
    """(images N x 8 x 8, labels) of scikit-learn's bundled digits: read
    from the file load_digits reads (importing sklearn.datasets costs about
    1.3 s of CPU, more than a short run's data work), through load_digits
    where that file is not found."""
    try:
        spec = importlib.util.find_spec("sklearn")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        path = os.path.join(spec.submodule_search_locations[0], "datasets",
                            "data", "digits.csv.gz")
        if os.path.isfile(path):
            with gzip.open(path, "rt") as f:
                data = np.loadtxt(f, delimiter=",")
            return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int)
    datasets = require("sklearn.datasets", "scikit-learn", "examples",
                       "the digits data (scikit-learn's load_digits)")
    d = datasets.load_digits()
    return d.images, d.target


def load_digits_split(test_fraction=0.2, seed=0):
    """(x_train, y_train, x_test, y_test) as tensors; x is N x 1 x 8 x 8 in
    [0, 1]. The split is fixed by ``seed``."""
    images, target = _load_digits()
    x = (images / 16.0).astype(np.float32)[:, None]
    y = target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    n_test = int(len(y) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return (torch.from_numpy(x[train]), torch.from_numpy(y[train]),
            torch.from_numpy(x[test]), torch.from_numpy(y[test]))


class DigitsCNN(nn.Module):
    """Conv(1->16) - ReLU - Conv(16->32) - ReLU - MaxPool - MLP head."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2), nn.Flatten())
        self.head = nn.Sequential(nn.Linear(32 * 4 * 4, 64), nn.ReLU(),
                                  nn.Dropout(0.1), nn.Linear(64, 10))

    def forward(self, x):
        return self.head(self.features(x))


@torch.no_grad()
def evaluate(model, loader):
    """(correct, total, summed loss) over a loader."""
    model.eval()
    correct = total = 0
    loss = 0.0
    for x, y in loader:
        out = model(x)
        loss += nn.functional.cross_entropy(out, y, reduction="sum").item()
        correct += (out.argmax(1) == y).sum().item()
        total += len(y)
    model.train()
    return correct, total, loss


@torch.no_grad()
def distributed_accuracy(model, loader, group=None):
    """Accuracy over every rank's shard of a loader, the same on all ranks
    (``group``: the ranks whose shards differ, default the world)."""
    from dtorch.distributed.metrics import MetricSum
    model.eval()
    m = MetricSum(group=group)
    for x, y in loader:
        m.update(correct=(model(x).argmax(1) == y).sum(), total=len(y))
    model.train()
    r = m.compute()
    return r["correct"] / r["total"]


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """The examples' --help: each option's default once, "(default: X)"
    appended unless the help text says it already or there is none to
    show (None, a flag's False)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "(default" in text or action.default is None \
                or action.default is False:
            return text
        return super()._get_help_string(action)


def add_run_args(ap, name, per):
    """--lr, --seed, --checkpoint, --resume and --quiet as the distributed
    examples spell them; ``per``: what the learning rate is given for (1 rank, 1
    replica)."""
    ap.add_argument("--lr", type=float, default=2e-3,
                    help=f"Adam's learning rate at 1 {per} (times "
                         f"sqrt({per}s); cosine schedule)")
    ap.add_argument("--seed", type=int, default=0,
                    help="seed of the model, the data split and order")
    ap.add_argument("--checkpoint", default=f"runs/{name}",
                    help="distributed checkpoint (a directory) written "
                         "after every epoch")
    ap.add_argument("--resume", action="store_true",
                    help="continue from --checkpoint (a finished run is "
                         "only reported); a restarted job "
                         "(DTORCH_RESTART_COUNT > 0) always does")
    ap.add_argument("--quiet", action="store_true",
                    help="no progress bar (there is none when stderr is "
                         "not a terminal)")


def restart_count():
    """0 on a first run, n after n restarts of the job (dtorch-launch
    --max-restarts, a SLURM requeue: DTORCH_RESTART_COUNT)."""
    return int(os.environ.get("DTORCH_RESTART_COUNT") or 0)


def dcp_summary(path):
    """What ``plan_start`` needs from a distributed checkpoint (a directory
    of ``dcp.save``): its plain top-level values (epoch, test_acc, world,
    ...) and the names of its other entries, read from the metadata alone;
    {} for anything else (an older example's single-file checkpoint)."""
    import json
    import dtorch.distributed.checkpoint as dcp
    if not os.path.isdir(path):
        return {}
    try:
        meta = dcp.FileSystemReader(path).read_metadata()
    except (OSError, RuntimeError):    # not a (complete) checkpoint
        return {}
    out = {}
    for key, e in meta.raw["state_dict_metadata"].items():
        if "." not in key and "value" in e:
            out[key] = json.loads(e["value"])     # numbers, strings
        else:
            out.setdefault(key.split(".")[0], True)
    return out


def plan_start(path, epochs, resume, read=None):
    """Where a run starts: ``(checkpoint or None, finished, message)``.

    A checkpoint is resumed only when asked (``--resume``) or on a restart
    of the job, so running an example twice trains twice instead of
    resuming a finished run and training nothing. Asked to resume a
    finished run (``epoch >= epochs``), the run only reports it
    (``finished``); not asked, it starts fresh and says that it replaces
    the checkpoint. ``message`` says which (None: a plain fresh start).
    ``read``: how to read the checkpoint (default ``torch.load``; the
    distributed examples pass ``dcp_summary``)."""
    restarted = restart_count() > 0
    asked = resume or restarted
    if not os.path.exists(path):
        if resume and not restarted:
            raise SystemExit(f"--resume: no checkpoint at {path}")
        return None, False, (f"restart {restart_count()}: no checkpoint at "
                             f"{path} yet, starting fresh"
                             if restarted else None)
    ck = (read or torch.load)(path)
    missing = [k for k in ("epoch", "rng", "test_acc") if k not in ck]
    if missing:   # an older example's checkpoint: it cannot resume exactly
        if resume:
            raise SystemExit(f"--resume: {path} lacks {', '.join(missing)} "
                             f"(written by an older version of this "
                             f"example); run without --resume to start "
                             f"fresh")
        return None, False, (f"starting fresh: {path} is an older "
                             f"example's checkpoint, which this run "
                             f"replaces")
    done = int(ck["epoch"])
    if done >= epochs:
        if asked:
            return ck, True, (f"{path} holds a finished run ({done} "
                              f"epochs): reporting it (without --resume "
                              f"the run starts fresh)")
        return None, False, (f"starting fresh: {path} holds a finished run "
                             f"({done} epochs), which this run replaces "
                             f"(--resume reports it instead)")
    if asked:
        return ck, False, f"resuming from {path} at epoch {done + 1}"
    return None, False, (f"starting fresh: {path} holds an unfinished run "
                         f"({done} epochs done), which this run replaces "
                         f"(--resume continues it)")


def discard(path):
    """Remove a checkpoint that a fresh run replaces, so that a restart of
    this run can never resume the earlier run's state."""
    if os.path.isdir(path):           # a distributed checkpoint
        import shutil
        shutil.rmtree(path, ignore_errors=True)
        return
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def everyone_stops(mine):
    """True on every rank when any rank wants to stop (SIGUSR1 before a
    preemption). The signal reaches ranks at different steps; stopping at
    different steps would leave their collectives unmatched (a hang), so
    the ranks agree after each step."""
    import dtorch.distributed as dist
    flag = torch.tensor([1.0 if mine else 0.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return flag.item() > 0


def report_finished(ck, rank, layout=""):
    """A finished run's checkpoint ``ck`` is only reported (rank 0 prints
    its accuracy; ``layout`` comes before "from the checkpoint"); returns
    the accuracy once every rank is there."""
    import dtorch.distributed as dist
    if rank == 0:
        print(f"final test accuracy {100 * ck['test_acc']:.2f}% on "
              f"{ck.get('world', '?')} ranks ({layout}from the checkpoint)",
              flush=True)
    dist.barrier()
    return ck["test_acc"]


def train_epochs(model, opt, sched, sampler, loader, start, acc, args, *,
                 rank, stop, save, accuracy, report, before_epoch=None):
    """The epoch loop of the distributed examples (ddp_digits, tp_digits),
    from epoch ``start`` to ``args.epochs``: after each epoch the scheduler
    steps, ``accuracy()`` gives the test accuracy, rank 0 prints
    ``report(epoch, acc, loss, seconds)`` and ``save(next_epoch, acc)``
    checkpoints. When any rank's ``stop[0]`` is set (SIGUSR1 before a
    preemption) every rank stops after the same step and saves the epoch
    in progress (the sampler knows how far it got) for the requeued job.
    ``before_epoch(epoch)`` runs at the start of each epoch. Returns
    ``(test accuracy, stopped)``."""
    t0 = time.time()
    for epoch in range(start, args.epochs):
        if epoch != sampler.epoch:
            sampler.set_epoch(epoch)
        if before_epoch is not None:
            before_epoch(epoch)
        # disable=None: no bar when stderr is not a terminal (log files)
        bar = tqdm(loader, desc=f"epoch {epoch + 1}/{args.epochs}",
                   disable=True if args.quiet or rank != 0 else None,
                   leave=False)
        stopped = False
        for x, y in bar:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            if everyone_stops(stop[0]):
                stopped = True
                break
        if stopped:
            save(epoch, acc)
            if rank == 0:
                print("SIGUSR1: checkpointed, exiting for requeue",
                      flush=True)
            return acc, True
        sched.step()
        sampler.set_epoch(epoch + 1)
        acc = accuracy()
        if rank == 0:
            print(report(epoch, acc, loss, time.time() - t0), flush=True)
        save(epoch + 1, acc)
    return acc, False


def metrics_path(checkpoint):
    """Where a run's metrics go by default: next to its checkpoint."""
    return os.path.splitext(checkpoint.rstrip("/"))[0] + ".metrics.jsonl"


def open_metrics(path, start_epoch):
    """The metrics file (JSON lines, one per epoch) opened for appending,
    holding the records of epochs 1..start_epoch only: a fresh run
    (start 0) starts an empty file, a resumed one drops what a crash wrote
    after its checkpoint, so each epoch appears once."""
    import json
    kept = []
    if start_epoch and os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:          # a line cut by the crash
                    continue
                if rec.get("epoch", 0) <= start_epoch:
                    kept.append(line if line.endswith("\n") else line + "\n")
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        f.writelines(kept)
    return open(path, "a", buffering=1)     # line-buffered: one flush/epoch


def read_metrics(path):
    import json
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def plot_metrics(path, png):
    """Loss (train and test) and test accuracy per epoch as a PNG.
    Needs matplotlib (the examples extra installs it)."""
    matplotlib = require("matplotlib", "matplotlib", "examples", "--plot")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    recs = read_metrics(path)
    if not recs:
        raise SystemExit(f"--plot: {path} holds no epochs to plot")
    ep = [r["epoch"] for r in recs]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.5), dpi=100)
    a1.plot(ep, [r["train_loss"] for r in recs], marker="o", label="train")
    a1.plot(ep, [r["test_loss"] for r in recs], marker="o", label="test")
    a1.set_xlabel("epoch")
    a1.set_ylabel("cross-entropy")
    a1.set_yscale("log")
    a1.legend()
    a1.set_title("loss")
    a2.plot(ep, [100 * r["test_acc"] for r in recs], marker="o",
            color="tab:green")
    a2.set_xlabel("epoch")
    a2.set_ylabel("test accuracy (%)")
    a2.set_title("accuracy")
    for a in (a1, a2):
        a.grid(True, alpha=0.3)
    fig.tight_layout()
    os.makedirs(os.path.dirname(png) or ".", exist_ok=True)
    fig.savefig(png)
    plt.close(fig)
    return png

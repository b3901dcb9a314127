"""dtorch's DataLoader against PyTorch's on the same datasets, in the same
run (issue 16). Not a test: figures depend on the machine and its load.

Workloads (one Python object serves both loaders: both accept any map-style
dataset, and both use ``__getitems__`` when it exists):

- ``images``: 8,192 uint8 images 3x36x36 in memory; per sample a NumPy
  random 32x32 crop, a random horizontal flip, float32 scaling;
  batch 128 (1.5 MiB of float32 per batch).
- ``tokens``: windows of 257 tokens from a 4M-token uint16 file through a
  memory map (``MemmapTokenDataset``), shuffled; batch 32.

For 0, 1 and 2 workers each loader is timed for:

- ``samples/s``: a loop that does nothing with its batches (loader-bound);
- ``CPU us/sample``: CPU time of the main process and the workers per
  sample during that loop (steadier than wall time on a loaded machine);
- ``wait ms``: the mean time the main process spends in ``next()`` per
  batch while the loop does ``--step-ms`` of NumPy work per batch (what a
  training loop waits; with workers this is the main process's share:
  receiving and rebuilding the batch).

The two loaders alternate run by run (``--repeats``), and the ratios
dtorch / PyTorch are reported as min..max over the runs, since other
processes load the machine unevenly.

    python benchmarks/dataloader.py [--repeats 3] [--batches 60]
        [--out benchmarks/results/dataloader.json]
"""
import argparse
import gc
import json
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import dtorch  # noqa: E402
from dtorch.utils.data import DataLoader, MemmapTokenDataset  # noqa: E402


class Images:
    """Small images with a NumPy random crop + flip (randomness from the
    worker-seeded global NumPy RNG, as torchvision-free scripts do)."""

    def __init__(self, n=8192, size=36, crop=32):
        rng = np.random.default_rng(0)
        self.data = rng.integers(0, 256, (n, 3, size, size), dtype=np.uint8)
        self.labels = rng.integers(0, 10, n)
        self.size, self.crop = size, crop

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        top, left = np.random.randint(0, self.size - self.crop + 1, 2)
        x = self.data[i, :, top:top + self.crop, left:left + self.crop]
        if np.random.rand() < 0.5:
            x = x[:, :, ::-1]
        return x.astype(np.float32) * (1 / 255), int(self.labels[i])


def _busy(ms):
    """About ``ms`` of NumPy work: the training step of the loop."""
    end = time.perf_counter() + ms / 1000
    a = np.ones((64, 64), np.float32)
    while time.perf_counter() < end:
        a = a @ a * 1e-3


def _cpu_seconds(pids):
    """User + system CPU time of this process and of ``pids``."""
    tick = os.sysconf("SC_CLK_TCK")
    total = time.process_time()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except OSError:
            pass
    return total


def _time(loader, batches, step_ms, batch_size):
    it = iter(loader)
    next(it)                                  # workers started, warm
    pids = [w.pid for w in getattr(it, "_workers", [])]
    c0 = _cpu_seconds(pids)
    t0 = time.perf_counter()
    n = 0
    for _ in range(batches):
        next(it)
        n += 1
    rate = n * batch_size / (time.perf_counter() - t0)
    cpu_us = (_cpu_seconds(pids) - c0) / (n * batch_size) * 1e6
    del it
    it = iter(loader)
    next(it)
    waited = 0.0
    for _ in range(batches):
        _busy(step_ms)
        t = time.perf_counter()
        next(it)
        waited += time.perf_counter() - t
    del it
    return rate, waited / batches * 1000, cpu_us, pids


def _settle(pids, limit=10.0):
    """Wait until a finished loader's workers have exited, so that they do
    not compete with the next measurement."""
    gc.collect()
    end = time.perf_counter() + limit
    while time.perf_counter() < end and any(
            os.path.exists(f"/proc/{p}") for p in pids):
        time.sleep(0.01)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batches", type=int, default=60)
    ap.add_argument("--step-ms", type=float, default=20.0)
    ap.add_argument("--workers", default="0,1,2")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import torch
    import torch.utils.data
    torch.set_num_threads(1)
    tmp = tempfile.mkdtemp()
    path = os.path.join(tmp, "tokens.bin")
    np.random.default_rng(1).integers(0, 50257, 4 * 2 ** 20).astype(
        np.uint16).tofile(path)
    work = {"images": (Images(), 128),
            "tokens": (MemmapTokenDataset(path, 256), 32)}
    results = []
    for name, (ds, bs) in work.items():
        for nw in [int(w) for w in args.workers.split(",")]:
            runs = {"dtorch": [], "torch": []}
            for r in range(args.repeats):
                order = ("dtorch", "torch") if r % 2 == 0 else \
                    ("torch", "dtorch")
                for impl in order:
                    cls = DataLoader if impl == "dtorch" else \
                        torch.utils.data.DataLoader
                    g = (dtorch.Generator() if impl == "dtorch"
                         else torch.Generator()).manual_seed(r)
                    loader = cls(ds, batch_size=bs, shuffle=True,
                                 num_workers=nw, generator=g,
                                 persistent_workers=nw > 0)
                    *res, pids = _time(loader, args.batches, args.step_ms,
                                       bs)
                    runs[impl].append(res)
                    del loader
                    _settle(pids)
            rate = [d[0] / t[0] for d, t in zip(runs["dtorch"],
                                                runs["torch"])]
            wait = [d[1] / t[1] for d, t in zip(runs["dtorch"],
                                                runs["torch"])]
            cpu = [d[2] / t[2] for d, t in zip(runs["dtorch"],
                                               runs["torch"])]
            row = {"workload": name, "num_workers": nw,
                   "dtorch_cpu_us_per_sample": [round(d[2], 2)
                                                for d in runs["dtorch"]],
                   "torch_cpu_us_per_sample": [round(t[2], 2)
                                               for t in runs["torch"]],
                   "cpu_ratio": [min(cpu), max(cpu)],
                   "dtorch_samples_s": [round(d[0]) for d in runs["dtorch"]],
                   "torch_samples_s": [round(t[0]) for t in runs["torch"]],
                   "dtorch_wait_ms": [round(d[1], 3)
                                      for d in runs["dtorch"]],
                   "torch_wait_ms": [round(t[1], 3) for t in runs["torch"]],
                   "rate_ratio": [min(rate), max(rate)],
                   "wait_ratio": [min(wait), max(wait)]}
            results.append(row)
            def span(xs, fmt="{:.0f}"):
                return fmt.format(min(xs)) + ".." + fmt.format(max(xs))
            print(f"{name:7s} workers={nw}  samples/s dtorch "
                  f"{span(row['dtorch_samples_s'])} torch "
                  f"{span(row['torch_samples_s'])} ratio "
                  f"{span(rate, '{:.2f}')} | wait ms/batch dtorch "
                  f"{span(row['dtorch_wait_ms'], '{:.3f}')} torch "
                  f"{span(row['torch_wait_ms'], '{:.3f}')} ratio "
                  f"{span(wait, '{:.2f}')} | CPU us/sample (main + "
                  f"workers) ratio {span(cpu, '{:.2f}')}", flush=True)
    os.remove(path)
    os.rmdir(tmp)
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"load_note": "shared 2-core machine, other agents "
                       "running: ratios are ranges over runs",
                       "results": results}, f, indent=1)


if __name__ == "__main__":
    main()

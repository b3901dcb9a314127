"""Deterministic data parallelism (issue 26): the same bits on any number of
ranks, and what it costs.

(a) hashes: an MLP with dropout, AdamW and clip_grad_norm_ under DDP with a
    DistributedSampler, global batch 24, trained --steps (50) steps on 1, 2,
    3 and 4 thread ranks, in deterministic and in normal mode: the sha256
    of each run's final state (parameters, gradients, AdamW state, RNG
    state), side by side.
(b) cost: step time (the process's CPU seconds per step and rank: every
    thread, so DDP's communication thread too; ranges over --repeats runs,
    interleaved) of deterministic vs normal mode at 1 and 2 thread ranks
    for an MLP, a CNN and a small GPT, and the bytes the collectives are
    given per step per rank (counted at the process group).

    python benchmarks/determinism.py [--steps 50] [--repeats 3]
        [--only hashes,mlp,cnn,cnn_bn,gpt] [--virtual-shards 12]
        [--threads N]

Deterministic mode is timed twice: with its virtual shards replayed by
dtorch.compile (the default, ``compile_shards=None``) and eagerly
(``compile_shards=False``); both must give the same hash (printed). The
BLAS pool's threads spin on a loaded machine and count as CPU time, so
``--threads 1`` (torch.set_num_threads) times the Python and arithmetic
alone.

CPU time, not wall time: the machine this runs on is shared and loaded
(the load average is printed); the thread ranks of one process share its
cores, so wall time would mostly measure the other ranks and neighbours.
"""
import argparse
import hashlib
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))

import dtorch as torch  # noqa: E402
import dtorch.distributed as dist  # noqa: E402
import dtorch.nn.functional as F  # noqa: E402
from dtorch import nn  # noqa: E402
from dtorch.nn.parallel import DistributedDataParallel as DDP  # noqa
from dtorch.utils.data import (DataLoader, DistributedSampler,  # noqa
                               TensorDataset)


def state_sha(model, opt):
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
        h.update(p.grad.numpy().tobytes())
    for st in opt.state.values():
        for k in sorted(st):
            v = st[k]
            h.update(np.asarray(v.numpy() if hasattr(v, "numpy") else v)
                     .tobytes())
    h.update(repr(torch.get_rng_state()).encode())
    return h.hexdigest()


# ------------------------------------------------------------- models --

def mlp():
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Dropout(0.1),
                         nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))


def cnn():
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1),
                         nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(32 * 7 * 7, 64), nn.ReLU(),
                         nn.Linear(64, 10))


def cnn_bn():
    """The CNN with a SyncBatchNorm after each convolution (deterministic
    mode runs a rank's shards in lockstep threads: _lockstep.py)."""
    return nn.SyncBatchNorm.convert_sync_batchnorm(nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1),
        nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(32 * 7 * 7, 64), nn.ReLU(), nn.Linear(64, 10)))


class GPT(nn.Module):
    """2 pre-LN causal blocks, d 64, 4 heads, seq 32, vocab 128."""

    def __init__(self, vocab=128, d=64, seq=32):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(nn.TransformerEncoderLayer(
            d, 4, 4 * d, dropout=0.1, activation="gelu", batch_first=True,
            norm_first=True) for _ in range(2))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)
        self.mask = nn.Transformer.generate_square_subsequent_mask(seq)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for b in self.blocks:
            x = b(x, src_mask=self.mask, is_causal=True)
        return self.head(self.ln(x))


def data(kind, n, g):
    if kind == "mlp":
        return torch.randn(n, 64, generator=g), torch.randint(
            0, 10, (n,), generator=g)
    if kind in ("cnn", "cnn_bn"):
        return torch.randn(n, 1, 28, 28, generator=g), torch.randint(
            0, 10, (n,), generator=g)
    tok = torch.randint(0, 128, (n, 33), generator=g)
    return tok[:, :-1], tok[:, 1:]


MODELS = {"mlp": mlp, "cnn": cnn, "cnn_bn": cnn_bn, "gpt": GPT}


# ------------------------------------------------------------ training --

def count_bytes(group):
    """Wrap the group's collectives to add up the bytes each is given."""
    moved = [0]
    for name in ("all_reduce", "all_reduce_coalesced", "broadcast",
                 "all_gather", "reduce_scatter"):
        real = getattr(group, name)

        def wrapped(*a, _real=real, **k):
            for x in a:
                for arr in (x if isinstance(x, (list, tuple)) else [x]):
                    moved[0] += getattr(arr, "nbytes", 0)
            return _real(*a, **k)
        setattr(group, name, wrapped)
    return moved


def train_step(ddp, opt, x, y):
    """One optimizer step: cross-entropy, clip_grad_norm_ 1.0, AdamW."""
    out = ddp(x)
    loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    opt.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
    opt.step()


def train(rank, world, kind, det, steps, batch, shards=None,
          compiled=None):
    torch.use_deterministic_algorithms(det)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    ds = TensorDataset(*data(kind, batch * 10, g))
    model = MODELS[kind]()
    moved = count_bytes(dist.group.WORLD)
    ddp = DDP(model, virtual_shards=shards, compile_shards=compiled)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    sampler = DistributedSampler(ds, shuffle=True, seed=3)
    loader = DataLoader(ds, batch_size=batch // world, sampler=sampler,
                        generator=torch.Generator().manual_seed(9))
    times, step, start_bytes = [], 0, moved[0]
    for epoch in range(10 ** 6):
        sampler.set_epoch(epoch)
        for x, y in loader:
            train_step(ddp, opt, x, y)
            times.append(time.process_time())
            step += 1
            if step == 1:
                start_bytes = moved[0]      # after DDP's set-up broadcast
            if step == steps:
                per_step = (moved[0] - start_bytes) / max(steps - 1, 1)
                cpu = (times[-1] - times[0]) / (steps - 1) / world
                return state_sha(model, opt), cpu, per_step


def hashes(steps):
    print(f"(a) sha256 of the final state after {steps} steps (MLP, dropout,"
          f" AdamW, clip_grad_norm_, sampler, global batch 24)")
    for det in (True, False):
        row = []
        for w in (1, 2, 3, 4):
            res = dist.spawn_threads(
                lambda r, n: train(r, n, "mlp", det, steps, 24)[0], w)
            assert len(set(res)) == 1, "ranks of one run disagree"
            row.append(res[0][:16])
        mode = "deterministic" if det else "normal       "
        print(f"  {mode}  " + "  ".join(f"{w} rank{'s' if w > 1 else ' '}:"
                                         f" {h}" for w, h in
                                         zip((1, 2, 3, 4), row)))


def cost(kinds, steps, repeats, shards):
    batch = {"mlp": 96, "cnn": 24, "cnn_bn": 24, "gpt": 24}
    print(f"\n(b) ms of CPU per step and rank (over {steps - 1} steps; "
          f"range over {repeats} runs, interleaved), bytes per step per "
          f"rank; virtual shards {shards or 12}")
    print("  deterministic: shards replayed by dtorch.compile (compiled) "
          "and eager shards (eager); ratios to normal mode, run by run")
    print(f"  {'model':6} {'ranks':>5} {'normal ms':>13} "
          f"{'det compiled ms':>15} {'ratio':>11} {'det eager ms':>13} "
          f"{'ratio':>11} {'bytes n/det':>17} same hash "
          f"compiled/eager")
    modes = ("normal", "compiled", "eager")
    for kind in kinds:
        for w in (1, 2):
            runs = {m: [] for m in modes}
            moved, shas = {}, {}
            for _ in range(repeats):
                for m in modes:
                    res = dist.spawn_threads(lambda r, n: train(
                        r, n, kind, m != "normal", steps, batch[kind],
                        shards, False if m == "eager" else None), w)
                    runs[m].append(res[0][1] * 1e3)
                    moved[m], shas[m] = res[0][2], res[0][0]

            def rng(v):
                return f"{min(v):6.1f}-{max(v):6.1f}"

            def ratio(m, to="normal"):
                r = [b / a for a, b in zip(runs[to], runs[m])]
                return f"{min(r):4.2f}-{max(r):4.2f}x"
            print(f"  {kind:6} {w:5} {rng(runs['normal'])} "
                  f"{rng(runs['compiled'])} {ratio('compiled')} "
                  f"{rng(runs['eager'])} {ratio('eager')} "
                  f"{moved['normal']:>8.0f}/{moved['compiled']:<8.0f} "
                  f"{shas['compiled'] == shas['eager']!s:9} "
                  f"{ratio('compiled', 'eager')}")


def model_step(kind, mode, steps, shards):
    """CPU ms (this thread) of the model step alone at 1 rank: one fixed
    batch, no data loading; mode "normal", "eager" or "compiled" shards."""
    torch.use_deterministic_algorithms(mode != "normal")
    torch.manual_seed(0)
    x, y = data(kind, {"mlp": 96}.get(kind, 24), torch.Generator()
                .manual_seed(1))
    model = MODELS[kind]()
    ddp = DDP(model, virtual_shards=shards,
              compile_shards=False if mode == "eager" else None)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    for s in range(steps + 3):          # 3 warm-up steps (the captures)
        if s == 3:
            t = time.thread_time()
        train_step(ddp, opt, x, y)
    return (time.thread_time() - t) / steps * 1e3


def step_cost(kinds, repeats, shards):
    print(f"\n(c) the model step alone, 1 rank, CPU ms of its thread (30 "
          f"steps; range over {repeats} interleaved runs); virtual shards "
          f"{shards or 12}")
    modes = ("normal", "eager", "compiled")
    for kind in kinds:
        ms = {m: [] for m in modes}
        for _ in range(repeats):
            for m in modes:
                ms[m].append(dist.spawn_threads(
                    lambda r, n: model_step(kind, m, 30, shards), 1)[0])

        def ratio(m, to="normal"):
            r = [b / a for a, b in zip(ms[to], ms[m])]
            return f"{min(r):4.2f}-{max(r):4.2f}x"
        print(f"  {kind:6} normal {min(ms['normal']):6.2f}-"
              f"{max(ms['normal']):6.2f}  det eager {ratio('eager')}  det "
              f"compiled {ratio('compiled')}  compiled/eager "
              f"{ratio('compiled', 'eager')}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", default="hashes,mlp,cnn,cnn_bn,gpt")
    ap.add_argument("--virtual-shards", type=int, default=None)
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    only = a.only.split(",")
    print("load:", os.getloadavg(), "cores:", os.cpu_count(),
          "threads:", a.threads or "default")
    if "hashes" in only:
        hashes(a.steps)
    kinds = [k for k in only if k in MODELS]
    if kinds:
        cost(kinds, min(a.steps, 12), a.repeats, a.virtual_shards)
        step_cost([k for k in kinds if k != "cnn_bn"], a.repeats,
                  a.virtual_shards)


if __name__ == "__main__":
    main()

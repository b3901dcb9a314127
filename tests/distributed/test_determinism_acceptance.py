"""Issue 26's acceptance: under ``use_deterministic_algorithms(True)`` the
hash of the full training state after 20 steps (parameters, gradients,
AdamW state, BatchNorm statistics, RNG state and every sample's loss) is
the same on 1, 2, 3 and 4 thread ranks, on 3 tcp processes, under
mpiexec -n 2 / 3, and after a save by 2 ranks resumed by 3 mid-epoch:
with dropout, SyncBatchNorm, gradient accumulation, clipping and AdamW
for a classifier and for a padded token LM with variable lengths
normalised by the global token count (``train``).

This file is also the tcp ranks' script (``dtorch-launch --nproc-per-node
N test_determinism_acceptance.py OUT CKPT``: resume CKPT, rank r writes
its digest to OUT.r)."""
import contextlib
import hashlib
import os
import sys

import pytest

_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# tests/ (the shared helpers) and the checkout above it: run as a script
# under an editable install, a rank would otherwise import tests/collectives
# and tests/launch (namespace directories) as the packages of those names
sys.path[:0] = [_TESTS, os.path.dirname(_TESTS)]

import dtorch as torch  # noqa: E402
import dtorch.distributed as dist  # noqa: E402
import dtorch.distributed.checkpoint as dcp  # noqa: E402
import dtorch.nn.functional as F  # noqa: E402
from dtorch import nn  # noqa: E402
from dtorch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from dtorch.utils.data import (DataLoader, DistributedSampler,  # noqa: E402
                               TensorDataset)
from test_determinism_ddp import (_checkpoint, deterministic,  # noqa
                                  epochs, state_digest)

HERE = os.path.abspath(__file__)
STEPS, BATCH, ACCUM = 20, 48, 2      # 240 samples: 5 steps an epoch


def _classifier():
    g = torch.Generator().manual_seed(1)
    ds = TensorDataset(torch.randn(240, 10, generator=g),
                       torch.randint(0, 3, (240,), generator=g))
    model = nn.SyncBatchNorm.convert_sync_batchnorm(nn.Sequential(
        nn.Linear(10, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.2),
        nn.Linear(16, 3)))

    def loss(out, y, group):
        per = F.cross_entropy(out, y, reduction="none")
        return per.mean() / ACCUM, per
    return ds, model, loss


def _token_lm():
    """Padded sequences of lengths 2-8; the loss of a step is the sum
    over its valid tokens (all ranks, both micro-batches) over their
    count, written as a mean over the rank's samples of each sample's
    token sum times (global micro-batch / count): every factor of the
    gradient is then the same on any world size (a per-rank mean of
    means is not, and is not the global token mean either)."""
    g = torch.Generator().manual_seed(2)
    n, seq, vocab = 240, 8, 16
    tok = torch.randint(0, vocab, (n, seq + 1), generator=g)
    lengths = torch.randint(2, seq + 1, (n,), generator=g)
    tgt = tok[:, 1:].clone()
    tgt[torch.arange(seq)[None, :] >= lengths[:, None]] = -100
    model = nn.Sequential(nn.Embedding(vocab, 12), nn.Dropout(0.1),
                          nn.Linear(12, vocab))

    def loss(out, y, group):
        count = sum((b != -100).sum() for _, b in group)
        dist.all_reduce(count)          # integers: exact in any order
        per = F.cross_entropy(out.transpose(1, 2), y, ignore_index=-100,
                              reduction="none").sum(1)
        return (per * (BATCH / ACCUM / count.item())).mean(), per
    return TensorDataset(tok[:, :-1], tgt), model, loss


def _gathered(per, world):
    """Per-sample values of all ranks in global batch order."""
    parts = [torch.zeros_like(per) for _ in range(world)]
    dist.all_gather(parts, per.detach())
    return torch.stack(parts, 1).reshape(-1)


@deterministic
def train(rank, world, job=_classifier, steps=STEPS, save=None,
          resume=None):
    """``job``'s model under DDP, ACCUM micro-batches per step (no_sync),
    clip_grad_norm_, AdamW; the sha256 of the whole state at ``steps``
    (``save=(path, step)``: checkpoint there and stop)."""
    torch.manual_seed(0)
    ds, model, loss_of = job()
    ddp = DDP(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
    sampler = DistributedSampler(ds, shuffle=True, seed=3)
    loader = DataLoader(ds, batch_size=BATCH // world // ACCUM,
                        sampler=sampler,
                        generator=torch.Generator().manual_seed(9))
    step, losses = 0, []
    if resume is not None:
        step = _checkpoint(dcp.load, resume, ddp, opt, sampler, step)
    for _ in epochs(sampler, resume is not None):
        it = iter(loader)
        for group in zip(*[it] * ACCUM):
            for i, (x, y) in enumerate(group):
                with (ddp.no_sync() if i < ACCUM - 1
                      else contextlib.nullcontext()):
                    loss, per = loss_of(ddp(x), y, group)
                    if step >= 14:   # the resumed runs see these too
                        losses.append(_gathered(per, world))
                    loss.backward()
            nn.utils.clip_grad_norm_(ddp.parameters(), 0.5)
            opt.step()
            step += 1
            if save is not None and step == save[1]:
                return _checkpoint(dcp.save, save[0], ddp, opt,
                                   sampler, step)
            if step == steps:
                h = hashlib.sha256(state_digest(model, opt, losses)
                                   .encode())
                for b in model.buffers():
                    h.update(b.numpy().tobytes())
                return h.hexdigest()
            opt.zero_grad()


def _lm(rank, world):
    return train(rank, world, job=_token_lm)


_ONE = {}


def one_rank(fn):
    """The 1-rank digest of ``fn`` (computed once per session)."""
    if fn not in _ONE:
        _ONE[fn] = dist.spawn_threads(fn, 1)[0]
    return _ONE[fn]


@pytest.mark.parametrize("fn", [train, _lm], ids=["syncbn", "token_lm"])
def test_one_hash_on_1_2_3_4_thread_ranks(fn):
    one = one_rank(fn)
    for world in (2, 3, 4):
        assert set(dist.spawn_threads(fn, world)) == {one}, world


def test_resume_of_a_2_rank_checkpoint_on_3_ranks_mid_epoch(tmp_path):
    """Saved by 2 ranks at step 7 (2 steps into the second epoch),
    resumed by 3: the bits of the uninterrupted 1-rank run."""
    path = str(tmp_path / "ck")
    dist.spawn_threads(lambda r, n: train(r, n, save=(path, 7)), 2)
    res = dist.spawn_threads(lambda r, n: train(r, n, resume=path), 3)
    assert set(res) == {one_rank(train)}


@pytest.mark.timeout(180)
def test_3_tcp_processes_resume_a_2_rank_checkpoint(tmp_path):
    """Saved by 2 thread ranks, resumed by 3 tcp processes (one job:
    SyncBatchNorm's collectives and the resume over tcp): the bits of
    the uninterrupted 1-rank run."""
    from launch_scripts.harness import launch
    ck, out = str(tmp_path / "ck"), str(tmp_path / "h")
    dist.spawn_threads(lambda r, n: train(r, n, save=(ck, 7)), 2)
    rc, _, err, _ = launch(["--nproc-per-node", "3", "--backend", "tcp",
                            HERE, out, ck], timeout=150)
    assert rc == 0, err[-3000:]
    assert {open(f"{out}.{r}").read() for r in range(3)} == {
        one_rank(train)}


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("fn", [train, _lm], ids=["syncbn", "token_lm"])
def test_mpi_world_gives_the_thread_ranks_bits(mpi_world, fn):
    one = dist.spawn_threads(fn, 1)[0]
    assert fn(dist.get_rank(), dist.get_world_size()) == one


@pytest.mark.mpi(min_size=2)
def test_mpi_world_resumes_a_2_rank_checkpoint(mpi_world, tmp_path):
    """Rank 0 saves a checkpoint with 2 thread ranks; the MPI world
    (2 or 3 processes) resumes it: the bits of the 1-rank run."""
    box = [str(tmp_path / "ck")]
    dist.broadcast_object_list(box, 0)        # rank 0's directory
    if dist.get_rank() == 0:
        dist.spawn_threads(lambda r, n: train(r, n, save=(box[0], 7)), 2)
    dist.barrier()
    got = train(dist.get_rank(), dist.get_world_size(), resume=box[0])
    assert got == dist.spawn_threads(train, 1)[0]
    dist.barrier()                            # before rank 0's tmp goes


if __name__ == "__main__":
    dist.init_process_group("tcp")
    h = train(dist.get_rank(), dist.get_world_size(), resume=sys.argv[2])
    with open(f"{sys.argv[1]}.{dist.get_rank()}", "w") as f:
        f.write(str(h))

"""A training script's resume (issue: the loader's draws from the default
generator): train, save ``dtorch.get_rng_state()`` and
``loader.state_dict()``, start again with fresh objects, restore both and
go on. The resumed run must see the same batches, the same dropout masks
and end with the same RNG states as the run that was never interrupted,
mid-epoch or at an epoch boundary, with and without workers, shuffled or
not, with or without ``generator=``."""
import pytest

import dtorch
import dtorch.nn.functional as F
from dtorch.utils.data import DataLoader, DistributedSampler, TensorDataset

_N, _BS, _EPOCHS = 10, 4, 3          # 3 batches an epoch


def _setup(nw, shuffle, gen, distributed=False):
    g = dtorch.Generator().manual_seed(5) if gen else None
    ds = TensorDataset(dtorch.arange(_N, dtype=dtorch.float64))
    if distributed:       # a script that never calls set_epoch
        sampler = DistributedSampler(ds, num_replicas=1, rank=0,
                                     shuffle=shuffle)
        return g, DataLoader(ds, batch_size=_BS, sampler=sampler,
                             num_workers=nw, generator=g)
    return g, DataLoader(ds, batch_size=_BS, shuffle=shuffle,
                         num_workers=nw, generator=g)


def _step(loader_batch, log):
    """One training step: the batch and a dropout mask from the default
    generator."""
    (x,) = loader_batch
    mask = F.dropout(dtorch.ones(4), 0.5, training=True)
    log.append((x.numpy().tolist(), mask.numpy().tolist()))


def _states(g):
    return (dict(dtorch.get_rng_state()),
            None if g is None else dict(g.get_state()))


def _train(loader, log, epochs, stop=None):
    """``epochs`` epochs from epoch 0; ``stop=(epoch, k)``: stop after
    ``k`` batches of that epoch (k=None: after its loop ended)."""
    for epoch in range(epochs):
        for k, b in enumerate(loader):
            _step(b, log)
            if stop == (epoch, k + 1):
                return
        if stop == (epoch, None):
            return


def _check(nw, shuffle, gen, stop, distributed=False):
    dtorch.manual_seed(0)
    g, loader = _setup(nw, shuffle, gen, distributed)
    full = []
    _train(loader, full, _EPOCHS)
    end = _states(g)

    dtorch.manual_seed(0)
    g, loader = _setup(nw, shuffle, gen, distributed)
    got = []
    _train(loader, got, _EPOCHS, stop)
    ckpt = {"rng": dtorch.get_rng_state(), "loader": loader.state_dict()}
    del loader, g                     # the job is killed

    dtorch.manual_seed(1234)          # the new process seeds as it likes
    g, loader = _setup(nw, shuffle, gen, distributed)
    dtorch.set_rng_state(ckpt["rng"])
    loader.load_state_dict(ckpt["loader"])
    epoch, k = stop
    first = epoch if k is not None else epoch + 1
    for _ in range(first, _EPOCHS):
        for b in loader:
            _step(b, got)
    assert len(got) == len(full)
    for i, (a, b) in enumerate(zip(got, full)):
        assert a == b, f"step {i}: resumed {a} != uninterrupted {b}"
    now = _states(g)
    assert now[0] == end[0], "the default generator differs"
    assert now[1] == end[1], "loader.generator differs"


_STOPS = [(0, 1), (1, 2), (0, 3), (0, None), (1, None)]


@pytest.mark.parametrize("stop", _STOPS)
@pytest.mark.parametrize("gen", [False, True])
@pytest.mark.parametrize("shuffle", [False, True])
def test_resume_in_process_matches_uninterrupted(shuffle, gen, stop):
    _check(0, shuffle, gen, stop)


@pytest.mark.parametrize("stop", [(0, 1), (0, None), (1, 2)])
@pytest.mark.parametrize("gen", [False, True])
@pytest.mark.parametrize("shuffle", [False, True])
def test_resume_with_workers_matches_uninterrupted(shuffle, gen, stop):
    _check(2, shuffle, gen, stop)


@pytest.mark.parametrize("nw,stop", [(0, (0, 1)), (0, (1, 2)), (0, (0, None)),
                                     (2, (0, 1))])
@pytest.mark.parametrize("shuffle", [False, True])
def test_resume_distributed_sampler_position_serves_one_pass(shuffle, nw,
                                                             stop):
    """A loaded mid-epoch position is the resumed pass's only: without
    set_epoch the passes after it are whole, as uninterrupted."""
    _check(nw, shuffle, True, stop, distributed=True)


_RESUME_SCRIPT = """
import json, sys
import dtorch
sys.path.insert(0, {here!r})
import test_data_resume_rng as T
ck = dtorch.load({path!r})
dtorch.manual_seed(99)
g, loader = T._setup(2, True, False)
dtorch.set_rng_state(ck["rng"])
loader.load_state_dict(ck["loader"])
log = []
for _ in range(2):
    for b in loader:
        T._step(b, log)
print(json.dumps([log, dtorch.get_rng_state()]))
"""


def test_resume_in_a_new_process(tmp_path):
    """The job really restarts: a new interpreter restores the RNG and
    the loader (2 workers, shuffled) saved mid-epoch by this one."""
    import json
    import os
    import subprocess
    import sys
    dtorch.manual_seed(0)
    _, loader = _setup(2, True, False)
    full = []
    _train(loader, full, 2)
    end = dict(dtorch.get_rng_state())
    dtorch.manual_seed(0)
    _, loader = _setup(2, True, False)
    got = []
    _train(loader, got, 2, stop=(0, 2))
    path = str(tmp_path / "ck.pt")
    dtorch.save({"rng": dtorch.get_rng_state(),
                 "loader": loader.state_dict()}, path)
    del loader
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run(
        [sys.executable, "-c", _RESUME_SCRIPT.format(here=here, path=path)],
        capture_output=True, text=True, timeout=120, env=dict(
            os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert out.returncode == 0, out.stderr[-2000:]
    log, rng = json.loads(out.stdout.strip().splitlines()[-1])
    assert got + [tuple(s) for s in log] == full
    assert rng == end

"""DataLoader batches travel from workers through shared memory (issue 16):
large arrays arrive as mappings of anonymous memory files, not pickled
bytes; nothing is left behind (worker processes, /dev/shm files,
descriptors) after an exception in a worker or a kill of the main
process; pin_memory is a no-op without CuPy and copies into CuPy's pinned
memory with it."""
import gc
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from dtorch.utils.data import DataLoader, Dataset
from test_data import _children as _child_states

# names a regression would leave in /dev/shm (PyTorch's, multiprocessing's,
# ours)
_SHM_PREFIXES = ("dtorch", "psm_", "torch_", "wnsm_")


def _shm_names():
    try:
        return {n for n in os.listdir("/dev/shm")
                if n.startswith(_SHM_PREFIXES)}
    except FileNotFoundError:
        return set()


def _fds():
    return set(os.listdir("/proc/self/fd"))


def _children():
    return [pid for pid, _ in _child_states()]


def _gone(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.fixture
def clean():
    """Nothing new is left: children, descriptors, /dev/shm names."""
    kids, fds, shm = set(_children()), _fds(), _shm_names()
    yield
    gc.collect()
    deadline = time.time() + 10
    while time.time() < deadline and set(_children()) - kids:
        time.sleep(0.05)
    assert set(_children()) - kids == set()
    assert _fds() - fds == set()
    assert _shm_names() - shm == set()


class _Images(Dataset):
    def __len__(self):
        return 12

    def __getitem__(self, i):
        if i == 9 and getattr(self, "fail", False):
            raise ValueError("bad sample 9")
        return np.full((3, 32, 32), i, np.float32), i


def _mapped_from_memfd(a):
    """Whether array ``a`` lies in a memfd mapping of this process."""
    addr = a.__array_interface__["data"][0]
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= addr < hi:
                return len(parts) > 5 and parts[5].startswith("/memfd:")
    return False


def test_batches_arrive_in_shared_memory(clean):
    loader = DataLoader(_Images(), batch_size=4, num_workers=2)
    kept = []
    for i, (x, y) in enumerate(loader):
        # 4 x 3 x 32 x 32 float32 = 48 KiB... plus: sizes vary by batch
        assert x.numpy().tolist() == np.stack(
            [np.full((3, 32, 32), 4 * i + k, np.float32)
             for k in range(4)]).tolist()
        assert y.tolist() == [4 * i + k for k in range(4)]
        kept.append(x)
    big = DataLoader(_Images(), batch_size=6, num_workers=1)
    for x, y in big:       # 6 x 12 KiB = 72 KiB: above the inline limit
        assert _mapped_from_memfd(x.numpy())
        assert not _mapped_from_memfd(y.numpy())        # small: inline
        kept.append(x)
    del loader, big
    gc.collect()
    # a batch outlives its loader and workers: its mapping is its own
    assert kept[-1].numpy()[0, 0, 0, 0] == 6.0


def test_unbatched_large_arrays_are_shared_too(clean):
    class Big(Dataset):
        def __len__(self):
            return 3

        def __getitem__(self, i):
            return {"a": np.arange(50000, dtype=np.float64) + i}

    out = list(DataLoader(Big(), batch_size=None, num_workers=1))
    for i, d in enumerate(out):
        assert _mapped_from_memfd(d["a"].numpy())
        assert d["a"].numpy()[0] == i and d["a"].numpy()[-1] == 49999 + i


@pytest.mark.parametrize("persistent", [False, True])
def test_exception_in_worker_leaves_nothing(clean, persistent):
    ds = _Images()
    ds.fail = True
    loader = DataLoader(ds, batch_size=3, num_workers=2,
                        persistent_workers=persistent)
    seen = []
    with pytest.raises(ValueError, match="bad sample 9"):
        for x, _ in loader:
            seen.append(x)
    assert len(seen) == 3          # batches before the failing one
    del loader, seen
    gc.collect()


_KILL_SCRIPT = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    from dtorch.utils.data import DataLoader, Dataset

    class Slow(Dataset):
        def __len__(self):
            return 10 ** 6
        def __getitem__(self, i):
            return np.full((64, 64), i, np.float32)

    loader = DataLoader(Slow(), batch_size=8, num_workers=2,
                        prefetch_factor=4)
    it = iter(loader)
    next(it)
    print(" ".join(str(w.pid) for w in it._workers), flush=True)
    time.sleep(600)        # batches wait in the sockets, workers block
""")


def test_killed_main_process_leaves_no_worker_or_shm_file(clean):
    proc = subprocess.Popen([sys.executable, "-c", _KILL_SCRIPT],
                            stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                                [os.getcwd()] + sys.path)))
    try:
        line = proc.stdout.readline()
        workers = [int(p) for p in line.split()]
        assert len(workers) == 2, line
        # let the workers fill their sockets and block sending
        time.sleep(0.5)
        proc.send_signal(signal.SIGKILL)    # only the pid this test started
        proc.wait(30)
        deadline = time.time() + 30
        while time.time() < deadline and not all(map(_gone, workers)):
            time.sleep(0.05)
        assert all(map(_gone, workers)), "workers outlived the main process"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


def test_pin_memory_is_a_no_op_without_cupy(clean, monkeypatch):
    from dtorch import _backend as B
    monkeypatch.setattr(B, "_load_cupy", lambda: None)
    for nw in (0, 1):
        batches = list(DataLoader(_Images(), batch_size=4, num_workers=nw,
                                  pin_memory=True))
        assert [b[1].tolist() for b in batches] == [[0, 1, 2, 3],
                                                    [4, 5, 6, 7],
                                                    [8, 9, 10, 11]]


def test_pin_memory_copies_into_cupys_pinned_memory(clean, monkeypatch):
    """The GPU path, with a stand-in for CuPy's pinned allocator: every
    array of the batch is copied into memory it allocated."""
    allocated = []

    class _Pinned:
        def __init__(self, n):
            self.buf = bytearray(n)
            allocated.append(self)

    class _Cuda:
        @staticmethod
        def alloc_pinned_memory(n):
            return _Pinned(n).buf

    class _CuPy:
        cuda = _Cuda

    from dtorch import _backend as B
    monkeypatch.setattr(B, "_load_cupy", lambda: _CuPy)
    batches = list(DataLoader(_Images(), batch_size=4, num_workers=1,
                              pin_memory=True))
    assert len(allocated) == 2 * len(batches)
    bufs = [p.buf for p in allocated]
    for k, (x, y) in enumerate(batches):
        for t in (x, y):
            owner = t.numpy()
            while isinstance(owner, np.ndarray) and owner.base is not None:
                owner = owner.base
            owner = getattr(owner, "obj", owner)        # a memoryview's
            assert any(owner is b for b in bufs)
        assert y.tolist() == [4 * k + j for j in range(4)]
        assert x.numpy()[:, 0, 0, 0].tolist() == y.tolist()


def test_prefetch_keeps_the_pytorch_number_of_batches_in_flight():
    # (no ``clean``: PyTorch's loader keeps descriptors of its own)
    """prefetch_factor batches per worker are requested up front, as
    PyTorch does (counted by the dataset, not timed)."""
    torch = pytest.importorskip("torch")
    import multiprocessing
    for mod, loader_cls in (("torch", torch.utils.data.DataLoader),
                            ("dtorch", DataLoader)):
        calls = multiprocessing.get_context("fork").Value("i", 0)

        class Count(Dataset):
            def __len__(self):
                return 100

            def __getitem__(self, i):
                with calls.get_lock():
                    calls.value += 1
                return i

        loader = loader_cls(Count(), batch_size=2, num_workers=2,
                            prefetch_factor=3)
        it = iter(loader)
        next(it)
        deadline = time.time() + 20
        # after one batch is taken, one more is requested: 2 * 3 + 1
        while time.time() < deadline and calls.value < 14:
            time.sleep(0.02)
        time.sleep(0.3)
        assert calls.value == 14, (mod, calls.value)
        del it, loader
        gc.collect()


def test_large_index_lists_and_inline_batches_do_not_deadlock(
        clean, monkeypatch):
    """Index lists and pickled batches larger than a socket's buffer: the
    main process must not block sending while its worker blocks sending
    back (a blocking send deadlocked here), and a worker waits for a slow
    training loop to read its batch (its send timed out after the
    parent-check interval)."""
    import threading
    from dtorch.utils.data import _worker
    monkeypatch.setattr(_worker, "STATUS_CHECK_INTERVAL", 0.1)
    n = 120000
    batches = [list(range(k * n, (k + 1) * n)) for k in range(4)]
    out = []

    def run():
        loader = DataLoader(range(4 * n), batch_sampler=batches,
                            num_workers=1, collate_fn=lambda b: b)
        for b in loader:
            out.append(len(b))
            time.sleep(0.4)           # a training step slower than 0.1 s

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(120)
    assert not t.is_alive(), "DataLoader deadlocked"
    assert out == [n] * 4


@pytest.mark.parametrize("nw", [0, 2])
@pytest.mark.parametrize("kw", [dict(batch_size=5),
                                dict(batch_size=5, drop_last=True),
                                dict(batch_size=None)])
def test_batches_equal_torchs(nw, kw):
    torch = pytest.importorskip("torch")
    data = [(np.full((2, 3), i, np.float32), i, {"k": float(i)})
            for i in range(17)]

    def plain(v):                  # a tensor of either library, or not
        return (type(v).__name__ == "Tensor", v.tolist()) \
            if hasattr(v, "tolist") else (type(v).__name__, v)

    def flat(batches):
        return [(type(b).__name__, plain(b[0]), plain(b[1]),
                 plain(b[2]["k"])) for b in batches]
    ref = flat(torch.utils.data.DataLoader(data, num_workers=nw, **kw))
    assert flat(DataLoader(data, num_workers=nw, **kw)) == ref


def test_unbatched_memmap_rows_through_workers(clean, tmp_path):
    """Tensors over rows of a memory map (np.memmap, an ndarray subclass)
    are carried like any array (they were taken for CUDA arrays)."""
    import dtorch
    x = np.arange(5 * 20000, dtype=np.float32).reshape(5, 20000)
    np.save(tmp_path / "x.npy", x)

    class Rows(Dataset):
        def __len__(self):
            return 5

        def __getitem__(self, i):
            row = np.load(tmp_path / "x.npy", mmap_mode="r")[i]
            assert isinstance(row, np.memmap)
            return dtorch.from_numpy(row), row[:10]

    rows = [(t.numpy(), r.numpy()) for t, r in
            DataLoader(Rows(), batch_size=None, num_workers=1)]
    assert np.array_equal(np.stack([t for t, _ in rows]), x)
    assert np.array_equal(np.stack([r for _, r in rows]), x[:, :10])

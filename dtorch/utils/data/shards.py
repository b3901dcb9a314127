"""Datasets larger than memory: shard files split over ranks and workers,
and memory-mapped token and array files.

``ShardedIterableDataset`` reads samples from many ``.npy`` shard files
(rows along the first axis; a tuple of files per shard gives tuple
samples). Per epoch:

1. the shards are put in an order (shuffled from ``seed + epoch`` when
   ``shuffle``; the same on every rank) and their rows concatenated into
   one stream of ``N`` positions;
2. rank ``r`` of ``W`` takes the contiguous part ``[r n, (r + 1) n)`` of
   the stream, ``n = ceil(N / W)``: as ``DistributedSampler``, the last
   ranks are padded by wrapping to the start of the stream, so every rank
   yields the same number of samples and none runs out early and leaves
   the others waiting in a collective (``drop_last=True`` drops the tail
   instead: ``n = N // W``, no sample repeated);
3. a rank's part is split contiguously over its DataLoader workers (sizes
   differing by at most one, the same split on every rank, so every rank
   also yields the same number of batches);
4. with ``shuffle``, each worker yields its part in blocks of
   ``buffer_size`` consecutive positions, each block in a random order.

So every sample is read exactly once per epoch (plus the padding), by one
rank and one worker, and the reads of a worker are local (a few shards
at a time). Only indices are shuffled: a block permutation is drawn from
``(seed, epoch, rank, worker, block)``, so the position of an iterator is
one number and a resumed iterator jumps to it without reading anything.

``state_dict``/``load_state_dict`` (used by ``DataLoader.state_dict``)
resume mid-epoch exactly on the same world size and number of workers; on
another geometry the samples not yet consumed (by every rank, assuming
all ranks consumed the same number of batches, as synchronous training
does) are re-partitioned over the new ranks and workers.
"""
import collections
import os

import numpy as np

from .dataset import Dataset, IterableDataset
from .distributed import _default_group

__all__ = ["ShardedIterableDataset", "MemmapTokenDataset",
           "MemmapArrayDataset"]


def _dist_rank_world():
    world = _default_group()
    return (0, 1) if world is None else (world[1], world[0])


def _npy_rows(path, rank):
    """Rows of a ``.npy`` file from its header, with the file checked for
    existence and truncation (errors name the file and the rank)."""
    try:
        with open(path, "rb") as f:
            fmt = np.lib.format
            version = fmt.read_magic(f)
            read = (fmt.read_array_header_1_0 if version == (1, 0)
                    else fmt.read_array_header_2_0)
            shape, fortran, dtype = read(f)
            offset = f.tell()
    except FileNotFoundError:
        raise FileNotFoundError(
            f"shard {os.fspath(path)!r} (rank {rank}) does not exist"
        ) from None
    except ValueError as e:
        raise ValueError(f"shard {os.fspath(path)!r} (rank {rank}) is not a "
                         f"valid .npy file: {e}") from None
    need = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    size = os.path.getsize(path)
    if size < need:
        raise ValueError(
            f"shard {os.fspath(path)!r} (rank {rank}) is truncated: its "
            f"header says shape {shape} {dtype} ({need} bytes), the file "
            f"has {size} bytes")
    if not shape:
        raise ValueError(f"shard {os.fspath(path)!r} (rank {rank}) holds a "
                         "0-d array; samples are rows along the first axis")
    return shape[0]


def _open_npy(path, rank):
    try:
        return np.load(path, mmap_mode="r")
    except FileNotFoundError:
        raise FileNotFoundError(
            f"shard {os.fspath(path)!r} (rank {rank}) does not exist"
        ) from None
    except (ValueError, OSError) as e:
        raise type(e)(f"shard {os.fspath(path)!r} (rank {rank}) cannot be "
                      f"read: {e}") from None


# ---------------------------------------------------- interval helpers --
def _merge(intervals):
    """Sorted, disjoint [a, b) intervals covering the given ones."""
    out = []
    for a, b in sorted(intervals):
        if a >= b:
            continue
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _subtract(base, cut):
    """Intervals of ``base`` (sorted, disjoint) not in ``cut`` (same)."""
    out = []
    j = 0
    for a, b in base:
        while j < len(cut) and cut[j][1] <= a:
            j += 1
        k = j
        while a < b:
            if k >= len(cut) or cut[k][0] >= b:
                out.append([a, b])
                break
            if cut[k][0] > a:
                out.append([a, cut[k][0]])
            a = max(a, cut[k][1])
            k += 1
    return out


class _Plan:
    """One epoch of one (rank, worker) slot: which stream positions it
    yields, in which order."""

    def __init__(self, ds, epoch, base, world, rank, nw, wid):
        self.ds = ds
        self.epoch = epoch
        self.base = base                     # (m, 2) stream ranges
        lens = base[:, 1] - base[:, 0]
        self.base_cum = np.cumsum(lens)
        self.L = int(self.base_cum[-1]) if len(lens) else 0
        L, W = self.L, world
        if L == 0:
            n = 0
        elif ds.drop_last:
            n = L // W
        else:
            n = -(-L // W)
        q, rem = divmod(n, nw)
        self.count = q + (wid < rem)
        self.start = rank * n + wid * q + min(wid, rem)
        self.rank_len = n
        self.key = (ds.seed, epoch, rank, wid)
        self.B = ds.buffer_size if ds.shuffle else 1
        self._block = None

    def _block_perm(self, b):
        if self._block is not None and self._block[0] == b:
            return self._block[1]
        size = min(self.B, self.count - b * self.B)
        if self.ds.shuffle:
            rng = np.random.default_rng(list(self.key) + [b])
            perm = rng.permutation(size)
        else:
            perm = np.arange(size)
        self._block = (b, perm)
        return perm

    def virtual(self, k):
        """The virtual position of the k-th sample this slot yields."""
        b, i = divmod(k, self.B)
        return self.start + b * self.B + int(self._block_perm(b)[i])

    def stream(self, v):
        b = v % self.L                       # padding wraps to the start
        j = int(np.searchsorted(self.base_cum, b, side="right"))
        before = int(self.base_cum[j - 1]) if j else 0
        return int(self.base[j, 0]) + b - before

    def consumed(self, k):
        """Stream intervals of this slot's first ``k`` samples."""
        k = min(k, self.count)
        full, part = divmod(k, self.B)
        virt = [(self.start, self.start + full * self.B)]
        if part:
            first = self.start + full * self.B
            for i in self._block_perm(full)[:part]:
                virt.append((first + int(i), first + int(i) + 1))
        out = []
        for a, b in virt:
            while a < b:                     # split at wrap-arounds
                lo = a % self.L
                span = min(b - a, self.L - lo)
                out.extend(self._base_to_stream(lo, lo + span))
                a += span
        return out

    def _base_to_stream(self, lo, hi):
        out = []
        j = int(np.searchsorted(self.base_cum, lo, side="right"))
        while lo < hi and j < len(self.base):
            before = int(self.base_cum[j - 1]) if j else 0
            end = min(hi, int(self.base_cum[j]))
            a = int(self.base[j, 0]) + lo - before
            out.append((a, a + end - lo))
            lo = end
            j += 1
        return out


class ShardedIterableDataset(IterableDataset):
    """Samples from ``.npy`` shard files, split over ranks x DataLoader
    workers so that each is read once per epoch (see the module's
    documentation for the exact rule, padding and resumption).

    Args:
        shards: paths of ``.npy`` files (samples are rows), or tuples of
            paths (one per field, equal row counts: samples are tuples).
        shuffle: shuffle the shard order and, within blocks of
            ``buffer_size``, the samples (seeded by ``seed`` and the
            epoch; ``set_epoch`` changes it, the same on every rank).
        drop_last: drop the tail so that ranks split the data evenly
            instead of padding by repetition.
        rank, world_size: default to the default process group's (0 and 1
            without one).
        transform: applied to each sample (in the worker).
        shard_sizes: rows per shard, to skip reading the headers.

    Example::

        ds = ShardedIterableDataset(sorted(glob("train-*.npy")),
                                    shuffle=True, seed=0)
        loader = DataLoader(ds, batch_size=64, num_workers=2)
        for epoch in range(epochs):
            ds.set_epoch(epoch)
            for batch in loader:
                ...
    """

    # DataLoader: give every worker all workers' saved positions, so a
    # resume can re-split them over another number of workers
    _loads_all_worker_states = True

    def __init__(self, shards, *, shuffle=False, buffer_size=1024, seed=0,
                 drop_last=False, rank=None, world_size=None,
                 transform=None, shard_sizes=None):
        if rank is None or world_size is None:
            r, w = _dist_rank_world()
            rank = r if rank is None else rank
            world_size = w if world_size is None else world_size
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"Invalid rank {rank}, rank should be in the "
                             f"interval [0, {world_size - 1}]")
        self.rank, self.world_size = int(rank), int(world_size)
        if isinstance(shards, (str, os.PathLike)):
            raise TypeError("shards should be a list of paths, got a single "
                            f"path {os.fspath(shards)!r}")
        self.shards = [tuple(s) if isinstance(s, (list, tuple)) else (s,)
                       for s in shards]
        if not self.shards:
            raise ValueError(f"ShardedIterableDataset: the shard list is "
                             f"empty (rank {self.rank})")
        if int(buffer_size) < 1:
            raise ValueError(f"buffer_size should be positive, got "
                             f"{buffer_size}")
        if shard_sizes is None:
            sizes = []
            for fields in self.shards:
                rows = [_npy_rows(p, self.rank) for p in fields]
                if len(set(rows)) != 1:
                    names = ", ".join(repr(os.fspath(p)) for p in fields)
                    raise ValueError(f"shard ({names}) (rank {self.rank}): "
                                     f"its files have different row counts "
                                     f"{rows}")
                sizes.append(rows[0])
        else:
            sizes = [int(s) for s in shard_sizes]
            if len(sizes) != len(self.shards):
                raise ValueError(f"{len(sizes)} shard_sizes for "
                                 f"{len(self.shards)} shards")
        self.shard_sizes = np.asarray(sizes, dtype=np.int64)
        self.num_samples = int(self.shard_sizes.sum())
        self.shuffle = bool(shuffle)
        self.buffer_size = int(buffer_size)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.transform = transform
        self.epoch = 0
        self._pending = None      # from load_state_dict, for the next iter
        self._cur = None          # the running iteration's position
        self._open = collections.OrderedDict()

    def set_epoch(self, epoch):
        """Shuffle differently for this epoch (the same on every rank)."""
        self.epoch = int(epoch)

    def __getstate__(self):
        # spawned workers open their own maps (pickling one copies it)
        d = dict(self.__dict__)
        d["_open"] = collections.OrderedDict()
        return d

    def __len__(self):
        """Samples this rank yields per epoch (over all its workers)."""
        n = self.num_samples
        if self.drop_last:
            return n // self.world_size
        return -(-n // self.world_size)

    # ------------------------------------------------------- reading --
    def _shard_order(self, epoch):
        if not self.shuffle:
            return np.arange(len(self.shards))
        return np.random.default_rng([self.seed, epoch, 0x5A4D]).permutation(
            len(self.shards))

    def _arrays(self, shard):
        arrays = self._open.get(shard)
        if arrays is None:
            arrays = [_open_npy(p, self.rank) for p in self.shards[shard]]
            for p, a in zip(self.shards[shard], arrays):
                if a.shape[0] != self.shard_sizes[shard]:
                    raise ValueError(
                        f"shard {os.fspath(p)!r} (rank {self.rank}) has "
                        f"{a.shape[0]} rows, {self.shard_sizes[shard]} "
                        "when the dataset was made")
            self._open[shard] = arrays
            if len(self._open) > 8:          # a few open maps at a time
                self._open.popitem(last=False)
        else:
            self._open.move_to_end(shard)
        return arrays

    def _read(self, order, cum, p):
        k = int(np.searchsorted(cum, p, side="right"))
        shard = int(order[k])
        row = p - (int(cum[k - 1]) if k else 0)
        arrays = self._arrays(shard)
        try:
            sample = [a[row] for a in arrays]
        except (OSError, ValueError) as e:
            raise type(e)(f"shard {os.fspath(self.shards[shard][0])!r} "
                          f"(rank {self.rank}) cannot be read at row "
                          f"{row}: {e}") from None
        sample = sample[0] if len(sample) == 1 else tuple(sample)
        if self.transform is not None:
            sample = self.transform(sample)
        return sample

    # ------------------------------------------------------ iteration --
    def _geometry(self):
        from ._worker import get_worker_info
        info = get_worker_info()
        return (0, 1) if info is None else (info.id, info.num_workers)

    def _full_base(self):
        return np.array([[0, self.num_samples]], dtype=np.int64)

    def _resume(self, states, wid, nw):
        """(epoch, base, start) for this worker from all workers' saved
        states."""
        ref = next(s for s in states if s is not None)
        if int(ref["num_samples"]) != self.num_samples:
            raise ValueError(
                f"ShardedIterableDataset state is for {ref['num_samples']} "
                f"samples, these shards hold {self.num_samples} (rank "
                f"{self.rank})")
        epoch = int(ref["epoch"])
        base = (self._full_base() if ref.get("base") is None
                else np.asarray(ref["base"], dtype=np.int64).reshape(-1, 2))
        old_w, old_nw = int(ref["world_size"]), int(ref["num_workers"])
        counts = [0] * old_nw
        for s in states:
            if s is not None:
                counts[int(s["worker_id"])] = int(s["yielded"])
        if (old_w, old_nw) == (self.world_size, nw):
            return epoch, base, counts[wid] if wid < len(counts) else 0
        # another geometry: every old slot consumed its worker's count
        # (all ranks ran in step); the rest is this epoch's new stream
        consumed = []
        for r in range(old_w):
            for w in range(old_nw):
                plan = _Plan(self, epoch, base, old_w, r, old_nw, w)
                consumed.extend(plan.consumed(counts[w]))
        rest = _subtract(_merge(base.tolist()), _merge(consumed))
        rest = np.asarray(rest, dtype=np.int64).reshape(-1, 2)
        return epoch, rest, 0

    def __iter__(self):
        wid, nw = self._geometry()
        pending, self._pending = self._pending, None
        if pending is not None:
            epoch, base, start = self._resume(pending, wid, nw)
            self.epoch = epoch
        else:
            epoch, base, start = self.epoch, self._full_base(), 0
        plan = _Plan(self, epoch, base, self.world_size, self.rank, nw, wid)
        order = self._shard_order(epoch)
        cum = np.cumsum(self.shard_sizes[order])
        full = base.shape == (1, 2) and base[0, 0] == 0 and \
            base[0, 1] == self.num_samples
        cur = {"epoch": epoch, "seed": self.seed,
               "world_size": self.world_size, "rank": self.rank,
               "num_workers": nw, "worker_id": wid, "yielded": start,
               "num_samples": self.num_samples,
               "base": None if full else base.copy()}
        self._cur = cur
        return self._generate(plan, order, cum, cur)

    def _generate(self, plan, order, cum, cur):
        for k in range(cur["yielded"], plan.count):
            sample = self._read(order, cum, plan.stream(plan.virtual(k)))
            cur["yielded"] = k + 1
            yield sample

    def state_dict(self):
        """The running iteration's position (in a worker: this worker's),
        a plain dict; before any iteration, the start of the epoch."""
        cur = self._cur
        if cur is None:
            wid, nw = self._geometry()
            cur = {"epoch": self.epoch, "seed": self.seed,
                   "world_size": self.world_size, "rank": self.rank,
                   "num_workers": nw, "worker_id": wid, "yielded": 0,
                   "num_samples": self.num_samples, "base": None}
        out = dict(cur)
        if out["base"] is not None:
            out["base"] = out["base"].copy()
        return out

    def load_state_dict(self, state):
        """Make the next ``iter`` continue from ``state``: one iterator's
        state, or ``{"workers": [state per worker]}`` as the DataLoader
        passes it."""
        states = state["workers"] if "workers" in state else [state]
        if not any(s is not None for s in states):
            self._pending = None
            return
        if "workers" not in state:
            s = states[0]
            full = [None] * int(s["num_workers"])
            full[int(s["worker_id"])] = s
            states = full
        self.seed = int(next(s for s in states if s is not None)["seed"])
        self._pending = states


class MemmapTokenDataset(Dataset):
    """Windows of a flat binary file of token ids (as GPT training scripts
    write them: ``np.array(ids, dtype=np.uint16).tofile(path)``), read
    through a memory map: nothing is copied into memory but the windows
    asked for.

    Sample ``i`` is ``(x, y)`` with ``x = tokens[s : s + block_size]`` and
    ``y = tokens[s + 1 : s + block_size + 1]`` as int64 arrays,
    ``s = i * stride``. ``stride`` defaults to ``block_size``
    (non-overlapping windows: an epoch sees each token once); ``stride=1``
    makes every offset a sample. ``shuffle=True`` in the DataLoader gives
    random windows.

    Example::

        ds = MemmapTokenDataset("train.bin", block_size=1024,
                                dtype="uint16")
        loader = DataLoader(ds, batch_size=12, shuffle=True, num_workers=2)
    """

    def __init__(self, path, block_size, dtype="uint16", stride=None):
        self.path = os.fspath(path)
        self.dtype = np.dtype(dtype)
        if self.dtype.kind not in "ui":
            raise TypeError(f"token dtype should be an integer type "
                            f"(uint16, uint32, ...), got {self.dtype}")
        self.block_size = int(block_size)
        self.stride = self.block_size if stride is None else int(stride)
        if self.block_size < 1 or self.stride < 1:
            raise ValueError("block_size and stride should be positive")
        rank = _dist_rank_world()[0]
        try:
            size = os.path.getsize(self.path)
        except FileNotFoundError:
            raise FileNotFoundError(f"token file {self.path!r} (rank {rank}) "
                                    "does not exist") from None
        if size % self.dtype.itemsize:
            raise ValueError(
                f"token file {self.path!r} (rank {rank}) is truncated: "
                f"{size} bytes is not a whole number of {self.dtype} "
                "tokens")
        n = size // self.dtype.itemsize
        if n < self.block_size + 1:
            raise ValueError(
                f"token file {self.path!r} (rank {rank}) has {n} tokens, "
                f"fewer than block_size + 1 = {self.block_size + 1}")
        self.num_tokens = n
        self._tokens = None                  # mapped on first use

    @property
    def tokens(self):
        """The memory map (opened lazily, so workers open their own)."""
        if self._tokens is None:
            self._tokens = np.memmap(self.path, dtype=self.dtype, mode="r")
        return self._tokens

    def __len__(self):
        return (self.num_tokens - self.block_size - 1) // self.stride + 1

    def _check(self, i):
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"window {i} out of range for {n} windows")
        return i

    def __getitem__(self, i):
        s = self._check(int(i)) * self.stride
        w = np.asarray(self.tokens[s:s + self.block_size + 1],
                       dtype=np.int64)
        return w[:-1], w[1:]

    def __getitems__(self, indices):
        idx = np.asarray([self._check(int(i)) for i in indices],
                         dtype=np.int64)
        # one gather for the whole batch
        win = self.tokens[idx[:, None] * self.stride
                          + np.arange(self.block_size + 1)]
        win = win.astype(np.int64)
        return [(w[:-1], w[1:]) for w in win]

    def __getstate__(self):
        d = dict(self.__dict__)
        d["_tokens"] = None
        return d


class MemmapArrayDataset(Dataset):
    """Rows of one or more ``.npy`` files opened with
    ``np.load(mmap_mode='r')``: sample ``i`` is ``a[i]`` (a tuple with
    several files), read from disk on access.

    Example::

        ds = MemmapArrayDataset("images.npy", "labels.npy")
    """

    def __init__(self, *paths, transform=None):
        if not paths:
            raise ValueError("MemmapArrayDataset needs at least one path")
        rank = _dist_rank_world()[0]
        self.paths = [os.fspath(p) for p in paths]
        rows = [_npy_rows(p, rank) for p in self.paths]
        if len(set(rows)) != 1:
            raise ValueError(f"MemmapArrayDataset: the files have different "
                             f"row counts {dict(zip(self.paths, rows))}")
        self._len = rows[0]
        self._rank = rank
        self.transform = transform
        self._arrays = None

    @property
    def arrays(self):
        if self._arrays is None:
            self._arrays = [_open_npy(p, self._rank) for p in self.paths]
        return self._arrays

    def __len__(self):
        return self._len

    def _finish(self, fields):
        sample = fields[0] if len(fields) == 1 else tuple(fields)
        if self.transform is not None:
            sample = self.transform(sample)
        return sample

    def __getitem__(self, i):
        i = int(i)
        if not -self._len <= i < self._len:
            raise IndexError(f"index {i} out of range for {self._len} rows")
        return self._finish([np.asarray(a[i]) for a in self.arrays])

    def __getitems__(self, indices):
        idx = np.asarray(indices, dtype=np.int64)
        cols = [np.asarray(a[idx]) for a in self.arrays]
        return [self._finish([c[j] for c in cols]) for j in range(len(idx))]

    def __getstate__(self):
        d = dict(self.__dict__)
        d["_arrays"] = None
        return d

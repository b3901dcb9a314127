"""Random number generation: ``dtorch.Generator``, ``manual_seed``, and the
default generator that every random factory and initialiser draws from.

The same seed gives the same numbers on every run and platform (NumPy's
PCG64); the streams differ from PyTorch's. The default generators are one
per process, and one per thread rank of ``dist.spawn_threads`` (see
``dtorch._rank_local``), as each rank would have in its own process.
"""
import contextlib
import numbers

import numpy as np

from . import _backend
from ._rank_local import RankLocal


class Generator:
    """A seeded random stream, as ``torch.Generator``.

    Example::

        g = dtorch.Generator().manual_seed(0)
        x = dtorch.randn(3, generator=g)
    """

    def __init__(self, device="cpu"):
        self.device = _backend.to_device(device)
        self._seed = 67280421310721
        self._rng = np.random.Generator(np.random.PCG64(self._seed))
        # a CUDA generator draws on its device (a CuPy RandomState, made at
        # the first draw); 'cuda' means the device current at that draw
        self._cuda = (_CudaGen(self._seed) if self.device.type == "cuda"
                      else None)

    def manual_seed(self, seed):
        seed = int(seed)
        if seed < 0:
            seed = seed & 0xFFFF_FFFF_FFFF_FFFF
        self._seed = seed
        self._rng = np.random.Generator(np.random.PCG64(seed))
        if self._cuda is not None:
            self._cuda.seed, self._cuda.epoch, self._cuda.rs = seed, 0, None
        return self

    def seed(self):
        s = int(np.random.SeedSequence().entropy % (1 << 63))
        self.manual_seed(s)
        return s

    def initial_seed(self):
        return self._seed

    def get_state(self):
        """The state as a JSON-friendly dict (PCG64's two 128-bit words;
        for a CUDA generator a (seed, epoch) key, see cuda_get_rng_state)."""
        if self._cuda is not None:
            return _cuda_key(self._cuda)
        st = self._rng.bit_generator.state
        return {"seed": self._seed, "state": str(st["state"]["state"]),
                "inc": str(st["state"]["inc"]),
                "has_uint32": st["has_uint32"], "uinteger": st["uinteger"]}

    def set_state(self, state):
        if self._cuda is not None:
            g = self._cuda
            g.seed, g.epoch, g.rs = int(state["seed"]), int(state["epoch"]), \
                None
            self._seed = g.seed
            return self
        bg = np.random.PCG64()
        bg.state = {"bit_generator": "PCG64",
                    "state": {"state": int(state["state"]),
                              "inc": int(state["inc"])},
                    "has_uint32": state["has_uint32"],
                    "uinteger": state["uinteger"]}
        self._seed = state["seed"]
        self._rng = np.random.Generator(bg)
        return self

    @property
    def rng(self):
        return self._rng




# ------------------------------------------------------------- CUDA ----
# One generator per CUDA device (a CuPy RandomState, as PyTorch keeps one
# per device), created and seeded lazily on its first draw: manual_seed
# works before CuPy is loaded and never initialises a device. cuRAND's state
# cannot be read back, so a captured state is a (seed, epoch) key: capturing
# re-keys the live generator to it, and restoring the same key gives the
# same continuation.

_CUDA_DEFAULT_SEED = 67280421310721


class _CudaGen:
    __slots__ = ("seed", "epoch", "rs")

    def __init__(self, seed):
        self.seed, self.epoch, self.rs = seed, 0, None


def _cuda_key(g):
    g.epoch += 1
    g.rs = None     # re-keyed at the next draw
    return {"seed": g.seed, "epoch": g.epoch}


def _cuda_rs(g, index):
    """g's CuPy RandomState, made on device ``index`` at the first draw."""
    if g.rs is None:
        cp = _backend.check_cuda_available()
        key = (g.seed + g.epoch * 0x9E3779B97F4A7C15) & (2 ** 63 - 1)
        with cp.cuda.Device(index):
            g.rs = cp.random.RandomState(key)
        g.rs._dtorch_device = index
    return g.rs


class _RNGState:
    """The default generators of a process (or of a thread rank): the CPU
    one, and one per CUDA device made lazily from ``cuda_seed``."""
    __slots__ = ("cpu", "cuda_gens", "cuda_seed")

    def __init__(self, cpu=None, cuda_seed=_CUDA_DEFAULT_SEED):
        self.cpu = Generator() if cpu is None else cpu
        self.cuda_gens = {}
        self.cuda_seed = cuda_seed


_state = RankLocal(_RNGState)


def _forward(name):
    def get(self):
        return getattr(_state.get().cpu, name)

    def set(self, v):
        setattr(_state.get().cpu, name, v)
    return property(get, set)


class _DefaultGenerator(Generator):
    """``dtorch.default_generator``: one object, whose state is the calling
    thread rank's CPU generator (the process's outside thread ranks), so
    that ``torch.default_generator.manual_seed(0)`` in a rank seeds that
    rank only."""
    device, _seed, _rng, _cuda = (_forward(n) for n in
                                  ("device", "_seed", "_rng", "_cuda"))

    def __init__(self):
        pass

    def __repr__(self):
        return "<dtorch.Generator default>"


default_generator = _DefaultGenerator()


def _cuda_gen(index):
    st = _state.get()
    g = st.cuda_gens.get(index)
    if g is None:
        g = st.cuda_gens[index] = _CudaGen(st.cuda_seed)
    return g


@contextlib.contextmanager
def keyed_streams(*key):
    """Draw from fresh default generators keyed by the integers ``key``
    inside the block (CPU and CUDA; the caller's are restored after): the
    same key gives the same numbers whichever thread, rank or process
    draws them. Deterministic data parallelism keys each virtual shard's
    random ops by (step key, global shard index) this way."""
    words = [int(k) & 0xFFFF_FFFF_FFFF_FFFF for k in key]
    ss = np.random.SeedSequence(words)
    cpu = Generator()
    cpu._seed = words[0]
    cpu._rng = np.random.Generator(np.random.PCG64(ss))
    cuda_seed = int(ss.generate_state(1, np.uint64)[0]) & (2 ** 63 - 1)
    prev = _state.get()
    _state.set(_RNGState(cpu, cuda_seed))
    try:
        yield
    finally:
        _state.set(prev)


def _cuda_index(device):
    d = _backend.to_device(device) if device is not None else None
    if d is None or d.index is None:
        return _backend.current_cuda_index()
    return d.index


def cuda_random_state(device=None):
    """The CuPy RandomState of a CUDA device (the current one by default),
    seeded on first use from manual_seed's seed. Draw from it inside the
    device's context (``with device.context():``)."""
    index = _cuda_index(device)
    return _cuda_rs(_cuda_gen(index), index)


def cuda_manual_seed(seed, device=None, all_devices=False):
    seed = int(seed) & 0xFFFF_FFFF_FFFF_FFFF
    if all_devices:
        st = _state.get()
        st.cuda_seed = seed
        gens = list(st.cuda_gens.values())
    else:
        gens = [_cuda_gen(_cuda_index(device))]
    for g in gens:
        g.seed, g.epoch, g.rs = seed, 0, None


def cuda_get_rng_state(device=None):
    """A JSON-friendly key of a CUDA device's generator state."""
    return _cuda_key(_cuda_gen(_cuda_index(device)))


def cuda_set_rng_state(state, device=None):
    g = _cuda_gen(_cuda_index(device))
    g.seed, g.epoch, g.rs = int(state["seed"]), int(state["epoch"]), None


def manual_seed(seed):
    """Seed the default generator and every CUDA device's (lazily: no CuPy
    import here, the devices are seeded at their first draw)."""
    default_generator.manual_seed(seed)
    cuda_manual_seed(seed, all_devices=True)
    return default_generator


def seed():
    return default_generator.seed()


def initial_seed():
    return default_generator.initial_seed()


def get_rng_state():
    return default_generator.get_state()


def set_rng_state(state):
    default_generator.set_state(state)


def _rng(generator=None):
    return (generator or default_generator).rng


# ---------------------------------------------------------- sampling ----
# NumPy Generator method -> CuPy RandomState method, and whether CuPy's
# takes a float dtype= (cuRAND draws float32 or float64 only)
_CUPY_METHODS = {
    "random": ("random_sample", True), "standard_normal": (None, True),
    "normal": (None, True), "uniform": (None, True),
    "exponential": (None, True), "lognormal": (None, True),
    "standard_cauchy": (None, True), "integers": ("randint", False),
    "geometric": (None, False), "poisson": (None, False),
    "permutation": (None, False)}


def draw(method, *args, size=None, device=None, generator=None,
         dtype=None):
    """Random numbers drawn where they are used: on the CPU by
    ``generator`` (default: the default generator), as
    ``generator.<method>(*args, size)`` with NumPy's Generator method names;
    on a CUDA device by that device's generator (or a CUDA ``generator``),
    inside the device's context - never drawn on the host and copied.
    ``args`` may be arrays on the device (means, probabilities); the result
    has ``dtype`` (a NumPy dtype) when given.

    Example::

        a = draw("normal", 0.0, 1.0, size=(3,), device="cuda:1",
                 dtype=np.float32)
    """
    dev = _backend.factory_device(device)
    if dev is not None and dev.type == "meta":
        return _backend.MetaArray(size if size is not None else (),
                                  dtype or np.float64)
    if dev is None or dev.type == "cpu":
        if generator is not None and generator._cuda is not None:
            raise RuntimeError(
                f"Expected a 'cpu' device type for generator but found "
                f"'{generator.device.type}'")
        f = getattr(_rng(generator), method)
        a = f(*args) if method == "permutation" else f(*args, size=size)
        return a if dtype is None else np.asarray(a).astype(dtype,
                                                         copy=False)
    cp = _backend.check_cuda_available()
    index = dev.index if dev.index is not None else \
        _backend.current_cuda_index()
    if generator is None:
        rs = _cuda_rs(_cuda_gen(index), index)
    elif generator._cuda is None:
        raise RuntimeError(
            "Expected a 'cuda' device type for generator but found 'cpu'")
    else:
        gi = generator.device.index
        if gi is not None and gi != index:
            raise RuntimeError(
                f"Expected a generator of device cuda:{index} but found "
                f"one of cuda:{gi}")
        rs = _cuda_rs(generator._cuda, index)
        if rs._dtorch_device != index:
            raise RuntimeError(
                f"Expected a generator of device cuda:{index} but found "
                f"one of cuda:{rs._dtorch_device}")
    name, floating = _CUPY_METHODS[method]
    f = getattr(rs, name or method)
    with cp.cuda.Device(index):
        if method == "permutation":
            a = f(*args)
        elif floating:
            fd = np.float64 if dtype is not None and \
                np.dtype(dtype) == np.float64 else np.float32
            a = f(*args, size=size, dtype=fd)
        elif method == "integers":
            a = f(*args, size=size, dtype=np.int64)
        else:
            a = f(*args, size=size)
        if dtype is not None:
            a = a.astype(dtype, copy=False)
    return a


# NumPy Generator methods that take the same bits for each element whatever
# the size of the call (no state carried from one element to the next, as
# the integers' buffered 32-bit halves are): drawn in chunks, they give
# the values of one whole draw, bit for bit
_PER_ELEMENT = frozenset({"random", "uniform", "normal", "standard_normal",
                          "exponential", "lognormal", "standard_cauchy"})
_CHUNK = 8192           # elements: a 64 KiB float64 draw at a time


def draw_into(out, method, *args, device=None, generator=None, dtype=None,
              then=None):
    """Fill the array ``out`` with ``draw(method, *args, size=out.shape,
    device=, generator=, dtype=)``, passed through ``then`` (a function of
    the drawn array) when given, and returns ``out``. The values are
    those of ``out[...] = then(draw(...))`` bit for bit, without its
    temporaries: on the CPU a per-element method with scalar ``args`` is
    drawn (and transformed and cast) in chunks of ``_CHUNK`` elements
    straight into a C-contiguous ``out``, so initialising a parameter
    needs no full-size float64 draw nor a cast copy of it."""
    dev = _backend.factory_device(device)
    flat = out.reshape(-1) if type(out) is np.ndarray and \
        out.flags.c_contiguous else None
    if flat is None or (dev is not None and dev.type != "cpu") or \
            method not in _PER_ELEMENT or \
            not all(isinstance(a, numbers.Real) for a in args):
        a = draw(method, *args, size=out.shape, device=device,
                 generator=generator, dtype=dtype)
        out[...] = a if then is None else then(a)
        return out
    for i in range(0, flat.size or 1, _CHUNK):    # size 0: draw() checks
        a = draw(method, *args, size=(min(_CHUNK, flat.size - i),),
                 generator=generator, dtype=dtype)
        flat[i:i + a.size] = a if then is None else then(a)
    return out

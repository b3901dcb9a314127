"""Random number generation: ``dtorch.Generator``, ``manual_seed``, and the
default generator that every random factory and initialiser draws from.

The same seed gives the same numbers on every run and platform (NumPy's
PCG64); the streams differ from PyTorch's.
"""
import numpy as np

from . import _backend


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

    def manual_seed(self, seed):
        seed = int(seed)
        if seed < 0:
            seed = seed & 0xFFFF_FFFF_FFFF_FFFF
        self._seed = seed
        self._rng = np.random.Generator(np.random.PCG64(seed))
        return self

    def seed(self):
        s = int(np.random.SeedSequence().entropy % (1 << 63))
        self.manual_seed(s)
        return s

    def initial_seed(self):
        return self._seed

    def get_state(self):
        """The state as a JSON-friendly dict (PCG64's two 128-bit words)."""
        st = self._rng.bit_generator.state
        return {"seed": self._seed, "state": str(st["state"]["state"]),
                "inc": str(st["state"]["inc"]),
                "has_uint32": st["has_uint32"], "uinteger": st["uinteger"]}

    def set_state(self, state):
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


default_generator = Generator()


def manual_seed(seed):
    """Seed the default generator (and CuPy's, when it is in use)."""
    default_generator.manual_seed(seed)
    if _backend._cupy is not None:
        _backend._cupy.random.seed(int(seed) & 0xFFFF_FFFF)
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

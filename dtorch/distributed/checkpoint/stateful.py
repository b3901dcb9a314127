"""``Stateful`` (PyTorch's protocol) and ``RNGState``, the random
generators' state as a Stateful."""
import typing

__all__ = ["Stateful", "RNGState"]


@typing.runtime_checkable
class Stateful(typing.Protocol):
    """What dcp treats as an object to save through its state dict."""

    def state_dict(self):
        ...

    def load_state_dict(self, state_dict):
        ...


class RNGState:
    """The default generator's state (and the given generators', e.g. a
    DataLoader's), for a checkpoint: ``{"rng": RNGState(loader_g)}``. Each
    rank saves its own when they differ, and gets its own back on the same
    world size. CUDA generators are included with ``cuda=True`` (reading
    their state re-keys them, see dtorch.cuda.get_rng_state)."""

    def __init__(self, *generators, cuda=False):
        self.generators = generators
        self.cuda = cuda

    def state_dict(self):
        import dtorch
        out = {"default": dtorch.get_rng_state(),
               "generators": [g.get_state() for g in self.generators]}
        if self.cuda and dtorch.cuda.is_available():
            out["cuda"] = dtorch.cuda.get_rng_state_all()
        return out

    def load_state_dict(self, state):
        import dtorch
        if len(state["generators"]) != len(self.generators):
            raise ValueError(
                f"RNGState: the checkpoint has {len(state['generators'])} "
                f"generators, this RNGState {len(self.generators)}")
        dtorch.set_rng_state(state["default"])
        for g, s in zip(self.generators, state["generators"]):
            g.set_state(s)
        if "cuda" in state and self.cuda and dtorch.cuda.is_available():
            dtorch.cuda.set_rng_state_all(state["cuda"])

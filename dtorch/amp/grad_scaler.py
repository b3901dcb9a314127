"""``GradScaler``: dynamic loss scaling for float16 training (PyTorch's
semantics, after torch/amp/grad_scaler.py).

scale(loss) multiplies by the scale S (a float32 0-d tensor, so a 16-bit
loss is scaled in float32); unscale_(optimizer) multiplies the gradients by
1/S in place and records whether any is inf/NaN; step(optimizer) unscales if
the user did not, and skips optimizer.step() when a non-finite gradient was
seen; update() halves S (backoff_factor) after a skipped step, and doubles
it (growth_factor) after growth_interval steps in a row without one.

Across ranks: when ``dtorch.distributed`` is initialized, the found-inf flag
is all-reduced with MAX over ``process_group`` (default: the default group)
in unscale_, so every rank makes the same skip decision and keeps the same
scale even when only one rank's gradients (a tensor-parallel shard, a ZeRO
shard, a pipeline stage) overflowed. dtorch.distributed sits a layer above
dtorch.amp, so it is looked up in ``sys.modules`` (it is loaded by whoever
initialized it) instead of imported.
"""
import sys
import warnings
from enum import Enum

import numpy as np

from .. import _backend as B
from .._creation import tensor as _tensor

__all__ = ["GradScaler", "OptState"]


class OptState(Enum):
    READY = 0
    UNSCALED = 1
    STEPPED = 2


def _fresh_state():
    return {"stage": OptState.READY, "found_inf_per_device": {}}


_FIX = ("This may indicate your script did not use "
        "scaler.scale(loss or outputs) earlier in the iteration.")


class GradScaler:
    def __init__(self, device="cuda", init_scale=2.0 ** 16,
                 growth_factor=2.0, backoff_factor=0.5, growth_interval=2000,
                 enabled=True, *, process_group=None):
        self._device = str(device)
        self._enabled = bool(enabled)
        if self._enabled and self._device.startswith("cuda") \
                and not B.cupy_available():
            warnings.warn(
                "torch.cuda.amp.GradScaler is enabled, but CUDA is not "
                "available.  Disabling.")
            self._enabled = False
        if self._enabled:
            if growth_factor <= 1.0:
                raise ValueError("The growth factor must be > 1.0.")
            if backoff_factor >= 1.0:
                raise ValueError("The backoff factor must be < 1.0.")
            if not isinstance(growth_interval, int) or growth_interval <= 0:
                raise ValueError("growth_interval must be a positive int.")
        self._init_scale = init_scale
        self._growth_factor = growth_factor
        self._backoff_factor = backoff_factor
        self._growth_interval = growth_interval
        self._process_group = process_group
        # float32, as PyTorch's scale tensor: growth stops where S * growth
        # would overflow float32
        self._scale = None
        self._growth_tracker = None
        self._init_growth_tracker = 0
        self._per_optimizer_states = {}

    # ------------------------------------------------------------- scale --
    def _lazy_init(self):
        self._scale = np.float32(self._init_scale)
        self._growth_tracker = self._init_growth_tracker

    def _check(self, funcname):
        if self._scale is None:
            raise AssertionError(
                f"Attempted {funcname} but _scale is None.  " + _FIX)

    def scale(self, outputs):
        """outputs (a tensor or nested list/tuple of tensors) times S."""
        if not self._enabled:
            return outputs
        if self._scale is None:
            self._lazy_init()

        def apply(v):
            if hasattr(v, "_data"):
                return v * _tensor(self._scale, dtype=B.float32,
                                   device=v.device)
            if isinstance(v, (list, tuple)):
                out = [apply(x) for x in v]
                return type(v)(out) if isinstance(v, tuple) else out
            if isinstance(v, dict):
                return {k: apply(x) for k, x in v.items()}
            raise ValueError(
                "outputs must be a Tensor or an iterable of Tensors")
        return apply(outputs)

    # ----------------------------------------------------------- unscale --
    def _state(self, optimizer):
        return self._per_optimizer_states.setdefault(id(optimizer),
                                                     _fresh_state())

    def _unscale_grads_(self, optimizer, inv_scale, allow_fp16):
        found = {}
        for group in optimizer.param_groups:
            for p in group["params"]:
                g = p.grad
                if g is None:
                    continue
                if not allow_fp16 and g.dtype is B.float16:
                    raise ValueError("Attempting to unscale FP16 gradients.")
                a = g._data
                xp = B.get_array_module(a)
                key = str(g.device)
                # one multiply in place, then one finiteness reduction;
                # on CuPy the flag stays on the device until step()
                xp.multiply(a, a.dtype.type(inv_scale) if a.dtype.kind ==
                            "f" else inv_scale, out=a, casting="unsafe")
                bad = ~xp.isfinite(a).all()
                prev = found.get(key)
                found[key] = bad if prev is None else (prev | bad)
                g._bump_version()
        return {k: float(v) for k, v in found.items()}

    def _reduce_found(self, found, optimizer):
        dist = sys.modules.get("dtorch.distributed")
        if dist is None or not dist.is_available() \
                or not dist.is_initialized():
            return found
        if dist.get_world_size(self._process_group) == 1:
            return found
        flag = max(found.values()) if found else 0.0
        dev = "cpu"
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    dev = p.grad.device
                    break
        t = _tensor([flag], dtype=B.float32, device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self._process_group)
        flag = float(t.cpu()._data[0])
        # a rank without gradients still records the group's verdict
        if not found:
            return {str(dev): flag}
        return {k: flag for k in found}

    def unscale_(self, optimizer):
        """Divide optimizer's gradients by S in place (call before
        clip_grad_norm_); once per optimizer between updates."""
        if not self._enabled:
            return
        self._check("unscale_")
        st = self._state(optimizer)
        if st["stage"] is OptState.UNSCALED:
            raise RuntimeError(
                "unscale_() has already been called on this optimizer "
                "since the last update().")
        if st["stage"] is OptState.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        # 1/S in double rounded to float32, as PyTorch
        inv = np.float32(1.0 / float(self._scale))
        found = self._unscale_grads_(optimizer, inv, False)
        st["found_inf_per_device"] = self._reduce_found(found, optimizer)
        st["stage"] = OptState.UNSCALED

    # -------------------------------------------------------------- step --
    def step(self, optimizer, *args, **kwargs):
        """optimizer.step() unless a gradient was inf/NaN; returns its
        value (None when skipped)."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if "
                               "GradScaler is enabled.")
        self._check("step")
        st = self._state(optimizer)
        if st["stage"] is OptState.STEPPED:
            raise RuntimeError(
                "step() has already been called since the last update().")
        if st["stage"] is OptState.READY:
            self.unscale_(optimizer)
        if not st["found_inf_per_device"]:
            raise AssertionError(
                "No inf checks were recorded for this optimizer.")
        ret = None
        if not sum(st["found_inf_per_device"].values()):
            ret = optimizer.step(*args, **kwargs)
        st["stage"] = OptState.STEPPED
        return ret

    def update(self, new_scale=None):
        """Adjust S for the next iteration (or set it to new_scale)."""
        if not self._enabled:
            return
        self._check("update")
        if new_scale is not None:
            if hasattr(new_scale, "_data"):
                if new_scale.numel() != 1 or new_scale.requires_grad:
                    raise AssertionError(
                        "new_scale should be a float or a 1-element "
                        "torch.cuda.FloatTensor or torch.FloatTensor with "
                        "requires_grad=False.")
                new_scale = float(new_scale.cpu()._data.reshape(-1)[0])
            self._scale = np.float32(new_scale)
        else:
            found = [v for st in self._per_optimizer_states.values()
                     for v in st["found_inf_per_device"].values()]
            if not found:
                raise AssertionError(
                    "No inf checks were recorded prior to update.")
            if sum(found):
                self._scale = np.float32(self._scale * np.float32(
                    self._backoff_factor))
                self._growth_tracker = 0
            else:
                done = self._growth_tracker + 1
                if done == self._growth_interval:
                    with np.errstate(over="ignore"):  # inf: not taken
                        grown = np.float32(self._scale) * np.float32(
                            self._growth_factor)
                    if np.isfinite(grown):
                        self._scale = grown
                    done = 0
                self._growth_tracker = done
        self._per_optimizer_states = {}

    # ----------------------------------------------------------- getters --
    def get_scale(self):
        if not self._enabled:
            return 1.0
        return float(self._init_scale) if self._scale is None \
            else float(self._scale)

    def get_growth_factor(self):
        return self._growth_factor

    def set_growth_factor(self, new_factor):
        self._growth_factor = new_factor

    def get_backoff_factor(self):
        return self._backoff_factor

    def set_backoff_factor(self, new_factor):
        self._backoff_factor = new_factor

    def get_growth_interval(self):
        return self._growth_interval

    def set_growth_interval(self, new_interval):
        self._growth_interval = new_interval

    def _get_growth_tracker(self):
        if not self._enabled:
            return 0
        return 0 if self._growth_tracker is None else self._growth_tracker

    def is_enabled(self):
        return self._enabled

    # ------------------------------------------------------- checkpoints --
    def state_dict(self):
        if not self._enabled:
            return {}
        return {"scale": self.get_scale(),
                "growth_factor": self._growth_factor,
                "backoff_factor": self._backoff_factor,
                "growth_interval": self._growth_interval,
                "_growth_tracker": self._get_growth_tracker()}

    def load_state_dict(self, state_dict):
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError(
                "The source state dict is empty, possibly because it was "
                "saved from a disabled instance of GradScaler.")
        self._init_scale = float(state_dict["scale"])
        self._growth_factor = float(state_dict["growth_factor"])
        self._backoff_factor = float(state_dict["backoff_factor"])
        self._growth_interval = int(state_dict["growth_interval"])
        self._init_growth_tracker = int(state_dict["_growth_tracker"])
        # as PyTorch: the values apply now if the scaler has started, else
        # at its lazy start
        if self._scale is not None:
            self._scale = np.float32(self._init_scale)
            self._growth_tracker = self._init_growth_tracker

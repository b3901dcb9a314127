"""Moving data without arithmetic, forward and backward side by side:
reshape, permute, expand (views), cat, stack, pad (constant, reflect,
replicate, circular), contiguous copies, dtype casts and device moves.
"""
import numpy as np

from .._backend import get_array_module, from_np, result_type, device_of
from .base import Op, _axes, _device_error, unbroadcast, grad_xp, astype
from .index import index_add0


# ============================================================= views ==

class Reshape(Op):
    _is_view = True

    @staticmethod
    def forward(ctx, x, shape=()):
        ctx.shape = x.shape
        try:
            return x.reshape(shape)
        except ValueError:
            raise RuntimeError(
                f"shape '{list(shape)}' is invalid for input of size "
                f"{x.size}") from None

    @staticmethod
    def backward(ctx, g):
        return g.reshape(ctx.shape)


class Permute(Op):
    _is_view = True

    @staticmethod
    def forward(ctx, x, dims=()):
        ctx.dims = dims
        return x.transpose(dims)

    @staticmethod
    def backward(ctx, g):
        # the inverse permutation, in Python: np.argsort of a short tuple
        # costs ~3 us, more than the whole op on a small tensor
        dims = ctx.dims
        inv = [0] * len(dims)
        for i, d in enumerate(dims):
            inv[d] = i
        if ctx._gmake is None:      # the method: half np.transpose's cost
            return g.transpose(inv)
        return grad_xp(g).transpose(g, inv)


class Expand(Op):
    _is_view = True

    @staticmethod
    def forward(ctx, x, shape=()):
        ctx.shape = x.shape
        return get_array_module(x).broadcast_to(x, shape)

    @staticmethod
    def backward(ctx, g):
        return unbroadcast(g, ctx.shape)


# =============================================== joining and padding ==

class Cat(Op):
    @staticmethod
    def forward(ctx, *xs, dim=0):
        xp = get_array_module(*xs)
        ref = xs[0]
        axis = _axes(dim, ref.ndim)[0]
        for i, x in enumerate(xs):
            if type(x) is not type(ref):
                raise _device_error("cat", ref, x)
            if x.ndim != ref.ndim or any(
                    a != b for j, (a, b) in enumerate(zip(x.shape, ref.shape))
                    if j != axis):
                raise RuntimeError(
                    f"Sizes of tensors must match except in dimension "
                    f"{axis}. Expected {list(ref.shape)} but got "
                    f"{list(x.shape)} for tensor number {i} in the list.")
        dt = xs[0].dtype
        if any(x.dtype != dt for x in xs):
            rt = from_np(dt)
            for x in xs[1:]:
                rt = result_type(rt, from_np(x.dtype))
            dt = rt.np
        ctx.sizes = [x.shape[axis] for x in xs]
        ctx.dtypes = [x.dtype for x in xs]
        ctx.axis = axis
        return xp.concatenate(xs, axis=axis).astype(dt, copy=False)

    @staticmethod
    def backward(ctx, g):
        splits = np.cumsum(ctx.sizes)[:-1]
        parts = grad_xp(g).split(g, splits.tolist(), axis=ctx.axis)
        return tuple(astype(p, d) for p, d in zip(parts, ctx.dtypes))


def stack(*xs, dim=0):
    """torch.stack composed: each input gains the new axis (a Reshape view),
    one Cat joins them. The result's dtype is Cat's promotion, as PyTorch's
    stack; backward is Cat's split and Reshape's, both exact."""
    ref = xs[0]
    ra = getattr(ref, "_data", ref)
    for i, x in enumerate(xs):
        xa = getattr(x, "_data", x)
        if type(xa) is not type(ra):
            raise _device_error("stack", ra, xa)
        if x.shape != ref.shape:
            raise RuntimeError(
                f"stack expects each tensor to be equal size, but got "
                f"{list(ref.shape)} at entry 0 and {list(x.shape)} at "
                f"entry {i}")
    axis = _axes(dim, ref.ndim + 1)[0]
    shape = tuple(ref.shape[:axis]) + (1,) + tuple(ref.shape[axis:])
    return Cat.apply(*[Reshape.apply(x, shape=shape) for x in xs], dim=axis)


_NP_PAD_MODES = {"reflect": "reflect", "replicate": "edge",
                 "circular": "wrap"}


class Pad(Op):
    """Pad with ``pads`` = ((before, after), ...) for every axis. Constant
    padding slices in backward; the other modes gather along each axis with
    an index array and scatter back with ``index_add0``."""
    @staticmethod
    def forward(ctx, x, pads=(), mode="constant", value=0.0):
        xp = get_array_module(x)
        ctx.pads, ctx.mode, ctx.shape = pads, mode, x.shape
        if mode == "constant":
            return xp.pad(x, pads, constant_values=value)
        idxs = []
        out = x
        for ax, (lo, hi) in enumerate(pads):
            if lo or hi:
                idx = np.pad(np.arange(x.shape[ax]), (lo, hi),
                             mode=_NP_PAD_MODES[mode])
                idx = xp.asarray(idx)
                out = xp.take(out, idx, axis=ax)
                idxs.append((ax, idx))
        ctx.idxs = idxs
        return out

    @staticmethod
    def backward(ctx, g):
        xp = grad_xp(g)
        if ctx.mode == "constant":
            key = tuple(slice(lo, g.shape[i] - hi)
                        for i, (lo, hi) in enumerate(ctx.pads))
            return g[key]
        for ax, idx in reversed(ctx.idxs):
            gm = xp.moveaxis(g, ax, 0)
            gm = index_add0(xp, (ctx.shape[ax],) + tuple(gm.shape[1:]),
                            gm.dtype, idx, gm)
            g = xp.moveaxis(gm, 0, ax)
        return g


# ============================================================ copies ==

class Copy(Op):
    """A C-contiguous copy (``contiguous()``)."""
    @staticmethod
    def forward(ctx, x):
        return get_array_module(x).ascontiguousarray(x)

    @staticmethod
    def backward(ctx, g):
        return g


class Cast(Op):
    """A dtype cast and/or a device move, as PyTorch's one ``_to_copy``:
    backward casts the gradient back to the input's dtype and sends it
    back to its device."""
    @staticmethod
    def forward(ctx, x, np_dtype=None, device=None):
        ctx.src, ctx.dev = x.dtype, None
        if device is not None:
            ctx.dev = device_of(x)
            x = device.send(x)
        return x if np_dtype is None else x.astype(np_dtype)

    @staticmethod
    def backward(ctx, g):
        g = astype(g, ctx.src)
        if ctx.dev is None:
            return g
        if ctx._gmake is None:
            return ctx.dev.send(g)
        return ToDevice.apply(g, device=ctx.dev)   # a tensor: the op


class ToDevice(Cast):
    """``Cast`` to a device only (its own grad_fn name)."""
    @staticmethod
    def forward(ctx, x, device=None):
        return Cast.forward(ctx, x, device=device)

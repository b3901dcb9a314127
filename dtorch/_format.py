"""``repr`` of tensors in PyTorch's style: ``tensor([1., 2.], requires_grad=True)``."""
import numpy as np

from . import _backend as B

_DEFAULT_SHOWN = ("float32", "int64", "bool")


def _float_formatter(a):
    finite = a[np.isfinite(a)] if a.size else a
    if finite.size == 0:
        return lambda v: f"{v}"
    amax = np.abs(finite).max()
    nz = np.abs(finite[finite != 0])
    amin = nz.min() if nz.size else 0.0
    if (finite == np.round(finite)).all() and amax < 1e8:
        return lambda v: f"{v:.0f}." if np.isfinite(v) else f"{v}"
    if amax >= 1e8 or (amin and amin < 1e-4) or (amin and amax / amin > 1e3
                                                  and amax >= 1e3):
        return lambda v: f"{v:.4e}"
    return lambda v: f"{v:.4f}" if np.isfinite(v) else f"{v}"


def format_tensor(t):
    a = t._data
    if type(a) is B.MetaArray:        # PyTorch's form: no values to show
        extras = [f"size={tuple(a.shape)}"]
        if t.dtype is not B.get_default_dtype():
            extras.append(f"dtype={t.dtype!r}")
        if t.grad_fn is not None:
            extras.append(f"grad_fn=<{t.grad_fn.name()}>")
        elif t.requires_grad:
            extras.append("requires_grad=True")
        return f"tensor(..., device='meta', {', '.join(extras)})"
    if B.is_cupy_array(a):
        a = a.get()
    dt = t.dtype
    if dt.name in ("bfloat16", "float16"):
        a = a.astype(np.float32)
    if dt.is_floating_point:
        f = _float_formatter(a)
        opts = {"float_kind": f}
    else:
        opts = None
    body = np.array2string(a, separator=", ", prefix="tensor(",
                           formatter=opts, threshold=1000, edgeitems=3,
                           max_line_width=80)
    extras = []
    if t.device.type != "cpu":
        extras.append(f"device='{t.device}'")
    if dt.name not in _DEFAULT_SHOWN or (a.size == 0 and dt.name != "float32"):
        extras.append(f"dtype={dt!r}")
    if t.grad_fn is not None:
        extras.append(f"grad_fn=<{t.grad_fn.name()}>")
    elif t.requires_grad:
        extras.append("requires_grad=True")
    if a.size == 0 and a.ndim > 1:
        extras.insert(0, f"size={tuple(a.shape)}")
    return "tensor(" + ", ".join([body] + extras) + ")"

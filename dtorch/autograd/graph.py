"""``dtorch.autograd.graph``: hooks on the values autograd saves for
backward (PyTorch's ``saved_tensors_hooks``, ``save_on_cpu``,
``disable_saved_tensors_hooks``).

Within ``with saved_tensors_hooks(pack, unpack):`` every value an op saves
for backward goes through ``pack(tensor)`` when the op runs, and what pack
returned is all the graph keeps; ``unpack(that)`` gives the value back
(a tensor) when backward first needs it. Activation checkpointing
(``dtorch.utils.checkpoint``) and CPU offloading are built on this.

What "saved" means in dtorch: a primitive's ``forward`` stores arrays on
its ctx (``ctx.save_for_backward(...)`` or plain attributes such as
``ctx.mask``); each array attribute, and each array inside a tuple or list
attribute, is one saved value; a custom ``Function``'s saved values are the
tensors of its ``save_for_backward``. pack sees the op's input or output
tensor itself when the array is that tensor's data, else a new tensor over
the array. The hooks of the innermost region of the calling thread apply.
Outside every region nothing is packed and a recorded op pays one global
lookup (``autograd.function._saved_hooks``).
"""
import contextlib
import threading
import weakref

import numpy as np

from .. import _backend as _B
from . import function as _fn
from .function import Packed, TensorBase

__all__ = ["saved_tensors_hooks", "save_on_cpu",
           "disable_saved_tensors_hooks"]


class _Stack(threading.local):
    def __init__(self):
        self.hooks = []          # (pack, unpack), innermost last
        self.disabled = None     # disable_saved_tensors_hooks' message


_tls = _Stack()
_open = [0]                      # regions open in all threads
_lock = threading.Lock()


def _install(delta):
    with _lock:
        _open[0] += delta
        _fn._saved_hooks = _pack_saved if _open[0] > 0 else None


def _array_types():
    """The array types a ctx may save (CuPy's once it is loaded)."""
    cp = _B._cupy
    return (np.ndarray,) if cp is None else (np.ndarray, cp.ndarray)


def _arg_index(a, args):
    for i, x in enumerate(args):
        if isinstance(x, TensorBase) and x._data is a:
            return i
    return None


def _pack_saved(ctx, args, out, inputs_only=None):
    """Installed as autograd.function._saved_hooks: replace what forward
    saved on ``ctx`` by what this thread's innermost pack hook makes of
    it (``out`` is None for a custom Function, whose saved values are
    tensors). With a list ``inputs_only``, only the saved arrays that are
    an input's data are packed, and the inputs' positions appended to it,
    in packing order."""
    hooks = _tls.hooks
    if not hooks or hooks[-1] is None:
        return          # another thread's region, or within keep_saved()
    pack, unpack = hooks[-1]
    _tls.op = type(ctx).__name__
    d = ctx.__dict__
    packed = {}

    def one(a):
        # pack sees the op's output or input tensor itself when the array
        # is its data, else a new tensor over the array
        if out is not None and a is out._data and inputs_only is None:
            return Packed(unpack, pack(out), True)
        i = _arg_index(a, args)
        if inputs_only is not None:
            if i is None:
                return a
            inputs_only.append(i)
        t = args[i] if i is not None else out._make(a, False, None)
        return Packed(unpack, pack(t), True)

    if out is None:              # a custom Function: its saved tensors
        saved = d.get("to_save")
        if saved and any(isinstance(t, TensorBase) for t in saved):
            packed["to_save"] = tuple(
                Packed(unpack, pack(t), False)
                if isinstance(t, TensorBase) else t for t in saved)
    else:
        arrays = _array_types()      # by type: called for every op saved
        for k, v in d.items():
            t = type(v)
            if t in arrays:
                p = one(v)
                if p is not v:
                    packed[k] = p
            elif (t is tuple or t is list) and v and \
                    any(type(e) in arrays for e in v):
                p = t(one(e) if type(e) in arrays else e for e in v)
                if any(type(e) is Packed for e in p):
                    packed[k] = p
    if packed:
        for k in packed:
            del d[k]
        d["_packed"] = packed
        vers = ctx._versions
        if vers:
            # the version check names the tensor it found changed: by a
            # weak reference now, or it would keep what pack let go
            ctx._versions = [
                e if type(e[2]) is weakref.ref
                else (e[0], e[1], weakref.ref(e[2]), e[3]) for e in vers]


# dtorch's own: what selective checkpointing needs of the hooks

pack_saved_now = _pack_saved


def pack_now(tensor):
    """``tensor`` through the innermost pack hook, as if an op saved it
    (a selective recomputation stands in for an op it does not run)."""
    hooks = [h for h in _tls.hooks if h is not None]
    hooks[-1][0](tensor)


def current_op():
    """The name of the op whose saved values are being packed."""
    return getattr(_tls, "op", None)


@contextlib.contextmanager
def keep_saved():
    """Within ``with keep_saved():`` ops keep what they save as it is,
    whatever hooks are open (``pack_saved_now(ctx, args, out)`` packs a
    node's values afterwards)."""
    _tls.hooks.append(None)
    try:
        yield
    finally:
        _tls.hooks.pop()


class saved_tensors_hooks:
    """``with saved_tensors_hooks(pack_hook, unpack_hook):`` (PyTorch's):
    the values that ops in the region save for backward are replaced by
    ``pack_hook(tensor)``; ``unpack_hook(packed)`` must return a tensor of
    the same shape and dtype when backward needs it.

    Example (keep saved activations in float16)::

        with dtorch.autograd.graph.saved_tensors_hooks(
                lambda t: t.half(), lambda t: t.float()):
            loss = model(x).sum()
        loss.backward()
    """

    def __init__(self, pack_hook, unpack_hook):
        self.pack_hook = pack_hook
        self.unpack_hook = unpack_hook

    def __enter__(self):
        if _tls.disabled is not None:
            raise RuntimeError(_tls.disabled)
        _tls.hooks.append((self.pack_hook, self.unpack_hook))
        _install(1)
        return self

    def __exit__(self, *exc):
        _tls.hooks.pop()
        _install(-1)
        return False


class save_on_cpu(saved_tensors_hooks):
    """``with save_on_cpu(pin_memory=False, device_type='cuda'):`` saved
    values of CUDA tensors live in host memory until backward, which
    copies them back to their device (PyTorch's offloading context)."""

    def __init__(self, pin_memory=False, device_type="cuda"):
        def pack(t):
            if t.device.type == "cpu":
                return (None, t)
            return (t.device, t.to("cpu"))

        def unpack(packed):
            device, t = packed
            return t if device is None else t.to(device)

        super().__init__(pack, unpack)


class disable_saved_tensors_hooks:
    """Within ``with disable_saved_tensors_hooks(error_message):`` opening
    a ``saved_tensors_hooks`` region raises RuntimeError(error_message)."""

    def __init__(self, error_message):
        self.error_message = error_message

    def __enter__(self):
        self._prev, _tls.disabled = _tls.disabled, self.error_message
        return self

    def __exit__(self, *exc):
        _tls.disabled = self._prev
        return False

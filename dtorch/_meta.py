"""The array of the ``meta`` device: a shape, a dtype and C strides, no
storage.

Ops need no meta code of their own: they call NumPy functions, operators
and array methods on their arguments, and ``MetaArray`` answers those
through NumPy's protocols (``__array_ufunc__``, ``__array_function__``)
and its methods with the result's shape and dtype, allocating nothing.
Result dtypes come from NumPy itself, run on 0-d stand-ins; result shapes
from the function's rule (broadcasting, reductions, matmul, reshapes), or
for indexing from a view of a 0-strided stand-in. What has no rule here
raises NotImplementedError naming the function.
"""
import math

import numpy as np

__all__ = ["MetaArray", "is_meta"]


def is_meta(a):
    return type(a) is MetaArray


def _shape(s):
    if isinstance(s, (int, np.integer)):
        return (int(s),)
    return tuple(int(n) for n in s)


def _proxy(a):
    """A 0-d NumPy stand-in of ``a``'s dtype (or ``a`` itself, a
    number), for NumPy to work out result dtypes on."""
    if type(a) is MetaArray or isinstance(a, np.ndarray):
        return np.zeros((), a.dtype)
    return a


def _view_proxy(a):
    # every element at one address: basic indexing of it is a view
    return np.broadcast_to(np.zeros((), a.dtype), a.shape)


def _shape_of(a):
    return a.shape if hasattr(a, "shape") else ()


def _axes(axis, ndim):
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, (int, np.integer)):
        axis = (axis,)
    return tuple(int(a) % max(ndim, 1) for a in axis)


def _reduced(shape, axis, keepdims):
    ax = _axes(axis, len(shape))
    if keepdims:
        return tuple(1 if i in ax else n for i, n in enumerate(shape))
    return tuple(n for i, n in enumerate(shape) if i not in ax)


def _matmul_shape(a, b):
    sa, sb = _shape_of(a), _shape_of(b)
    if not sa or not sb:
        raise ValueError("matmul: Input operand does not have enough "
                         "dimensions")
    va, vb = len(sa) == 1, len(sb) == 1
    sa = (1,) + sa if va else sa
    sb = sb + (1,) if vb else sb
    if sa[-1] != sb[-2]:
        raise ValueError(f"matmul: Input operand 1 has a mismatch in its "
                         f"core dimension 0 (size {sb[-2]} is different "
                         f"from {sa[-1]})")
    out = np.broadcast_shapes(sa[:-2], sb[:-2]) + (sa[-2], sb[-1])
    if va:
        out = out[:-2] + out[-1:]
    if vb:
        out = out[:-1]
    return out


def _reshape(shape, new):
    new = list(_shape(new[0]) if len(new) == 1 and not isinstance(
        new[0], (int, np.integer)) else _shape(new))
    size = math.prod(shape)
    if new.count(-1) == 1:
        rest = math.prod(n for n in new if n != -1)
        new[new.index(-1)] = size // rest if rest else 0
    if math.prod(new) != size:
        raise ValueError(f"cannot reshape array of size {size} into shape "
                         f"{tuple(new)}")
    return tuple(new)


class MetaArray:
    """Shape, dtype and strides of an array that has no data."""
    __slots__ = ("shape", "dtype")
    __array_priority__ = 200
    base = None

    def __init__(self, shape, dtype):
        self.shape = _shape(shape)
        self.dtype = np.dtype(dtype)

    # ---- what an array tells about itself
    ndim = property(lambda s: len(s.shape))
    size = property(lambda s: math.prod(s.shape))
    itemsize = property(lambda s: s.dtype.itemsize)
    nbytes = property(lambda s: s.size * s.dtype.itemsize)

    @property
    def strides(self):
        st, acc = [], self.dtype.itemsize
        for n in reversed(self.shape):
            st.append(acc)
            acc *= max(n, 1)
        return tuple(reversed(st))

    @property
    def flags(self):
        return {"C_CONTIGUOUS": True, "F_CONTIGUOUS": self.ndim <= 1,
                "c_contiguous": True, "f_contiguous": self.ndim <= 1}

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __repr__(self):
        return f"MetaArray(shape={self.shape}, dtype={self.dtype})"

    def _no_data(self, *a, **k):
        raise NotImplementedError("Cannot copy out of meta tensor; no "
                                  "data!")

    __array__ = item = tolist = tobytes = get = __float__ = __int__ = \
        __bool__ = __index__ = _no_data

    # ---- results with a shape rule
    def _like(self, shape, dtype=None):
        return MetaArray(shape, self.dtype if dtype is None else dtype)

    def reshape(self, *shape, order="C", copy=None):
        return self._like(_reshape(self.shape, shape))

    def view(self, dtype=None):
        return self._like(self.shape, dtype)

    def copy(self, order="C"):
        return self._like(self.shape)

    def astype(self, dtype, order="K", casting="unsafe", copy=True):
        return self._like(self.shape, dtype)

    def transpose(self, *axes):
        if not axes or axes == (None,):
            axes = tuple(reversed(range(self.ndim)))
        elif len(axes) == 1 and not isinstance(axes[0], (int, np.integer)):
            axes = tuple(axes[0])
        return self._like(tuple(self.shape[a] for a in axes))

    T = property(lambda s: s.transpose())

    def swapaxes(self, a, b):
        ax = list(range(self.ndim))
        ax[a], ax[b] = ax[b], ax[a]
        return self.transpose(ax)

    def squeeze(self, axis=None):
        ax = _axes(axis, self.ndim) if axis is not None else tuple(
            i for i, n in enumerate(self.shape) if n == 1)
        return self._like(tuple(n for i, n in enumerate(self.shape)
                                if i not in ax))

    def ravel(self, order="C"):
        return self._like((self.size,))

    flatten = ravel

    def fill(self, value):
        pass

    def __getitem__(self, idx):
        def plain(i):
            return i._data if hasattr(i, "_data") else (
                np.zeros(i.shape, i.dtype) if type(i) is MetaArray else i)
        idx = tuple(plain(i) for i in idx) if isinstance(idx, tuple) \
            else plain(idx)
        return self._like(_view_proxy(self)[idx].shape)

    def __setitem__(self, idx, value):
        pass            # nothing to write to

    def _reduce(self, axis=None, dtype=None, out=None, keepdims=False,
                **kw):
        return MetaArray(_reduced(self.shape, axis, keepdims),
                         dtype or self.dtype)

    sum = prod = mean = max = min = var = std = _reduce

    def _reduce_bool(self, axis=None, out=None, keepdims=False):
        return MetaArray(_reduced(self.shape, axis, keepdims), np.bool_)

    any = all = _reduce_bool

    def _arg(self, axis=None, out=None, keepdims=False):
        return MetaArray(_reduced(self.shape, axis, keepdims), np.int64)

    argmax = argmin = _arg

    def dot(self, other):
        return np.matmul(self, other)

    # ---- NumPy's protocols
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        out = kwargs.pop("out", None)
        if ufunc is np.matmul and method == "__call__":
            dt = np.result_type(*[_proxy(a) for a in inputs])
            res = MetaArray(_matmul_shape(*inputs), dt)
        elif method == "__call__":
            with np.errstate(all="ignore"):     # 0 / 0 on stand-ins
                dts = ufunc(*[_proxy(a) for a in inputs], **{
                    k: v for k, v in kwargs.items()
                    if k in ("dtype", "casting")})
            shape = np.broadcast_shapes(*[_shape_of(a) for a in inputs])
            res = (tuple(MetaArray(shape, d.dtype) for d in dts)
                   if isinstance(dts, tuple)
                   else MetaArray(shape, np.asarray(dts).dtype))
        elif method == "reduce":
            a = inputs[0]
            dt = kwargs.get("dtype") or ufunc.reduce(
                np.zeros((1,), a.dtype)).dtype
            res = MetaArray(_reduced(a.shape, kwargs.get("axis", 0),
                                     kwargs.get("keepdims", False)), dt)
        elif method == "accumulate":
            res = MetaArray(inputs[0].shape, kwargs.get("dtype")
                            or inputs[0].dtype)
        else:
            raise NotImplementedError(
                f"dtorch: {ufunc.__name__}.{method} has no meta-device "
                f"implementation")
        if out is not None:
            return out[0] if len(out) == 1 else out
        return res

    def __array_function__(self, func, types, args, kwargs):
        rule = _FUNCTIONS.get(func.__name__)
        if rule is None:
            raise NotImplementedError(
                f"dtorch: numpy.{func.__name__} has no meta-device "
                f"implementation")
        return rule(*args, **kwargs)


def _binary(op):
    def f(self, other):
        return op(self, other)
    return f


def _rbinary(op):
    def f(self, other):
        return op(other, self)
    return f


for _name, _op in (("add", np.add), ("sub", np.subtract),
                   ("mul", np.multiply), ("truediv", np.true_divide),
                   ("floordiv", np.floor_divide), ("mod", np.remainder),
                   ("pow", np.power), ("matmul", np.matmul),
                   ("and", np.bitwise_and), ("or", np.bitwise_or),
                   ("xor", np.bitwise_xor)):
    setattr(MetaArray, f"__{_name}__", _binary(_op))
    setattr(MetaArray, f"__r{_name}__", _rbinary(_op))
    setattr(MetaArray, f"__i{_name}__", lambda self, o: self)
for _name, _op in (("lt", np.less), ("le", np.less_equal),
                   ("gt", np.greater), ("ge", np.greater_equal),
                   ("eq", np.equal), ("ne", np.not_equal)):
    setattr(MetaArray, f"__{_name}__", _binary(_op))
MetaArray.__neg__ = lambda s: np.negative(s)
MetaArray.__abs__ = lambda s: np.absolute(s)
MetaArray.__invert__ = lambda s: np.invert(s)
MetaArray.__pos__ = lambda s: s.copy()
MetaArray.__hash__ = None


def _meta_of(a):
    return a if type(a) is MetaArray else MetaArray(np.shape(a),
                                                    np.asarray(a).dtype)


def _like_fn(a, dtype=None, order="K", subok=True, shape=None, **kw):
    return MetaArray(a.shape if shape is None else shape,
                     dtype or a.dtype)


def _full_like(a, fill_value, dtype=None, **kw):
    return _like_fn(a, dtype)


def _join(arrays, axis=0, new=False, dtype=None, **kw):
    arrays = [_meta_of(a) for a in arrays]
    dt = dtype or np.result_type(*[_proxy(a) for a in arrays])
    s = list(arrays[0].shape)
    if new:
        s.insert(axis % (len(s) + 1), len(arrays))
    else:
        s[axis] = sum(a.shape[axis] for a in arrays)
    return MetaArray(s, dt)


def _where(cond, x=None, y=None):
    if x is None:
        raise NotImplementedError("dtorch: numpy.where(cond) has no "
                                  "meta-device implementation")
    shape = np.broadcast_shapes(*[_shape_of(a) for a in (cond, x, y)])
    return MetaArray(shape, np.result_type(_proxy(x), _proxy(y)))


def _broadcast_to(a, shape, subok=False):
    return MetaArray(shape, a.dtype)


def _method(name):
    def f(a, *args, **kwargs):
        return getattr(_meta_of(a), name)(*args, **kwargs)
    return f


def _expand_dims(a, axis):
    s = list(a.shape)
    for ax in sorted(_axes(axis, a.ndim + len(_axes(axis, 99)))):
        s.insert(ax, 1)
    return MetaArray(s, a.dtype)


def _moveaxis(a, source, destination):
    src = _axes(source, a.ndim)
    dst = _axes(destination, a.ndim)
    order = [i for i in range(a.ndim) if i not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return a.transpose(order)


_FUNCTIONS = {
    "reshape": lambda a, shape, order="C", **k: a.reshape(shape),
    "transpose": lambda a, axes=None: a.transpose(axes),
    "swapaxes": lambda a, x, y: a.swapaxes(x, y),
    "moveaxis": _moveaxis,
    "squeeze": lambda a, axis=None: a.squeeze(axis),
    "expand_dims": _expand_dims,
    "ravel": lambda a, order="C": a.ravel(),
    "broadcast_to": _broadcast_to,
    "concatenate": lambda arrays, axis=0, **k: _join(arrays, axis, **k),
    "stack": lambda arrays, axis=0, **k: _join(arrays, axis, True, **k),
    "where": _where,
    "zeros_like": _like_fn, "ones_like": _like_fn, "empty_like": _like_fn,
    "full_like": _full_like,
    "copyto": lambda dst, src, **k: None,
    "copy": lambda a, **k: a.copy(),
    "shape": lambda a: a.shape, "ndim": lambda a: a.ndim,
    "size": lambda a, axis=None: a.size if axis is None else a.shape[axis],
    "result_type": lambda *a: np.result_type(*[_proxy(x) for x in a]),
    "dot": lambda a, b, out=None: np.matmul(a, b),
    "sum": _method("sum"), "mean": _method("mean"), "prod": _method("prod"),
    "max": _method("max"), "min": _method("min"), "amax": _method("max"),
    "amin": _method("min"), "var": _method("var"), "std": _method("std"),
    "any": _method("any"), "all": _method("all"),
    "argmax": _method("argmax"), "argmin": _method("argmin"),
    "clip": lambda a, lo=None, hi=None, **k: a.copy(),
    "round": lambda a, decimals=0, out=None: a.copy(),
    "around": lambda a, decimals=0, out=None: a.copy(),
    "may_share_memory": lambda a, b, max_work=None: False,
    "shares_memory": lambda a, b, max_work=None: False,
}

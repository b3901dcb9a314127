"""What every op shares: the ``Op`` base class (a Function over raw arrays),
``unbroadcast`` (the backward of broadcasting, in one place), ``promote``
(PyTorch's result dtype for two operands), ``keep_grad`` (masking a
gradient without inf * 0 = NaN) and the small helpers the families reuse.

Every op in ``dtorch/ops`` works on raw arrays (``_array_api = True``) of
either NumPy or CuPy; ``get_array_module`` is the only device switch.
"""
import numpy as np

from .._backend import from_np, result_type, get_default_dtype, device_of
from .._backend import get_array_module
from .._backend import is_bfloat16_np, on_bfloat16
from ..autograd.function import Function


class Op(Function):
    _array_api = True


class Pointwise(Op):
    """The family of elementwise ops of one input x, saved as PyTorch
    saves it, with their parameters on ctx (abs, nan_to_num, logit, and
    the activations: gelu, silu, leaky_relu, elu, the hard and soft
    ones, threshold): a member's ``forward`` computes the value; its
    ``grad(ctx, xp, g, x, xa)`` the gradient, written once for both orders
    (issue 30): ``xa`` is the saved array (for masks), ``x`` the same
    entering through ctx.input, ``xp = grad_xp(g)``. ``linear``: piecewise
    linear, whose gradient joins x with a zero derivative under
    create_graph, as PyTorch's (parameters before the op get zeros, not
    None). Members keep their class (and grad_fn) names."""
    linear = False

    @classmethod
    def backward(cls, ctx, g):
        xa, = ctx.to_save
        if ctx._gmake is None:          # the fast path: arrays
            return cls.grad(ctx, grad_xp(g), g, xa, xa)
        r = cls.grad(ctx, grad_xp(g), g, ctx.input(0, xa), xa)
        return zero_link(ctx, r, 0, xa.shape, xa.dtype) if cls.linear else r


class Binary(Op):
    """The family of two-operand ops (broadcast, promoted, an operand may
    be a number) whose gradients sum back to each operand's shape: a
    member's forward records the operands' shapes and dtypes (``_meta``),
    its ``grads(ctx, xp, g, n)`` returns the two gradients before that
    sum (None where ``n``, ctx.needs_input_grad, says so, or where the
    operand has none), written once for both orders (issue 30); this
    shell sums them (``unbroadcast``). The (input, target) losses are
    members too (soft margin, multi margin, the binary cross-entropies,
    smooth L1 / Huber): parameters after the two operands (weights) get
    no gradient, as in PyTorch. Add/Sub, Mul and Div keep their own
    shells: the hottest ops, where a call more costs 3-4% of a tiny op."""
    @classmethod
    def backward(cls, ctx, g):
        gx, gy = cls.grads(ctx, grad_xp(g), g, ctx.needs_input_grad)
        return (None if gx is None else unbroadcast(gx, ctx.xs, ctx.xd),
                None if gy is None else unbroadcast(gy, ctx.ys, ctx.yd))


def axis_of(dim, ndim, op="op"):
    """A dim in [-ndim, ndim) as an axis; 0-d tensors take dims 0 and -1."""
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise dim_error(dim, ndim)
    return dim % n


def dim_error(dim, ndim):
    """PyTorch's IndexError for a dim outside [-ndim, ndim) (0-d tensors
    take dims 0 and -1)."""
    n = max(ndim, 1)
    return IndexError(f"Dimension out of range (expected to be in range of "
                      f"[{-n}, {n - 1}], but got {dim})")


def _axes(dim, ndim):
    """dim (None, an int or a sequence of ints) as a tuple of axes."""
    if dim is None:
        return None
    if isinstance(dim, int):
        dim = (dim,)
    return tuple(axis_of(d, ndim) for d in dim)


def broadcast_sums(gshape, shape):
    """How a gradient of ``gshape`` sums down to ``shape`` (the backward of
    broadcasting): (the leading axes to sum away, the axes of ``shape``
    that were 1 and to sum keeping the dim)."""
    extra = max(len(gshape) - len(shape), 0)
    return (tuple(range(extra)),
            tuple(i for i, n in enumerate(shape)
                  if n == 1 and gshape[extra + i] != 1))


def unbroadcast(g, shape, dtype=None):
    """Sum ``g`` down to ``shape``: the backward of NumPy broadcasting (an
    array, or a gradient tensor under create_graph)."""
    if type(g) is not _ndarray and hasattr(g, "_make"):
        return unbroadcast_t(g, shape, dtype)
    if g.shape != shape:
        lead, axes = broadcast_sums(g.shape, shape)
        if lead:
            g = g.sum(axis=lead)
        if axes:
            g = g.sum(axis=axes, keepdims=True)
        if g.shape != shape:
            g = g.reshape(shape)
    if dtype is not None and g.dtype != dtype:
        g = g.astype(dtype)
    return g


_SCALARS = (int, float, bool)
_ndarray = np.ndarray


def _device_error(op, x, y):
    return RuntimeError(
        f"Expected all tensors to be on the same device, but found at least "
        f"two devices, {device_of(x)} and {device_of(y)}! (in {op})")


def promote(x, y, op="binary op", true_div=False):
    """Cast two operands (arrays or Python scalars) to PyTorch's result dtype.

    Python scalars stay scalars: NumPy treats them as weak, as PyTorch does.
    """
    tx, ty = type(x), type(y)
    if tx is ty is _ndarray:
        # the common case first: two NumPy arrays of one dtype (the same
        # dtype object for NumPy's builtin types; == catches the rest below)
        dx = x.dtype
        if dx is y.dtype and not (true_div and dx.kind in "biu"):
            return x, y
    elif (ty is float or ty is int) and tx not in _SCALARS \
            and is_float(x.dtype):
        return x, y      # a float tensor and a number
    if ty in _SCALARS:
        if tx in _SCALARS:
            raise TypeError(f"{op}: expected at least one tensor operand")
        dx = from_np(x.dtype)
        rt = result_type(dx, ty, x.ndim > 0, False)
        if true_div and not rt.is_floating_point:
            rt = get_default_dtype()
        if rt is not dx:
            x = x.astype(rt.np)
        return x, y
    if tx in _SCALARS:
        dy = from_np(y.dtype)
        rt = result_type(tx, dy, False, y.ndim > 0)
        if true_div and not rt.is_floating_point:
            rt = get_default_dtype()
        if rt is not dy:
            y = y.astype(rt.np)
        return x, y
    if tx is not ty:
        raise _device_error(op, x, y)
    if x.dtype == y.dtype and not (true_div and x.dtype.kind in "biu"):
        return x, y
    rt = result_type(from_np(x.dtype), from_np(y.dtype), x.ndim > 0,
                     y.ndim > 0)
    if true_div and not rt.is_floating_point:
        rt = get_default_dtype()
    if x.dtype != rt.np:
        x = x.astype(rt.np)
    if y.dtype != rt.np:
        y = y.astype(rt.np)
    return x, y


def _shape_dtype(v):
    """An operand's (shape, dtype); (None, None) for a Python number."""
    if type(v) in _SCALARS:
        return None, None
    return v.shape, getattr(v, "dtype", None)


def _meta(ctx, x, y):
    # what backward needs to shape gradients: shapes and dtypes of inputs
    # (the common case, two arrays, is promote_meta's inline one)
    ctx.xs, ctx.xd = _shape_dtype(x)
    ctx.ys, ctx.yd = _shape_dtype(y)


def promote_meta(ctx, x, y, op, true_div=False):
    """``_meta(ctx, x, y)`` then ``promote(x, y, op, true_div)``: one call
    for the binary arithmetic ops, with two NumPy arrays of one dtype (the
    common case, worth the ~150 ns on tiny tensors) handled inline."""
    if type(x) is _ndarray and type(y) is _ndarray:
        ctx.xs = x.shape
        ctx.ys = y.shape
        ctx.xd = dx = x.dtype
        ctx.yd = dy = y.dtype
        if dx is dy and not (true_div and dx.kind in "biu"):
            return x, y
    else:
        _meta(ctx, x, y)
    return promote(x, y, op, true_div)


def keep_grad(xp, cond, g):
    """g where ``cond``, else 0: PyTorch's masking in backward. A bare
    ``g * cond`` is wrong where g holds inf or NaN and cond is False
    (inf * 0 = NaN, PyTorch gives 0). On NumPy the product is still
    computed first: np.where over a random mask is 5-10x slower than a
    product (measured 256x1024 float32: 2.2-3.0 ms against 0.19 ms), and
    the product is exact unless it made a NaN, which its max shows; only
    then the where() runs. CuPy's where costs what a product costs."""
    if xp is not np:
        return xp.where(cond, g, xp.zeros((), g.dtype))
    zero = xp.zeros((), g.dtype)
    r = g * cond
    if is_float(r.dtype) and r.size and np.isnan(r.max()):
        r = np.where(cond, g, zero)
    return r


def sgn(xp, x):
    """PyTorch's sign for gradients: -1, 0 or 1, and 0 at NaN (an array
    of x's dtype; a constant: its derivative is 0)."""
    x = getattr(x, "_data", x)
    return (x > 0).astype(x.dtype) - (x < 0).astype(x.dtype)


def astype(a, dtype):
    """``a`` (an array or a gradient tensor) in NumPy dtype ``dtype``, not
    copied when it has it already."""
    if type(a) is _ndarray or not hasattr(a, "_make"):
        return a.astype(dtype, copy=False)
    from_dt = a._data.dtype
    return a if from_dt == dtype else _tensor_namespace(a).astype(a, dtype)


def array_dtype(a):
    """The NumPy dtype of an array or of a gradient tensor's array."""
    return getattr(a, "_data", a).dtype


def _float_input(x):
    # unary maths on integer tensors gives the default float dtype (PyTorch)
    if x.dtype.kind in "biu":
        return x.astype(get_default_dtype().np)
    return x


def is_float(dt):
    """A NumPy/CuPy floating dtype, ml_dtypes' bfloat16 included (its
    ``kind`` is 'V', so ``dt.kind == "f"`` misses it)."""
    return dt.kind == "f" or is_bfloat16_np(dt)


# float16 and (ml_dtypes') bfloat16, once loaded: 2-byte floats without
# NumPy BLAS
_LOW_NP = {np.dtype(np.float16)}
on_bfloat16(_LOW_NP.add)


_C_NAMES = {"float32": "float", "float64": "double", "float16": "c10::Half",
            "bfloat16": "c10::BFloat16", "int64": "long int", "int32": "int",
            "int16": "short int", "int8": "signed char",
            "uint8": "unsigned char", "bool": "bool"}
_SCALAR_NAMES = {"float32": "Float", "float64": "Double", "float16": "Half",
                 "bfloat16": "BFloat16", "int64": "Long", "int32": "Int",
                 "int16": "Short", "int8": "Char", "uint8": "Byte",
                 "bool": "Bool"}


def dtype_name(np_dtype, c_name=False):
    """PyTorch's spelling of a dtype in its kernels' errors: the ScalarType
    ("Float", "BFloat16") or the C type ("float", "c10::BFloat16")."""
    key = str(from_np(np_dtype)).rpartition(".")[2]
    return (_C_NAMES if c_name else _SCALAR_NAMES).get(key, key)


def check_conv_dtypes(x, w, b=None):
    """PyTorch's convolution refuses operands of different dtypes (no
    promotion): an int64 input to a float32 Conv2d raises there."""
    if b is not None and x.dtype != b.dtype:
        raise RuntimeError(
            f"Input type ({dtype_name(x.dtype, True)}) and bias type "
            f"({dtype_name(b.dtype, True)}) should be the same")
    if x.dtype != w.dtype:
        raise RuntimeError(
            f"expected scalar type {dtype_name(x.dtype)} but found "
            f"{dtype_name(w.dtype)}")


def float32_compute(cls):
    """Class decorator for GEMM-like ops (matmul, linear, conv, einsum): on
    NumPy, float16/bfloat16 operands run in float32 and the results round
    once to the operands' dtype, as PyTorch's CPU kernels accumulate in
    float32. NumPy's float16 matmul has no BLAS (measured 120x slower than
    float32 at 256x512x512) and ml_dtypes' bfloat16 matmul returns float32.
    Each gradient returns in its input's dtype. CuPy arrays pass through
    (cuBLAS accumulates float16 in float32 itself)."""
    fwd, bwd = cls.forward, cls.backward
    low = _LOW_NP

    def forward(ctx, *args, **kwargs):
        # the common case (no 2-byte float) in one cheap loop: a set
        # lookup of each array's dtype, no lists
        for a in args:
            if type(a) is _ndarray and a.dtype in low:
                break
        else:
            return fwd(ctx, *args, **kwargs) if kwargs else fwd(ctx, *args)
        dts = [a.dtype if type(a) is np.ndarray else None for a in args]
        if len({d for d in dts if d is not None
                and (d in low or d.kind == "f")}) > 1:
            # mixed float dtypes: the op's own check raises PyTorch's
            # error (float32 weights on a bfloat16 input are refused, not
            # promoted); never widen them silently here
            return fwd(ctx, *args, **kwargs)
        out_dt = next(d for d in dts if d in low)
        ctx._lowp = dts
        args = [a.astype(np.float32) if d in low else a
                for a, d in zip(args, dts)]
        out = fwd(ctx, *args, **kwargs)
        with np.errstate(over="ignore"):    # float16 overflows to inf
            return out.astype(out_dt)

    def backward(ctx, *grads):
        dts = ctx.__dict__.get("_lowp")
        if dts is None:
            return bwd(ctx, *grads)
        # the saved operands are float32: so are the gradients in the
        # body (under create_graph by Cast ops, so differentiable too)
        grads = [astype(g, np.float32) if g is not None
                 and array_dtype(g) in low else g for g in grads]
        res = bwd(ctx, *grads)
        if res is NotImplemented:    # create_graph: first order only
            return res
        single = type(res) is not tuple
        res = (res,) if single else res
        with np.errstate(over="ignore"):
            res = tuple(r if r is None or d is None else astype(r, d)
                        for r, d in zip(res, dts))
        return res[0] if single else res

    cls.forward = staticmethod(forward)
    cls.backward = staticmethod(backward)
    return cls


# ---------------------------------------------------------------------------
# Differentiable backward (create_graph=True). One backward body serves
# both orders (issue 30): ``grad_xp``, ``unbroadcast``, ``keep_grad``,
# ``astype`` and ``zero_link`` take an array or a gradient tensor, and
# ``ctx.const`` brings a constant array in. ``unbroadcast_t`` and
# ``zero_link_t`` are their tensor halves.

# dtorch/ops/_tnp.py's Namespace, set when it is imported (ops/__init__):
# the tensor namespace sits above the op families it is written with
_tensor_namespace = None


def grad_xp(g):
    """The namespace a backward body computes with (issue 30: one
    derivative per op): the array module of gradient ``g`` (NumPy or
    CuPy) on the fast path; under create_graph=True, where ``g`` is a
    tensor, the tensor namespace (``ops/_tnp.py``) with the same names,
    which records the graph."""
    if type(g) is _ndarray:
        return np
    if hasattr(g, "_make"):
        return _tensor_namespace(g)
    return get_array_module(g)


def zero_link(ctx, g, i, shape, dtype):
    """``g``, the gradient a backward returns for some input, joined to
    input i by a zero derivative under create_graph (``zero_link_t``);
    ``g`` itself on the fast path."""
    if type(g) is _ndarray or not hasattr(g, "_make"):
        return g
    return zero_link_t(g, ctx, i, shape, dtype)


def unbroadcast_t(g, shape, dtype=None):
    """``unbroadcast`` of a gradient tensor, by differentiable sums."""
    if g.shape != shape:
        lead, axes = broadcast_sums(tuple(g.shape), shape)
        if lead:
            g = g.sum(dim=lead)
        if axes:
            g = g.sum(dim=axes, keepdim=True)
        if tuple(g.shape) != tuple(shape):
            g = g.reshape(shape)
    if dtype is not None and g._data.dtype != dtype:
        g = _tensor_namespace(g).astype(g, dtype)
    return g


class ZeroLink(Op):
    """``g`` itself, joined to a tensor ``x`` by a zero gradient. The
    create_graph=True gradient of a piecewise-linear op (relu, leaky_relu,
    max_pool, nll ...) does not depend on the op's input, but PyTorch's
    double backward connects it there all the same (``zeros_like``):
    parameters before the op (a bias under a leaky_relu) get a zero
    ``.grad``, not None, and optimizers step them (Adam's moments decay)
    as in PyTorch."""
    @staticmethod
    def forward(ctx, g, x):
        ctx.xs, ctx.xd = x.shape, x.dtype
        return g

    @staticmethod
    def backward(ctx, h):
        zero = grad_xp(h).zeros(ctx.xs, ctx.xd) \
            if ctx.needs_input_grad[1] else None
        return h, zero


def zero_link_t(g, ctx, i, shape, dtype):
    """``g`` (what a backward_graph returns for input j) joined to input i
    of ``ctx`` by a zero gradient (``ZeroLink``): PyTorch's double backward
    of piecewise-linear ops. Input i's value is not needed."""
    if ctx.next_edges[i] is None:
        return g
    xp = get_array_module(g._data)
    x = ctx.graph_input(i, xp.broadcast_to(xp.zeros((), dtype), shape))
    return ZeroLink.apply(g, x)

"""ONNX translations of dtorch's ops: ``CONVERTERS[OpClass](ctx, *args,
**kwargs)`` adds nodes through ``ctx.b`` and returns the output's name.

Arguments arrive as ``Value`` (dynamic), ``Const`` (a constant tensor) or
plain Python values, in the op's own ``forward`` signature. Classes are
looked up exactly (no MRO): a subclass such as ``Minimum(Maximum)`` means
something else.
"""
import math

import numpy as np

from .. import ops as N
from ._values import Const, _onnx_type

CONVERTERS = {}
INT64_MAX = np.iinfo(np.int64).max
INT64_MIN = np.iinfo(np.int64).min


def conv(*classes):
    def deco(fn):
        for c in classes:
            CONVERTERS[c] = fn
        return fn
    return deco


def _unary(op_type):
    def fn(ctx, x, **kw):
        return ctx.b.node(op_type, [ctx.name(x)])
    return fn


for _cls, _op in ((N.Neg, "Neg"), (N.Exp, "Exp"), (N.Log, "Log"),
                  (N.Sqrt, "Sqrt"), (N.StdSqrt, "Sqrt"), (N.Abs, "Abs"),
                  (N.Reciprocal, "Reciprocal"), (N.Sin, "Sin"),
                  (N.Cos, "Cos"), (N.Tanh, "Tanh"), (N.Sigmoid, "Sigmoid"),
                  (N.Relu, "Relu"), (N.Erf, "Erf"), (N.Copy, "Identity"),
                  (N.Atan, "Atan"), (N.Asin, "Asin"), (N.Acos, "Acos"),
                  (N.Sinh, "Sinh"), (N.Cosh, "Cosh")):
    CONVERTERS[_cls] = _unary(_op)


@conv(N.Rsqrt)
def _rsqrt(ctx, x):
    return ctx.b.node("Reciprocal", [ctx.b.node("Sqrt", [ctx.name(x)])])


def _binary(op_type):
    def fn(ctx, x, y):
        dt = ctx.out_dtype
        return ctx.b.node(op_type, [ctx.name(x, dt), ctx.name(y, dt)])
    return fn


for _cls, _op in ((N.Add, "Add"), (N.Sub, "Sub"), (N.Mul, "Mul"),
                  (N.Div, "Div"), (N.Maximum, "Max"), (N.Minimum, "Min")):
    CONVERTERS[_cls] = _binary(_op)


@conv(N.Pow)
def _pow(ctx, x, y):
    return ctx.b.node("Pow", [ctx.name(x, ctx.out_dtype),
                              ctx.name(y, ctx.out_dtype)])


@conv(N.Where)
def _where(ctx, cond, x, y):
    dt = ctx.out_dtype
    return ctx.b.node("Where", [ctx.name(cond, np.bool_), ctx.name(x, dt),
                                ctx.name(y, dt)])


@conv(N.Clamp, N.Hardtanh)
def _clamp(ctx, x, min=None, max=None):
    dt = ctx.out_dtype
    return ctx.b.node("Clip", [ctx.name(x, dt),
                               "" if min is None else ctx.name(min, dt),
                               "" if max is None else ctx.name(max, dt)])


@conv(N.ClampT)
def _clamp_t(ctx, x, lo=None, hi=None):
    dt = ctx.out_dtype
    y = ctx.name(x, dt)
    if lo is not None:
        y = ctx.b.node("Max", [y, ctx.name(lo, dt)])
    if hi is not None:
        y = ctx.b.node("Min", [y, ctx.name(hi, dt)])
    return y


@conv(N.Cast)
def _cast(ctx, x, np_dtype=None):
    return ctx.b.node("Cast", [ctx.name(x)],
                      to=_onnx_type(ctx.b.onnx, ctx.out_dtype))


# ============================================================ shapes ==

@conv(N.Reshape)
def _reshape(ctx, x, shape=()):
    # leading dims kept from the input are written as 0 ("copy this dim")
    # and the first other one as -1 (inferred): a dynamic batch, kept or
    # merged into/split from the next dims ((L, N, E) -> (L, N * h, d),
    # (N * h, L, d) -> (N, h, L, d), flatten), then reshapes right
    out = list(ctx.out_shape)
    for a, d in enumerate(out):
        # a new axis of size 1 (unsqueeze; stack composes it): Unsqueeze
        # keeps every dim dynamic
        if d == 1 and out[:a] + out[a + 1:] == list(x.shape):
            return ctx.b.node("Unsqueeze", [ctx.name(x), ctx.b.ints([a])])
    target = []
    same = True
    for i, d in enumerate(out):
        if same and i < len(x.shape) and x.shape[i] == d:
            target.append(0)
        else:
            target.append(-1 if same else d)
            same = False
    if any(d == 0 for d in out):
        target = out          # a real 0-size dim: no copy markers
    return ctx.b.node("Reshape", [ctx.name(x), ctx.b.ints(target)])


@conv(N.Permute)
def _permute(ctx, x, dims=()):
    return ctx.b.node("Transpose", [ctx.name(x)],
                      perm=[int(d) % max(len(x.shape), 1) for d in dims])


@conv(N.Expand)
def _expand(ctx, x, shape=()):
    # ONNX Expand broadcasts both ways: 1 keeps an input dim (dynamic batch)
    shape = list(ctx.out_shape)
    off = len(shape) - len(x.shape)
    tgt = [1 if i >= off and x.shape[i - off] == d else d
           for i, d in enumerate(shape)]
    return ctx.b.node("Expand", [ctx.name(x), ctx.b.ints(tgt)])


@conv(N.Cat)
def _cat(ctx, *xs, dim=0):
    dt = ctx.out_dtype
    return ctx.b.node("Concat", [ctx.name(x, dt) for x in xs
                                 if 0 not in x.shape or len(x.shape) > 1],
                      axis=int(dim))


@conv(N.Pad)
def _pad(ctx, x, pads=(), mode="constant", value=0.0):
    modes = {"constant": "constant", "reflect": "reflect",
             "replicate": "edge", "circular": "wrap"}
    if mode not in modes:
        ctx.unsupported(f"mode={mode!r}")
    p = [int(a) for a, _ in pads] + [int(b) for _, b in pads]
    ins = [ctx.name(x), ctx.b.ints(p)]
    if mode == "constant":
        ins.append(ctx.name(value))
    return ctx.b.node("Pad", ins, mode=modes[mode])


@conv(N.Index, N.IndexView)
def _index(ctx, x, key=None):
    b = ctx.b
    key = key if isinstance(key, tuple) else (key,)
    arrays = [i for i, k in enumerate(key)
              if isinstance(k, (np.ndarray, list)) or hasattr(
                  k, "__cuda_array_interface__")]
    nd = len(x.shape)
    used = sum(1 for k in key if k is not None and k is not Ellipsis)
    if sum(1 for k in key if k is Ellipsis) > 1:
        ctx.unsupported("more than one Ellipsis")
    full = []
    for k in key:
        if k is Ellipsis:
            full.extend([slice(None)] * (nd - used))
        else:
            full.append(k)
    if not any(k is Ellipsis for k in key):
        full.extend([slice(None)] * (nd - used))
    if arrays:
        # one integer index array (x[idx], x[:, idx]): Gather on its axis
        if len(arrays) > 1 or any(not (isinstance(k, slice) and k == slice(
                None)) for k in full if not isinstance(k, (np.ndarray, list))
                and not hasattr(k, "__cuda_array_interface__")):
            ctx.unsupported("advanced indexing beyond one index array")
        axis = next(i for i, k in enumerate(full)
                    if not isinstance(k, slice))
        idx = np.asarray(full[axis] if isinstance(full[axis], list)
                         else _np(full[axis]))
        if idx.dtype == np.bool_:
            ctx.unsupported("a boolean mask")
        return b.node("Gather", [ctx.name(x), b.ints(idx)], axis=axis)
    y = ctx.name(x)
    starts, ends, axes, steps, squeeze, unsq = [], [], [], [], [], []
    ax = oax = 0
    for k in full:
        if k is None:
            unsq.append(oax)
            oax += 1
            continue
        if isinstance(k, slice):
            if k != slice(None):
                st = 1 if k.step is None else int(k.step)
                if st <= 0:
                    ctx.unsupported("a non-positive slice step")
                starts.append(0 if k.start is None else int(k.start))
                ends.append(INT64_MAX if k.stop is None else int(k.stop))
                axes.append(ax)
                steps.append(st)
            ax += 1
            oax += 1
            continue
        i = int(k)
        starts.append(i)
        ends.append(INT64_MAX if i == -1 else i + 1)
        axes.append(ax)
        steps.append(1)
        squeeze.append(ax)
        ax += 1
    if axes:
        y = b.node("Slice", [y, b.ints(starts), b.ints(ends), b.ints(axes),
                             b.ints(steps)])
    if squeeze:
        y = b.node("Squeeze", [y, b.ints(squeeze)])
    if unsq:
        y = b.node("Unsqueeze", [y, b.ints(unsq)])
    if y == ctx.name(x):
        y = b.node("Identity", [y])
    return y


def _np(a):
    return a.get() if hasattr(a, "get") else a


@conv(N.Embedding)
def _embedding(ctx, w, idx, padding_idx=None, scale_grad_by_freq=False):
    return ctx.b.node("Gather", [ctx.name(w), ctx.name(idx, np.int64)],
                      axis=0)


@conv(N.IndexSelect)
def _index_select(ctx, x, idx=None, dim=0):
    return ctx.b.node("Gather", [ctx.name(x), ctx.b.ints(_np(idx))],
                      axis=int(dim))


@conv(N.Gather)
def _gather(ctx, x, idx=None, dim=0):
    return ctx.b.node("GatherElements", [ctx.name(x), ctx.b.ints(_np(idx))],
                      axis=int(dim))


@conv(N.Tril)
def _tril(ctx, x, diagonal=0, upper=False):
    return ctx.b.node("Trilu", [ctx.name(x), ctx.b.ints(int(diagonal))],
                      upper=int(bool(upper)))


# ========================================================= reductions ==

def _axes_list(dim):
    if dim is None:
        return None
    return [int(dim)] if isinstance(dim, int) else [int(d) for d in dim]


@conv(N.Sum)
def _sum(ctx, x, dim=None, keepdim=False, dtype=None):
    axes = _axes_list(dim)
    ins = [ctx.name(x, ctx.out_dtype)]
    if axes is not None:
        ins.append(ctx.b.ints(axes))
    return ctx.b.node("ReduceSum", ins, keepdims=int(bool(keepdim)))


def _reduce(ctx, op, x, axes, keepdim, axes_input_from=18):
    """A Reduce* node; its axes moved from attribute to input in opset 18
    (ReduceSum in 13)."""
    ins = [ctx.name(x)]
    kw = {"keepdims": int(bool(keepdim))}
    if axes is not None:
        if ctx.b.opset >= axes_input_from:
            ins.append(ctx.b.ints(axes))
        else:
            kw["axes"] = axes
    return ctx.b.node(op, ins, **kw)


@conv(N.MaxDim)
def _max_dim(ctx, x, dim=0, keepdim=False, is_min=False):
    if not x.shape:
        return ctx.b.node("Identity", [ctx.name(x)])
    return _reduce(ctx, "ReduceMin" if is_min else "ReduceMax", x,
                   [int(dim)], keepdim)


@conv(N.Norm)
def _norm(ctx, x, p=2.0, dim=None, keepdim=False):
    ops = {1: "ReduceL1", 2: "ReduceL2"}
    if p not in ops:
        ctx.unsupported(f"p={p}")
    y = _reduce(ctx, ops[p], x, _axes_list(dim), keepdim)
    return ctx.b.node("Cast", [y], to=_np_to_onnx(ctx, ctx.out_dtype)) \
        if np.dtype(x.dtype) != ctx.out_dtype else y


def _np_to_onnx(ctx, dt):
    return _onnx_type(ctx.b.onnx, dt)


@conv(N.Amax)
def _amax(ctx, x, dim=None, keepdim=False, is_min=False, evenly=False):
    return _reduce(ctx, "ReduceMin" if is_min else "ReduceMax", x,
                   _axes_list(dim), keepdim)


# ======================================================== linear algebra ==

@conv(N.MatMul)
def _matmul(ctx, x, y):
    dt = ctx.out_dtype
    return ctx.b.node("MatMul", [ctx.name(x, dt), ctx.name(y, dt)])


@conv(N.Linear)
def _linear(ctx, x, w, b=None):
    B = ctx.b
    if len(x.shape) == 2:
        ins = [ctx.name(x), ctx.name(w)] + ([] if b is None
                                            else [ctx.name(b)])
        return B.node("Gemm", ins, transB=1)
    if isinstance(w, Const):
        wt = B.const(np.ascontiguousarray(w.numpy().T))
    else:
        wt = B.node("Transpose", [ctx.name(w)], perm=[1, 0])
    y = B.node("MatMul", [ctx.name(x), wt])
    if b is not None:
        y = B.node("Add", [y, ctx.name(b)])
    return y


@conv(N.Conv2d)
def _conv2d(ctx, x, w, b=None, stride=(1, 1), pads=((0, 0), (0, 0)),
            dilation=(1, 1), groups=1):
    ins = [ctx.name(x), ctx.name(w)] + ([] if b is None else [ctx.name(b)])
    return ctx.b.node(
        "Conv", ins, strides=list(stride), dilations=list(dilation),
        group=int(groups), kernel_shape=list(w.shape[2:]),
        pads=[pads[0][0], pads[1][0], pads[0][1], pads[1][1]])


@conv(N.ConvTranspose2d)
def _conv_t(ctx, x, w, b=None, stride=(1, 1), pads=((0, 0), (0, 0)),
            *rest, **kw):
    ctx.unsupported("ConvTranspose2d")


def _ceil_mode(x, k, stride, pads, dilation, out_hw):
    for i in range(2):
        n = x.shape[2 + i] + pads[i][0] + pads[i][1]
        eff = dilation[i] * (k[i] - 1) + 1
        if (n - eff) // stride[i] + 1 != out_hw[i]:
            return 1
    return 0


@conv(N.MaxPool2d)
def _max_pool(ctx, x, k=(2, 2), stride=(2, 2), pads=((0, 0), (0, 0)),
              dilation=(1, 1), out_hw=None):
    return ctx.b.node(
        "MaxPool", [ctx.name(x)], kernel_shape=list(k), strides=list(stride),
        pads=[pads[0][0], pads[1][0], pads[0][1], pads[1][1]],
        dilations=list(dilation),
        ceil_mode=_ceil_mode(x, k, stride, pads, dilation, out_hw))


@conv(N.AvgPool2d)
def _avg_pool(ctx, x, k=(2, 2), stride=(2, 2), pads=((0, 0), (0, 0)),
              out_hw=None, divisor=None):
    kk = k[0] * k[1]
    if isinstance(divisor, (int, float)):
        include = 1
    else:
        include = 0          # a per-window count of the real cells
    y = ctx.b.node(
        "AveragePool", [ctx.name(x)], kernel_shape=list(k),
        strides=list(stride),
        pads=[pads[0][0], pads[1][0], pads[0][1], pads[1][1]],
        count_include_pad=include,
        ceil_mode=_ceil_mode(x, k, stride, pads, (1, 1), out_hw))
    if include and divisor != kk:        # divisor_override
        y = ctx.b.node("Mul", [y, ctx.name(kk / divisor)])
    return y


@conv(N.ScaledDotProductAttention)
def _sdpa(ctx, q, k, v, mask=None, keep=None, scale=1.0, causal=False,
          p=0.0, groups=1):
    """MatMul, the masks, a safe Softmax (a row masked throughout gives 0)
    and MatMul; key/value heads repeated for grouped-query attention."""
    B, c = ctx.b, ctx.name
    if keep is not None:
        ctx.unsupported(f"dropout_p={p}")
    r, dt = len(k.shape), ctx.out_dtype
    kn, vn = c(k), c(v)
    if groups > 1:
        def rep(x):      # (..., Hkv, S, D) -> (..., Hkv * G, S, D)
            y = B.node("Unsqueeze", [c(x), B.ints([r - 2])])
            y = B.node("Expand", [y, B.ints([1] * (r - 2) +
                                            [groups, 1, 1])])
            return B.node("Reshape", [y, B.ints(
                [0] * (r - 3) + [-1] + list(x.shape[-2:]))])
        kn, vn = rep(k), rep(v)
    kt = B.node("Transpose", [kn], perm=list(range(r - 2)) + [r - 1, r - 2])
    s = B.node("MatMul", [B.node("Mul", [c(q), c(float(scale))]), kt])
    if causal:
        L, S = q.shape[-2], k.shape[-2]
        s = B.node("Add", [s, B.const(np.triu(np.full((L, S), -np.inf),
                                              1).astype(dt))])
    if mask is not None:
        if np.dtype(mask.dtype) == np.bool_:
            s = B.node("Where", [c(mask), s, c(-np.inf)])
        else:
            s = B.node("Add", [s, c(mask, dt)])
    y = B.node("Softmax", [s], axis=-1)
    top = B.node("ReduceMax", [s] + ([B.ints([-1])] if B.opset >= 18
                                      else []), keepdims=1,
                 **({} if B.opset >= 18 else {"axes": [-1]}))
    y = B.node("Where", [B.node("IsInf", [top], detect_positive=0),
                         c(0.0), y])
    return B.node("MatMul", [y, vn])


# ========================================================= activations ==

@conv(N.Softmax)
def _softmax(ctx, x, dim=-1, safe=False):
    B = ctx.b
    xn = ctx.name(x)
    y = B.node("Softmax", [xn], axis=int(dim))
    if not safe:
        return y
    # PyTorch's _safe_softmax (attention): a row masked throughout gives 0,
    # where ONNX's Softmax gives NaN
    top = _reduce(ctx, "ReduceMax", x, [int(dim)], True)
    dead = B.node("IsInf", [top], detect_positive=0)
    return B.node("Where", [dead, ctx.name(0.0), y])


@conv(N.LogSoftmax)
def _log_softmax(ctx, x, dim=-1):
    return ctx.b.node("LogSoftmax", [ctx.name(x)], axis=int(dim))


@conv(N.Gelu)
def _gelu(ctx, x, approximate="none"):
    B, c = ctx.b, ctx.name
    xn = c(x)
    if B.opset >= 20:
        return B.node("Gelu", [xn], approximate=approximate)
    if approximate == "tanh":
        x3 = B.node("Mul", [B.node("Mul", [xn, xn]), xn])
        inner = B.node("Add", [xn, B.node("Mul", [x3, c(0.044715)])])
        t = B.node("Tanh", [B.node("Mul", [inner,
                                           c(math.sqrt(2 / math.pi))])])
    else:
        t = B.node("Erf", [B.node("Mul", [xn, c(1 / math.sqrt(2))])])
    return B.node("Mul", [B.node("Mul", [xn, c(0.5)]),
                          B.node("Add", [t, c(1.0)])])


@conv(N.Silu)
def _silu(ctx, x):
    xn = ctx.name(x)
    return ctx.b.node("Mul", [xn, ctx.b.node("Sigmoid", [xn])])


@conv(N.LeakyRelu)
def _leaky(ctx, x, slope=0.01):
    return ctx.b.node("LeakyRelu", [ctx.name(x)], alpha=float(slope))


@conv(N.Hardswish)
def _hardswish(ctx, x):
    return ctx.b.node("HardSwish", [ctx.name(x)])


@conv(N.Hardsigmoid)
def _hardsigmoid(ctx, x):
    return ctx.b.node("HardSigmoid", [ctx.name(x)], alpha=1 / 6, beta=0.5)


@conv(N.Softplus)
def _softplus(ctx, x, beta=1.0, threshold=20.0):
    if beta != 1.0:
        ctx.unsupported(f"beta={beta}")
    xn = ctx.name(x)
    # softplus reverts to x above the threshold (PyTorch's)
    return ctx.b.node("Where", [
        ctx.b.node("Greater", [xn, ctx.name(threshold)]), xn,
        ctx.b.node("Softplus", [xn])])


@conv(N.Dropout)
def _dropout(ctx, x, keep=None, p=0.5):
    ctx.unsupported("training-mode dropout (the model runs in eval mode "
                    "for export; functional dropout needs training=False)")


# ====================================================== normalisation ==

@conv(N.LayerNorm)
def _layer_norm(ctx, x, w=None, b=None, nd=1, eps=1e-5):
    shape = x.shape[len(x.shape) - nd:]
    dt = ctx.out_dtype
    ins = [ctx.name(x),
           ctx.name(w) if w is not None else ctx.b.const(np.ones(shape, dt))]
    if b is not None:
        ins.append(ctx.name(b))
    return ctx.b.node("LayerNormalization", ins, axis=-int(nd),
                      epsilon=float(eps))


@conv(N.ChannelAffine)
def _channel_affine(ctx, x, scale=None, shift=None):
    # x * scale + shift along axis 1 (eval-mode batch norm, group norm's
    # weight and bias): (C,) operands reshaped to (1, C, 1, ...)
    dt = ctx.out_dtype
    target = [1, -1] + [1] * (len(x.shape) - 2)
    y = ctx.name(x)
    for op_type, v in (("Mul", scale), ("Add", shift)):
        if v is not None:
            y = ctx.b.node(op_type, [y, ctx.b.node(
                "Reshape", [ctx.name(v, dt), ctx.b.ints(target)])])
    return y


@conv(N.BatchNorm)
def _batch_norm(ctx, x, w=None, b=None, eps=1e-5, running_mean=None,
                running_var=None, momentum=0.1):
    ctx.unsupported("batch statistics (training mode or "
                    "track_running_stats=False)")


# ============================================================ recurrent ==

def _gates(a, order, n):
    """Rows of a (n * H, ...) array re-ordered by gate."""
    parts = np.split(np.asarray(a), n, axis=0)
    return np.concatenate([parts[i] for i in order], axis=0)


def _rnn(ctx, kind, xw, h0, c0, w_hh, b_hh, reverse, order, extra):
    B = ctx.b
    if not isinstance(w_hh, Const) or (b_hh is not None and
                                       not isinstance(b_hh, Const)):
        ctx.unsupported("recurrent weights computed from the inputs")
    n = len(order)
    H = w_hh.shape[1]
    dt = ctx.out_dtype
    # the ONNX node takes the layer's input and input weights when xw is a
    # constant-weight projection of it (nn.LSTM's F.linear(x, w_ih, b_ih));
    # otherwise xw itself with identity input weights
    prod = ctx.tracer.producer.get(getattr(xw, "name", None))
    if prod is not None and prod[0] is N.Linear and \
            isinstance(prod[1][1], Const) and len(prod[1]) > 1 and \
            (len(prod[1]) < 3 or prod[1][2] is None or
             isinstance(prod[1][2], Const)):
        X = prod[1][0]
        W = prod[1][1].numpy()
        bi = prod[1][2].numpy() if len(prod[1]) > 2 and \
            prod[1][2] is not None else np.zeros(n * H, dt)
    else:
        X = xw
        W = np.eye(n * H, dtype=dt)
        bi = np.zeros(n * H, dt)
    bh = b_hh.numpy() if b_hh is not None else np.zeros(n * H, dt)
    Wn = B.const(_gates(W, order, n)[None].astype(dt))
    Rn = B.const(_gates(w_hh.numpy(), order, n)[None].astype(dt))
    Bn = B.const(np.concatenate([_gates(bi, order, n),
                                 _gates(bh, order, n)])[None].astype(dt))

    def init(s):
        if s is None or (isinstance(s, Const) and not s.numpy().any()):
            return ""              # zeros: ONNX's default (no baked batch)
        return B.node("Unsqueeze", [ctx.name(s, dt), B.ints([0])])
    ins = [ctx.name(X, dt), Wn, Rn, Bn, "", init(h0)]
    if kind == "LSTM":
        ins.append(init(c0))
    while ins and ins[-1] == "":
        ins.pop()
    y, yh, *yc = B.node(kind, ins, n_out=3 if kind == "LSTM" else 2,
                        hidden_size=int(H),
                        direction="reverse" if reverse else "forward",
                        **extra)
    ys = B.node("Squeeze", [y, B.ints([1])])
    last = yc[0] if kind == "LSTM" else yh
    return B.node("Concat", [ys, last], axis=0)


@conv(N.LSTMLayer)
def _lstm(ctx, xw, h0, c0, w_hh, b_hh=None, reverse=False):
    # PyTorch's gates (i, f, g, o) -> ONNX's (i, o, f, c)
    return _rnn(ctx, "LSTM", xw, h0, c0, w_hh, b_hh, reverse, (0, 3, 1, 2),
                {})


@conv(N.GRULayer)
def _gru(ctx, xw, h0, w_hh, b_hh=None, reverse=False):
    # PyTorch's (r, z, n) -> ONNX's (z, r, h); r multiplies (h W_hn + b_hn)
    return _rnn(ctx, "GRU", xw, h0, None, w_hh, b_hh, reverse, (1, 0, 2),
                {"linear_before_reset": 1})


@conv(N.RNNLayer)
def _rnn_layer(ctx, xw, h0, w_hh, b_hh=None, reverse=False,
               nonlinearity="tanh"):
    act = {"tanh": "Tanh", "relu": "Relu"}[nonlinearity]
    return _rnn(ctx, "RNN", xw, h0, None, w_hh, b_hh, reverse, (0,),
                {"activations": [act]})

"""Forward values and gradients at boundary points, against PyTorch.

The table ``CASES`` is the spec: every activation, loss and reduction that
dtorch has, run at its kinks, saturation and threshold points, at 0, +-1,
+-inf and NaN, with ties and with empty tensors, in float32 and float64.
Each case is one function ``fn(M, *inputs)`` written against the common API,
run once with ``M = dtorch`` and once with ``M = torch``; forward values,
dtypes and the gradient of every input are compared with NaN equal to NaN
and infinities equal only to themselves.

Upstream gradients matter as much as inputs: a backward that multiplies by
a 0/1 mask turns an infinite upstream gradient into NaN where PyTorch's
masking gives 0. Unary cases therefore pair every point with every
upstream value of ``UP`` (``unary``); other cases cycle ``UP`` over the
output (``up="cycle"``) or use ones.

Not matched, on purpose: PyTorch's float32 GELU (both approximations) is
NaN at +inf when its vectorised kernel runs (tensors of 3 or more
elements) and inf otherwise; dtorch gives inf, the limit, for every size.
At a NaN input the gradient of PyTorch's elu / celu / selu, hardtanh /
relu6, hardswish, hardshrink and softshrink also depends on the tensor's
size (its vectorised and scalar loops disagree); dtorch follows the
vectorised loop, which every tensor of 8 or more elements takes.
F.adaptive_max_pool2d gives a window holding several NaN its first NaN's
index (PyTorch: the last); its windows are gathered, padded with repeats.
"""
import math

import numpy as np
import pytest

import dtorch

torch = pytest.importorskip("torch")

INF, NAN = math.inf, math.nan
# points where activations have kinks, saturate, overflow exp() in float32
# (88.8) or underflow
EDGE = [0.0, -0.0, 1.0, -1.0, INF, -INF, NAN, 1e-30, -1e-30, 0.5, -0.5,
        3.0, -3.0, 20.0, -20.0, 88.8, -88.8, 100.0, -100.0, 1e10, -1e10]
UP = [1.0, -2.5, 0.0, INF, NAN]


class In:
    """One input: values, whether it requires grad, its dtype (None: the
    case's float dtype)."""
    def __init__(self, values, grad=True, dtype=None):
        self.values, self.grad, self.dtype = values, grad, dtype


class Case:
    def __init__(self, id, fn, inputs, up="ones", raises=False,
                 dtypes=("float32", "float64"), rtol=None):
        self.id, self.fn, self.inputs, self.up = id, fn, inputs, up
        self.raises, self.dtypes, self.rtol = raises, dtypes, rtol


def F(M):
    return M.nn.functional


def unary(id, fn, extra=(), points=None, dtypes=("float32", "float64")):
    """An elementwise case: every point meets every upstream value."""
    pts = list(EDGE if points is None else points) + list(extra)
    x = [p for p in pts for _ in UP]
    up = [u for _ in pts for u in UP]
    return Case(id, fn, [In(x)], up=up, dtypes=dtypes)


def grid(*axes):
    """Cartesian product of value lists, one flat list per axis."""
    mesh = np.meshgrid(*[np.array(a, dtype=np.float64) for a in axes],
                       indexing="ij")
    return [m.reshape(-1).tolist() for m in mesh]


CASES = []
add = CASES.append

# ------------------------------------------------------------ activations --
add(unary("relu", lambda M, x: F(M).relu(x)))
add(unary("relu_method", lambda M, x: x.relu()))
add(unary("relu_inplace", lambda M, x: F(M).relu(x * 1, inplace=True)))
add(unary("relu6", lambda M, x: F(M).relu6(x), extra=[6.0, -6.0, 5.999]))
add(unary("hardtanh", lambda M, x: F(M).hardtanh(x)))
add(unary("hardtanh_-2_3", lambda M, x: F(M).hardtanh(x, -2.0, 3.0),
          extra=[-2.0, 2.0, -3.0]))
add(unary("hardtanh_inplace",
          lambda M, x: F(M).hardtanh(x * 1, inplace=True)))
add(unary("leaky_relu", lambda M, x: F(M).leaky_relu(x)))
add(unary("leaky_relu_0.2", lambda M, x: F(M).leaky_relu(x, 0.2)))
add(unary("leaky_relu_neg", lambda M, x: F(M).leaky_relu(x, -0.5)))
add(unary("leaky_relu_inplace",
          lambda M, x: F(M).leaky_relu(x * 1, 0.2, inplace=True)))
add(unary("elu", lambda M, x: F(M).elu(x)))
add(unary("elu_0.5", lambda M, x: F(M).elu(x, 0.5)))
# PyTorch's vectorised float32 GELU gives NaN at +inf (a 1-element tensor
# gives inf); dtorch gives the limit, inf: not matched (see the docstring)
add(unary("gelu", lambda M, x: F(M).gelu(x), dtypes=("float64",)))
add(unary("gelu_tanh", lambda M, x: F(M).gelu(x, approximate="tanh"),
          dtypes=("float64",)))
add(unary("gelu_f32", lambda M, x: F(M).gelu(x), dtypes=("float32",),
          points=[p for p in EDGE if p != INF]))
add(unary("gelu_tanh_f32", lambda M, x: F(M).gelu(x, approximate="tanh"),
          dtypes=("float32",), points=[p for p in EDGE if p != INF]))
add(unary("silu", lambda M, x: F(M).silu(x)))
add(unary("mish", lambda M, x: F(M).mish(x)))
add(unary("softplus", lambda M, x: F(M).softplus(x),
          extra=[19.999, 20.001]))
add(unary("softplus_beta2_thr1", lambda M, x: F(M).softplus(x, 2.0, 1.0),
          extra=[0.4999, 0.5001]))
add(unary("softplus_beta0.5", lambda M, x: F(M).softplus(x, 0.5),
          extra=[40.0, 39.99]))
add(unary("sigmoid", lambda M, x: F(M).sigmoid(x)))
add(unary("tanh", lambda M, x: F(M).tanh(x)))
add(unary("logsigmoid", lambda M, x: F(M).logsigmoid(x)))

# modules call the functional versions; one each to pin that down
add(unary("nn.ReLU6", lambda M, x: M.nn.ReLU6()(x), extra=[6.0]))
add(unary("nn.Hardtanh", lambda M, x: M.nn.Hardtanh(-0.5, 0.5)(x)))
add(unary("nn.Softplus", lambda M, x: M.nn.Softplus(2.0, 1.0)(x),
          extra=[0.5]))
add(unary("nn.LogSigmoid", lambda M, x: M.nn.LogSigmoid()(x)))
add(unary("nn.ELU", lambda M, x: M.nn.ELU(2.0)(x)))
add(unary("nn.LeakyReLU", lambda M, x: M.nn.LeakyReLU(0.1)(x)))
add(unary("nn.Mish", lambda M, x: M.nn.Mish()(x)))
add(unary("nn.SiLU", lambda M, x: M.nn.SiLU()(x)))

# more activations (dtorch/nn/_functional/activation.py)
add(unary("hardswish", lambda M, x: F(M).hardswish(x), extra=[3.0, -3.0]))
add(unary("hardsigmoid", lambda M, x: F(M).hardsigmoid(x)))
add(unary("selu", lambda M, x: F(M).selu(x)))
add(unary("celu", lambda M, x: F(M).celu(x)))
add(unary("celu_0.5", lambda M, x: F(M).celu(x, 0.5)))
add(unary("softsign", lambda M, x: F(M).softsign(x)))
add(unary("tanhshrink", lambda M, x: F(M).tanhshrink(x)))
add(unary("hardshrink", lambda M, x: F(M).hardshrink(x)))
add(unary("hardshrink_1", lambda M, x: F(M).hardshrink(x, 1.0)))
add(unary("softshrink", lambda M, x: F(M).softshrink(x)))
add(unary("softshrink_1", lambda M, x: F(M).softshrink(x, 1.0)))
add(unary("threshold", lambda M, x: F(M).threshold(x, 1.0, -3.0)))
add(unary("threshold_0", lambda M, x: F(M).threshold(x, 0.0, 0.0)))
add(unary("rrelu_eval", lambda M, x: F(M).rrelu(x)))
add(unary("nn.Hardswish", lambda M, x: M.nn.Hardswish()(x)))
add(unary("nn.SELU", lambda M, x: M.nn.SELU()(x)))
add(unary("nn.Softshrink", lambda M, x: M.nn.Softshrink(0.5)(x)))
PX = [[p for p in EDGE[:12]]]
add(Case("prelu", lambda M, x, w: F(M).prelu(x, w),
         [In([[v, -v, 0.5 * v] for v in EDGE]), In([0.25, -1.0, 0.0])],
         up="cycle"))
add(Case("prelu_one", lambda M, x, w: F(M).prelu(x, w),
         [In([[v, -v] for v in EDGE]), In([0.25])], up="cycle"))
add(Case("glu", lambda M, x: F(M).glu(x, -1),
         [In([[v, w] for v in EDGE[:9] for w in EDGE[:9]])], up="cycle"))

SOFT_ROWS = [[0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [-INF, 0.0, 1.0],
             [INF, 0.0, 1.0], [-INF, -INF, -INF], [NAN, 0.0, 1.0],
             [100.0, -100.0, 0.0], [88.8, 0.0, 0.0], [-INF, -INF, 5.0]]
for name in ("softmax", "log_softmax", "softmin"):
    add(Case(name, lambda M, x, n=name: getattr(F(M), n)(x, dim=1),
             [In(SOFT_ROWS)], up="cycle"))
    add(Case(name + "_empty", lambda M, x, n=name: getattr(F(M), n)(x, 1),
             [In(np.zeros((0, 3)))]))
add(Case("softmax_dim0", lambda M, x: F(M).softmax(x, dim=0),
         [In(SOFT_ROWS)], up="cycle"))
add(Case("logsumexp", lambda M, x: M.logsumexp(x, 1), [In(SOFT_ROWS)],
         up="cycle"))


def _rnn_relu(M, x):
    """nn.RNN(relu) with identity input weights and no recurrence: h = relu
    of the input, so h is exactly 0 at some steps."""
    rnn = M.nn.RNN(2, 2, nonlinearity="relu").to(x.device, x.dtype)
    with M.no_grad():
        for name, p in rnn.named_parameters():
            p.copy_(M.eye(2, device=x.device) if name == "weight_ih_l0"
                    else p * 0)
    return rnn(x)[0]


add(Case("rnn_relu", _rnn_relu,
         [In([[[0.0, 1.0]], [[2.0, -1.0]], [[-3.0, 0.0]], [[-0.0, -2.0]]])],
         up="cycle"))
add(unary("relu_empty", lambda M, x: F(M).relu(x), points=[]))
add(unary("gelu_empty", lambda M, x: F(M).gelu(x), points=[]))

# ---------------------------------------------------------- elementwise --
add(unary("abs", lambda M, x: x.abs()))
add(unary("sqrt", lambda M, x: x.sqrt()))
add(unary("rsqrt", lambda M, x: x.rsqrt()))
add(unary("exp", lambda M, x: x.exp()))
add(unary("log", lambda M, x: x.log()))
add(unary("square", lambda M, x: x.square()))
add(unary("reciprocal", lambda M, x: x.reciprocal()))
for e in (0, 1, 2, 3, 0.5, -1, -0.5, 2.5, -2):
    add(unary(f"pow_{e}", lambda M, x, e=e: x ** e))
for b in (0.0, 2.0, 1.0, -2.0):
    add(unary(f"rpow_{b}", lambda M, x, b=b: b ** x,
              points=[0.0, 1.0, -1.0, 2.0, 0.5, -0.5, INF, -INF, NAN]))
PB, PE = grid([0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 0.5, INF, -INF, NAN],
              [0.0, 1.0, 2.0, 3.0, -1.0, 0.5, -0.5, INF, -INF, NAN])
add(Case("pow_tensor", lambda M, x, y: x ** y, [In(PB), In(PE)],
         up="cycle"))
add(unary("clamp_-1_1", lambda M, x: x.clamp(-1.0, 1.0)))
add(unary("clamp_min0", lambda M, x: x.clamp(min=0.0)))
add(unary("clamp_max0", lambda M, x: x.clamp(max=0.0)))
add(unary("clamp_min_gt_max", lambda M, x: x.clamp(1.0, -1.0)))
add(unary("clamp_min", lambda M, x: x.clamp_min(0.5)))
add(unary("clip", lambda M, x: M.clip(x, -3.0, 3.0)))
add(unary("clamp_inplace", lambda M, x: (x * 1).clamp_(-1.0, 1.0)))
CX, CLO, CHI = grid([0.0, 1.0, -1.0, 2.0, INF, -INF, NAN],
                    [0.0, 1.0, -INF, NAN], [1.0, 0.0, INF])
add(Case("clamp_tensor", lambda M, x, lo, hi: x.clamp(lo, hi),
         [In(CX), In(CLO), In(CHI)], up="cycle"))
add(Case("clamp_tensor_min", lambda M, x, lo: x.clamp(min=lo),
         [In(CX), In(CLO)], up="cycle"))
add(Case("clamp_tensor_max", lambda M, x, hi: M.clamp(x, max=hi),
         [In(CX), In(CHI)], up="cycle"))
MX, MY = grid([0.0, -0.0, 1.0, -1.0, INF, -INF, NAN],
              [0.0, 1.0, -1.0, INF, -INF, NAN])
for name in ("maximum", "minimum"):
    add(Case(name, lambda M, x, y, n=name: getattr(M, n)(x, y),
             [In(MX), In(MY)], up="cycle"))
    add(Case(name + "_bcast", lambda M, x, y, n=name: getattr(M, n)(x, y),
             [In([[1.0, 2.0, 1.0], [NAN, 0.0, 3.0]]), In([1.0])],
             up="cycle"))
add(Case("where", lambda M, x, y: M.where(x > 0, x, y),
         [In(MX), In(MY)], up="cycle"))

# ----------------------------------------------------------- reductions --
TIES = [[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0], [NAN, 1.0, NAN, 5.0],
        [-INF, -INF, -INF, -INF], [INF, 1.0, INF, 0.0], [0.0, -0.0, -1, -1]]
for name in ("max", "min", "amax", "amin"):
    add(Case(name + "_all", lambda M, x, n=name: getattr(x, n)(),
             [In(TIES[:2] + TIES[4:])]))
    add(Case(name + "_all_nan", lambda M, x, n=name: getattr(x, n)(),
             [In(TIES)]))
    add(Case(name + "_empty", lambda M, x, n=name: getattr(x, n)(),
             [In([])], raises=True))
for name in ("amax", "amin"):
    add(Case(name + "_dim", lambda M, x, n=name: getattr(x, n)(1),
             [In(TIES)], up="cycle"))
    add(Case(name + "_dim0_keep", lambda M, x, n=name: getattr(x, n)(0, True),
             [In(TIES)], up="cycle"))
for name in ("max", "min"):
    add(Case(name + "_dim", lambda M, x, n=name: tuple(getattr(x, n)(1)),
             [In(TIES)], up="cycle"))
    add(Case(name + "_dim0", lambda M, x, n=name: tuple(getattr(x, n)(0)),
             [In(TIES)], up="cycle"))
NORM_ROWS = [[0.0, 0.0, 0.0], [3.0, -4.0, 0.0], [-2.0, 2.0, 1.0],
             [1e-30, 0.0, 0.0], [INF, 1.0, 0.0]]
for p in (2, 1, INF, -INF, 3, 0.5, "fro"):
    add(Case(f"norm_{p}_dim", lambda M, x, p=p: x.norm(p, 1),
             [In(NORM_ROWS)], up="cycle"))
    add(Case(f"norm_{p}_zero", lambda M, x, p=p: x.norm(p),
             [In([[0.0, 0.0], [0.0, -0.0]])]))
add(Case("normalize_zero", lambda M, x: F(M).normalize(x, dim=1),
         [In(NORM_ROWS)], up="cycle"))
PROD_ROWS = [[1.0, 2.0, 3.0], [0.0, 2.0, 3.0], [0.0, 0.0, 3.0],
             [INF, 2.0, 1.0], [INF, 0.0, 1.0], [NAN, 1.0, 2.0]]
add(Case("prod_dim", lambda M, x: x.prod(1), [In(PROD_ROWS)], up="cycle"))
add(Case("prod_dim_nozero", lambda M, x: x.prod(1),
         [In([[1.0, 2.0, 3.0], [INF, 2.0, 1.0], [-1.0, 0.5, 4.0]])],
         up="cycle"))
add(Case("prod_all_one_zero", lambda M, x: x.prod(),
         [In([1.0, 0.0, 3.0, -2.0])]))
add(Case("prod_all_two_zeros", lambda M, x: x.prod(),
         [In([1.0, 0.0, 3.0, 0.0])]))
add(Case("prod_all_inf", lambda M, x: x.prod(), [In([1.0, INF, 3.0])]))
add(Case("sum_empty", lambda M, x: x.sum(), [In([])]))
add(Case("mean_empty", lambda M, x: x.mean(), [In([])]))
add(Case("mean_inf", lambda M, x: x.mean(1), [In(SOFT_ROWS)], up="cycle"))
add(Case("var_const", lambda M, x: x.var(1), [In(TIES)], up="cycle"))
add(Case("std_const", lambda M, x: x.std(1), [In(TIES)], up="cycle"))
add(Case("var_one", lambda M, x: x.var(), [In([2.0])]))

# sorting and selection with ties, NaN and infinities
SORT_ROWS = [[3.0, 1.0, 3.0, 2.0, 1.0], [NAN, 1.0, NAN, -INF, 0.0],
             [INF, 2.0, 2.0, INF, -0.0], [0.0, -0.0, 0.0, 5.0, 5.0]]
add(Case("sort", lambda M, x: tuple(x.sort(1)), [In(SORT_ROWS)],
         up="cycle"))
add(Case("sort_desc_stable", lambda M, x: tuple(M.sort(
    x, dim=1, descending=True, stable=True)), [In(SORT_ROWS)], up="cycle"))
add(Case("argsort_stable", lambda M, x: M.argsort(x, dim=1, stable=True),
         [In(SORT_ROWS, grad=False)]))
# which of tied elements topk / kthvalue return is unspecified in PyTorch
# (its CPU kernels select, they do not sort stably): rows without ties
# among the selected values here
SEL_ROWS = [[3.0, 1.0, 4.0, 2.0, 0.5], [NAN, 1.0, 7.0, -INF, 0.0],
            [INF, 2.0, -1.0, 3.0, -0.0], [0.0, -2.0, 1.0, 5.0, 6.0]]
add(Case("topk", lambda M, x: tuple(x.topk(2, 1)), [In(SEL_ROWS)],
         up="cycle"))
add(Case("topk_smallest", lambda M, x: tuple(x.topk(3, 1, largest=False)),
         [In(SEL_ROWS)], up="cycle"))
add(Case("kthvalue", lambda M, x: tuple(x.kthvalue(2, 1)), [In(SEL_ROWS)],
         up="cycle"))
add(Case("median_dim", lambda M, x: tuple(x.median(1)), [In(SORT_ROWS)],
         up="cycle"))
add(Case("median_all", lambda M, x: x.median(), [In(SORT_ROWS[:1])]))
add(Case("median_all_nan", lambda M, x: x.median(), [In(SORT_ROWS)]))
add(Case("mode", lambda M, x: tuple(x.mode(1)), [In(SORT_ROWS[:1] +
                                                   SORT_ROWS[2:])],
         up="cycle"))
for name in ("cummax", "cummin"):
    add(Case(name, lambda M, x, n=name: tuple(getattr(x, n)(1)),
             [In(SORT_ROWS)], up="cycle"))
add(Case("logcumsumexp", lambda M, x: x.logcumsumexp(1),
         [In(SOFT_ROWS)], up="cycle"))
add(Case("cumprod", lambda M, x: x.cumprod(1), [In(PROD_ROWS)],
         up="cycle"))
add(Case("quantile", lambda M, x: M.quantile(x, 0.5, dim=1),
         [In(SORT_ROWS[:1] + SORT_ROWS[2:])], up="cycle"))
add(Case("cdist", lambda M, a, b: M.cdist(a, b),
         [In([[0.0, 0.0], [1.0, 1.0]]), In([[0.0, 0.0], [1.0, 1.0],
                                           [2.0, 1.0]])], up="cycle"))
add(Case("cdist_p1", lambda M, a, b: M.cdist(a, b, p=1.0),
         [In([[0.0, 0.0], [1.0, 1.0]]), In([[0.0, 0.0], [1.0, 1.0],
                                           [2.0, 1.0]])], up="cycle"))
HX, HY = grid([0.0, -0.0, 1.0, -1.0, INF, NAN], [0.0, -0.0, 1.0, -INF, NAN])
add(Case("hypot", lambda M, x, y: M.hypot(x, y), [In(HX), In(HY)],
         up="cycle"))
add(Case("atan2", lambda M, x, y: M.atan2(x, y), [In(HX), In(HY)],
         up="cycle"))
add(Case("xlogy", lambda M, x, y: M.xlogy(x, y), [In(HX), In(HY)],
         up="cycle"))
XX, XY = grid([0.0, 1.0, -1.0, INF, NAN], [0.5, 2.0, 0.0, -1.0, INF, NAN])
add(Case("xlogy_grid", lambda M, x, y: M.xlogy(x, y), [In(XX), In(XY)],
         up="cycle"))
add(Case("fmod", lambda M, x, y: M.fmod(x, y), [In(HX), In(HY)],
         up="cycle"))
add(Case("remainder", lambda M, x, y: M.remainder(x, y), [In(HX), In(HY)],
         up="cycle"))
add(Case("lerp", lambda M, x, y: M.lerp(x, y, 0.5), [In(HX), In(HY)],
         up="cycle"))
add(unary("frac", lambda M, x: x.frac()))
# (float32 sinc at +-1e-30 with an infinite upstream: PyTorch 0, dtorch NaN;
# x^2 underflows there; not matched)
add(unary("sinc", lambda M, x: M.sinc(x),
          points=[p for p in EDGE if abs(p) != 1e-30]))
add(unary("erf", lambda M, x: M.erf(x)))
add(unary("erfc", lambda M, x: M.erfc(x)))
add(unary("erfinv", lambda M, x: M.erfinv(x),
          points=[0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, INF, NAN,
                  0.9999999]))
add(unary("lgamma", lambda M, x: M.lgamma(x),
          points=[0.0, -0.0, 1.0, 2.0, -1.0, -2.0, 0.5, -0.5, INF, -INF,
                  NAN]))
# (digamma's gradient at its poles -1, -2 is a huge finite number in both,
# not the same one; not compared. PyTorch's trigamma is good to ~5e-10
# relative, dtorch's to ~1e-13: rtol 2e-7)
_dg = unary("digamma", lambda M, x: M.digamma(x),
            points=[0.0, -0.0, 1.0, 2.0, 0.5, -0.5, INF, -INF, NAN, 1e-3])
_dg.rtol = 2e-7
add(_dg)
add(unary("expm1", lambda M, x: x.expm1()))
add(unary("log1p", lambda M, x: x.log1p(), points=[
    0.0, -0.0, 1e-30, -1e-30, 1e-10, -1.0, -2.0, 1.0, INF, -INF, NAN]))
add(Case("diff", lambda M, x: M.diff(x, dim=1), [In(SOFT_ROWS)],
         up="cycle"))
add(Case("std_mean", lambda M, x: M.std_mean(x, 1)[0], [In(TIES)],
         up="cycle"))

# normalisation layers over constant input (zero variance) and +-inf
NORM_IN = [[[1.0, 1.0, 1.0, 1.0], [0.0, 1.0, 2.0, 3.0]],
           [[-2.0, -2.0, -2.0, -2.0], [0.5, 0.5, 0.5, 0.5]]]
# (a constant 5.0 comes out of PyTorch's float32 instance_norm as -3e-5:
# its variance rounds to 1 ulp, over sqrt(eps); values whose squares
# are exact here)
add(Case("layer_norm_const", lambda M, x, w, b: F(M).layer_norm(
    x, (4,), w, b), [In(NORM_IN), In([1.0, 2.0, 0.5, -1.0]),
                     In([0.0, 1.0, 0.0, 1.0])], up="cycle"))
add(Case("batch_norm_const", lambda M, x, w, b: F(M).batch_norm(
    x, None, None, w, b, training=True), [In(NORM_IN), In([1.0, 2.0]),
                                          In([0.0, 1.0])], up="cycle"))
add(Case("group_norm_const", lambda M, x, w, b: F(M).group_norm(
    x, 1, w, b), [In(NORM_IN), In([1.0, 2.0]), In([0.0, 1.0])],
    up="cycle"))
add(Case("instance_norm_const", lambda M, x: F(M).instance_norm(x),
         [In(NORM_IN)], up="cycle"))

# attention with a fully masked row (padding): PyTorch's SDPA gives 0 there
SDPA_Q = np.linspace(-1, 1, 24).reshape(1, 2, 3, 4)
SDPA_M = np.array([[True, True, False], [False, False, False],
                   [True, False, True]])
add(Case("sdpa_masked_row", lambda M, q, k, v, m:
         F(M).scaled_dot_product_attention(q, k, v, attn_mask=m),
         [In(SDPA_Q), In(SDPA_Q[..., ::-1].copy()), In(SDPA_Q * 2),
          In(SDPA_M, grad=False, dtype="bool")]))
add(Case("sdpa_float_mask_row", lambda M, q, k, v, m:
         F(M).scaled_dot_product_attention(q, k, v, attn_mask=m),
         [In(SDPA_Q), In(SDPA_Q[..., ::-1].copy()), In(SDPA_Q * 2),
          In(np.where(SDPA_M, 0.0, -np.inf), grad=False)]))

# -------------------------------------------------------------- pooling --
POOL = [[[[1.0, 1.0, 2.0, 2.0], [1.0, 1.0, 2.0, 2.0],
          [NAN, 0.0, -INF, -INF], [3.0, NAN, -INF, -INF]],
         [[INF, INF, 0.0, 5.0], [0.0, 0.0, 5.0, 5.0],
          [-1.0, -2.0, 7.0, 7.0], [-2.0, -1.0, 6.0, 7.0]]]]
add(Case("max_pool2d_2x2", lambda M, x: F(M).max_pool2d(x, 2),
         [In(POOL)], up="cycle"))
add(Case("max_pool2d_3s1", lambda M, x: F(M).max_pool2d(x, 3, 1),
         [In(POOL)], up="cycle"))
add(Case("max_pool2d_2s1", lambda M, x: F(M).max_pool2d(x, 2, 1),
         [In(POOL)], up="cycle"))
add(Case("max_pool2d_pad", lambda M, x: F(M).max_pool2d(x, 3, 2, 1),
         [In(POOL)], up="cycle"))
add(Case("max_pool2d_ceil", lambda M, x: F(M).max_pool2d(
    x, 3, 2, ceil_mode=True), [In(POOL)], up="cycle"))
add(Case("max_pool2d_idx", lambda M, x: tuple(F(M).max_pool2d(
    x, 2, 1, return_indices=True)), [In(POOL)], up="cycle"))
# windows whose real cells are all -inf, next to padding (also -inf)
POOL_PAD = [[[[-INF, -INF, 1.0], [-INF, -INF, 2.0], [0.0, 3.0, 4.0]]]]
add(Case("max_pool2d_pad_ninf", lambda M, x: tuple(F(M).max_pool2d(
    x, 2, 2, 1, return_indices=True)), [In(POOL_PAD)], up="cycle"))
add(Case("max_pool2d_pad_ninf_dil", lambda M, x: tuple(F(M).max_pool2d(
    x, 2, 1, 1, dilation=2, return_indices=True)), [In(POOL_PAD)],
    up="cycle"))
add(Case("max_pool1d", lambda M, x: F(M).max_pool1d(x, 2),
         [In([[[1.0, 1.0, NAN, 0.0, -INF, -INF, INF, INF]]])],
         up="cycle"))
add(Case("avg_pool2d", lambda M, x: F(M).avg_pool2d(x, 2),
         [In(POOL)], up="cycle"))

# --------------------------------------------------------------- losses --
RED = ("none", "mean", "sum")
LX, LT = grid([0.0, 1.0, -1.0, 2.0, INF, -INF, NAN, 0.5],
              [0.0, 1.0, -1.0, 0.5, INF, NAN])
for r in RED:
    add(Case(f"mse_{r}", lambda M, x, t, r=r: F(M).mse_loss(x, t, reduction=r),
             [In(LX), In(LT)], up="cycle"))
    add(Case(f"l1_{r}", lambda M, x, t, r=r: F(M).l1_loss(x, t, reduction=r),
             [In(LX), In(LT)], up="cycle"))
    for beta in (1.0, 0.5, 0.0):
        add(Case(f"smooth_l1_b{beta}_{r}",
                 lambda M, x, t, r=r, b=beta: F(M).smooth_l1_loss(
                     x, t, reduction=r, beta=b),
                 [In(LX), In(LT)], up="cycle"))
    for delta in (1.0, 0.5):
        add(Case(f"huber_d{delta}_{r}",
                 lambda M, x, t, r=r, d=delta: F(M).huber_loss(
                     x, t, reduction=r, delta=d),
                 [In(LX), In(LT)], up="cycle"))
    add(Case(f"mse_empty_{r}",
             lambda M, x, t, r=r: F(M).mse_loss(x, t, reduction=r),
             [In([]), In([])]))
    add(Case(f"l1_empty_{r}",
             lambda M, x, t, r=r: F(M).l1_loss(x, t, reduction=r),
             [In([]), In([])]))
    add(Case(f"smooth_l1_empty_{r}",
             lambda M, x, t, r=r: F(M).smooth_l1_loss(x, t, reduction=r),
             [In([]), In([])]))

# binary cross-entropy: probabilities at 0 and 1 exactly (a float32
# sigmoid rounds to 1.0 from x ~ 17), against targets 0, 1 and between
BX, BT = grid([0.0, 1.0, 0.5, 1e-30, 1e-7, 0.9999999, 0.25, 1e-45],
              [0.0, 1.0, 0.5, 0.3])
BW = [0.5 + (i % 3) for i in range(len(BX))]
for r in RED:
    add(Case(f"bce_{r}", lambda M, x, t, r=r:
             F(M).binary_cross_entropy(x, t, reduction=r),
             [In(BX), In(BT)], up="cycle"))
    add(Case(f"bce_weight_{r}", lambda M, x, t, w, r=r:
             F(M).binary_cross_entropy(x, t, w, reduction=r),
             [In(BX), In(BT), In(BW, grad=False)], up="cycle"))
    add(Case(f"bce_empty_{r}", lambda M, x, t, r=r:
             F(M).binary_cross_entropy(x, t, reduction=r),
             [In([]), In([])]))
add(Case("bce_nan_input", lambda M, x, t: F(M).binary_cross_entropy(
    x, t), [In([NAN, 0.5]), In([1.0, 0.0])], raises=True))
add(Case("bce_nan_target", lambda M, x, t: F(M).binary_cross_entropy(
    x, t), [In([0.0, 0.5, 1.0]), In([NAN, 0.0, 1.0])], raises=True))
add(Case("bce_target_above_1", lambda M, x, t: F(M).binary_cross_entropy(
    x, t), [In([0.0, 0.5, 1.0]), In([1.5, 0.0, 1.0])], raises=True))
add(Case("nn.BCELoss", lambda M, x, t: M.nn.BCELoss()(x, t),
         [In(BX), In(BT, grad=False)]))
add(Case("nn.BCELoss_sigmoid_rounds_to_1",
         lambda M, z, t: M.nn.BCELoss()(M.sigmoid(z), t),
         [In([20.0, -120.0, 0.0, 17.0]), In([0.0, 1.0, 1.0, 1.0], False)],
         dtypes=("float32",)))

ZX, ZT = grid([0.0, -0.0, 1.0, -1.0, 100.0, -100.0, INF, -INF, NAN, 40.0],
              [0.0, 0.5, 1.0, 0.25])
ZW = [0.5 + (i % 3) for i in range(len(ZX))]
for r in RED:
    add(Case(f"bce_logits_{r}", lambda M, x, t, r=r:
             F(M).binary_cross_entropy_with_logits(x, t, reduction=r),
             [In(ZX), In(ZT)], up="cycle"))
    add(Case(f"bce_logits_weight_{r}", lambda M, x, t, w, r=r:
             F(M).binary_cross_entropy_with_logits(x, t, w, reduction=r),
             [In(ZX), In(ZT), In(ZW, grad=False)], up="cycle"))
    add(Case(f"bce_logits_posw_{r}", lambda M, x, t, pw, r=r:
             F(M).binary_cross_entropy_with_logits(
                 x, t, reduction=r, pos_weight=pw),
             [In([ZX[i:i + 4] for i in range(0, len(ZX), 4)]),
              In([ZT[i:i + 4] for i in range(0, len(ZT), 4)]),
              In([2.0, 0.5, 1.0, 0.0], grad=False)], up="cycle"))
    add(Case(f"bce_logits_empty_{r}", lambda M, x, t, r=r:
             F(M).binary_cross_entropy_with_logits(x, t, reduction=r),
             [In([]), In([])]))
add(Case("bce_logits_posw_weight_grad", lambda M, x, t, w, pw:
         F(M).binary_cross_entropy_with_logits(x, t, w, pos_weight=pw),
         [In([[0.0, 1.0, -3.0], [INF, -INF, 2.0]]),
          In([[0.5, 1.0, 0.0], [1.0, 0.0, 0.25]]),
          In([[1.0, 2.0, 0.5], [1.0, 1.0, 3.0]], grad=False),
          In([3.0, 0.5, 1.0], grad=False)]))
add(Case("nn.BCEWithLogitsLoss", lambda M, x, t, pw:
         M.nn.BCEWithLogitsLoss(pos_weight=pw)(x, t),
         [In([ZX[i:i + 4] for i in range(0, len(ZX), 4)]),
          In([ZT[i:i + 4] for i in range(0, len(ZT), 4)]),
          In([2.0, 0.5, 1.0, 0.0], grad=False)]))
add(Case("nn.BCEWithLogitsLoss_zero_head",
         lambda M, x, t: M.nn.BCEWithLogitsLoss()(x, t),
         [In([0.0] * 6), In([0.5, 0.5, 0.0, 1.0, 0.5, 0.5], False)]))

LOGITS = [[0.0, 0.0, 0.0], [1.0, -INF, 2.0], [-INF, 0.0, 1.0],
          [100.0, -100.0, 0.0], [1.0, 1.0, 1.0]]
TGT = In([0, 1, 2, 1, 2], grad=False, dtype="int64")
TGT_IGN = In([0, -100, 2, 1, -100], grad=False, dtype="int64")
TGT_ALL_IGN = In([-100] * 5, grad=False, dtype="int64")
CW = In([1.0, 0.0, 2.0], grad=False)
PROBS = In([[0.2, 0.3, 0.5], [0.0, 0.0, 1.0], [0.0, 0.5, 0.5],
            [1.0, 0.0, 0.0], [1 / 3, 1 / 3, 1 / 3]], grad=False)
for r in RED:
    ce = "cross_entropy"
    add(Case(f"ce_{r}", lambda M, x, t, r=r: F(M).cross_entropy(
        x, t, reduction=r), [In(LOGITS), TGT], up="cycle"))
    add(Case(f"ce_ignore_{r}", lambda M, x, t, r=r: F(M).cross_entropy(
        x, t, reduction=r), [In(LOGITS), TGT_IGN], up="cycle"))
    add(Case(f"ce_all_ignored_{r}", lambda M, x, t, r=r: F(M).cross_entropy(
        x, t, reduction=r), [In(LOGITS), TGT_ALL_IGN], up="cycle"))
    add(Case(f"ce_weight_{r}", lambda M, x, t, w, r=r: F(M).cross_entropy(
        x, t, w, reduction=r), [In(LOGITS), TGT_IGN, CW], up="cycle"))
    add(Case(f"ce_smooth_{r}", lambda M, x, t, r=r: F(M).cross_entropy(
        x, t, reduction=r, label_smoothing=0.1), [In(LOGITS), TGT_IGN],
        up="cycle"))
    add(Case(f"ce_smooth_weight_{r}", lambda M, x, t, w, r=r:
             F(M).cross_entropy(x, t, w, reduction=r, label_smoothing=0.2),
             [In(LOGITS), TGT_IGN, CW], up="cycle"))
    add(Case(f"ce_smooth_all_ignored_{r}", lambda M, x, t, r=r:
             F(M).cross_entropy(x, t, reduction=r, label_smoothing=0.1),
             [In(LOGITS), TGT_ALL_IGN], up="cycle"))
    add(Case(f"ce_probs_{r}", lambda M, x, t, r=r: F(M).cross_entropy(
        x, t, reduction=r), [In(LOGITS), PROBS], up="cycle"))
    add(Case(f"ce_probs_smooth_weight_{r}", lambda M, x, t, w, r=r:
             F(M).cross_entropy(x, t, w, reduction=r, label_smoothing=0.3),
             [In(LOGITS), PROBS, CW], up="cycle"))
    add(Case(f"ce_empty_{r}", lambda M, x, t, r=r: F(M).cross_entropy(
        x, t, reduction=r), [In(np.zeros((0, 3))),
                             In([], grad=False, dtype="int64")]))
    add(Case(f"nll_{r}", lambda M, x, t, w, r=r: F(M).nll_loss(
        x, t, w, reduction=r), [In(LOGITS), TGT_IGN, CW], up="cycle"))
    add(Case(f"nll_all_ignored_{r}", lambda M, x, t, r=r: F(M).nll_loss(
        x, t, reduction=r), [In(LOGITS), TGT_ALL_IGN], up="cycle"))
    add(Case(f"nll_zero_weight_{r}", lambda M, x, t, w, r=r: F(M).nll_loss(
        x, t, w, reduction=r),
        [In(LOGITS), In([1, 1, 1, 1, 1], False, "int64"), CW],
        up="cycle"))

# more losses and distances (dtorch/nn/_functional/loss.py, distance.py)
M1, M2, MT = grid([0.0, 1.0, -1.0, INF, NAN, 0.5], [0.0, 1.0, 0.5, -INF],
                  [1.0, -1.0])
for r in RED:
    add(Case(f"margin_ranking_{r}", lambda M, a, b, t, r=r:
             F(M).margin_ranking_loss(a, b, t, margin=0.5, reduction=r),
             [In(M1), In(M2), In(MT, grad=False)], up="cycle"))
    add(Case(f"hinge_embedding_{r}", lambda M, a, t, r=r:
             F(M).hinge_embedding_loss(a, t, reduction=r),
             [In(M1), In(MT, grad=False)], up="cycle"))
    add(Case(f"soft_margin_{r}", lambda M, a, t, r=r:
             F(M).soft_margin_loss(a, t, reduction=r),
             [In(M1), In(MT, grad=False)], up="cycle"))
    add(Case(f"poisson_nll_{r}", lambda M, a, t, r=r:
             F(M).poisson_nll_loss(a, t, reduction=r),
             [In(M1), In([abs(v) for v in M2])], up="cycle"))
    add(Case(f"poisson_nll_rate_full_{r}", lambda M, a, t, r=r:
             F(M).poisson_nll_loss(a, t, log_input=False, full=True,
                                   reduction=r),
             [In([abs(v) for v in M1]), In([0.0, 1.0, 2.0, 0.5] * 12)],
             up="cycle"))
    add(Case(f"gaussian_nll_{r}", lambda M, a, t, v, r=r:
             F(M).gaussian_nll_loss(a, t, v, reduction=r),
             [In(M1), In(M2), In([0.0, 1e-7, 1e-6, 1.0] * 12)],
             up="cycle"))
    add(Case(f"multilabel_soft_margin_{r}", lambda M, a, t, r=r:
             F(M).multilabel_soft_margin_loss(a, t, reduction=r),
             [In([M1[i:i + 4] for i in range(0, 48, 4)]),
              In([[1.0, 0.0, 1.0, 0.0]] * 12, grad=False)], up="cycle"))
    for pp in (1, 2):
        add(Case(f"multi_margin_p{pp}_{r}", lambda M, a, t, r=r, pp=pp:
                 F(M).multi_margin_loss(a, t, p=pp, reduction=r),
                 [In([[0.0, 1.0, 0.0], [1.0, 1.0, 1.0], [2.0, 0.0, 1.0],
                      [INF, 0.0, 1.0], [0.5, -0.5, 0.0]]),
                  In([0, 1, 2, 1, 0], grad=False, dtype="int64")],
                 up="cycle"))
    add(Case(f"cosine_embedding_{r}", lambda M, a, b, t, r=r:
             F(M).cosine_embedding_loss(a, b, t, margin=0.5, reduction=r),
             [In([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [1.0, 0.0]]),
              In([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0], [1.0, 1.0]]),
              In([1.0, -1.0, -1.0, -1.0], grad=False)], up="cycle"))
    add(Case(f"triplet_margin_{r}", lambda M, a, b, c, r=r:
             F(M).triplet_margin_loss(a, b, c, reduction=r),
             [In([[0.0, 0.0], [1.0, 2.0], [1.0, 1.0]]),
              In([[0.0, 0.0], [1.0, 2.0], [0.0, 1.0]]),
              In([[0.0, 0.0], [2.0, 2.0], [1.0, 1.0]])], up="cycle"))
DIST_A = [[0.0, 0.0, 0.0], [1.0, 2.0, 3.0], [1.0, -1.0, 0.0], [0.0, 0.0, 1.0]]
DIST_B = [[0.0, 0.0, 0.0], [1.0, 2.0, 3.0], [0.0, 0.0, 0.0], [0.0, 0.0, 2.0]]
add(Case("cosine_similarity", lambda M, a, b: F(M).cosine_similarity(a, b),
         [In(DIST_A), In(DIST_B)], up="cycle"))
for pp in (2.0, 1.0, INF, 3.0):
    add(Case(f"pairwise_distance_{pp}", lambda M, a, b, pp=pp:
             F(M).pairwise_distance(a, b, pp), [In(DIST_A), In(DIST_B)],
             up="cycle"))
    add(Case(f"pdist_{pp}", lambda M, a, pp=pp: F(M).pdist(a, pp),
             [In(DIST_A + DIST_B[1:2])], up="cycle"))
add(Case("adaptive_max_pool2d", lambda M, x: F(M).adaptive_max_pool2d(x, 2),
         [In(POOL)], up="cycle"))
# overlapping adaptive windows holding NaN: not matched (see the docstring)
add(Case("adaptive_max_pool2d_3", lambda M, x: F(M).adaptive_max_pool2d(
    x, 3), [In(np.nan_to_num(np.asarray(POOL), nan=-5.0))], up="cycle"))
add(Case("lp_pool2d", lambda M, x: F(M).lp_pool2d(x, 2.0, 2),
         [In([[[[0.0, 0.0, 1.0, 2.0], [0.0, 0.0, -1.0, 0.0],
                [3.0, 4.0, INF, 0.0], [0.0, 0.0, 0.0, 1.0]]]])],
         up="cycle"))

# CTC: an impossible alignment (target longer than the input) has an
# infinite loss; zero_infinity makes it 0 with a zero gradient
CTC_LP = np.log(np.full((3, 2, 4), 0.25)).tolist()
for zi in (False, True):
    for r in RED:
        add(Case(f"ctc_impossible_zi{zi}_{r}", lambda M, lp, t, il, tl, r=r,
                 zi=zi: F(M).ctc_loss(lp, t, il, tl, reduction=r,
                                      zero_infinity=zi),
                 [In(CTC_LP), In([[1, 2, 1, 3], [1, 2, 0, 0]], False,
                                 "int64"),
                  In([3, 3], False, "int64"), In([4, 2], False, "int64")],
                 up="cycle"))

KX, KT = grid([0.0, -1.0, 1.0, -INF, INF, NAN, -100.0],
              [0.0, 1.0, 0.5, 1e-30])
for r in ("none", "mean", "sum", "batchmean"):
    add(Case(f"kl_div_{r}", lambda M, x, t, r=r: F(M).kl_div(
        x, t, reduction=r), [In(KX), In(KT)], up="cycle"))
    add(Case(f"kl_div_log_target_{r}", lambda M, x, t, r=r: F(M).kl_div(
        x, t, reduction=r, log_target=True),
        [In(KX), In([-INF if v == 0 else math.log(v) for v in KT])],
        up="cycle"))
add(Case("kl_div_negative_target", lambda M, x, t: F(M).kl_div(
    x, t, reduction="none"), [In([0.0, 1.0]), In([-1.0, -0.0])],
    up="cycle"))


# ------------------------------------------------------------ the runner --

def _array(v):
    if v is None:
        return None
    if hasattr(v, "detach"):
        v = v.detach()
        v = v.cpu() if hasattr(v, "cpu") else v
        return np.asarray(v.numpy()).copy()
    return np.asarray(v).copy()


def _run(M, case, dtype, device=None):
    ts = []
    for spec in case.inputs:
        name = spec.dtype or dtype
        # through NumPy, so that empty inputs keep their shape (0, 3)
        arr = np.asarray(spec.values, dtype=getattr(np, name))
        t = M.tensor(arr, dtype=getattr(M, name))
        if device is not None:
            t = t.to(device)
        if spec.grad:
            t.requires_grad_(True)
        ts.append(t)
    out = case.fn(M, *ts)
    outs = out if isinstance(out, tuple) else (out,)
    fwd = [(_array(o), str(o.dtype).split(".")[-1]) for o in outs]
    grads = []
    head = outs[0]
    if head.requires_grad:
        if isinstance(case.up, list):
            up = np.asarray(case.up, dtype=np.float64).reshape(head.shape)
        elif case.up == "cycle":
            up = np.resize(np.asarray(UP), tuple(head.shape))
        else:
            up = np.ones(tuple(head.shape))
        head.backward(M.tensor(up, dtype=head.dtype).to(head.device))
        for t in ts:
            if t.requires_grad:
                grads.append(None if t.grad is None else _array(t.grad))
    return fwd, grads


def _close(a, b, dtype, what, rtol=None):
    assert a.shape == b.shape, f"{what}: shape {a.shape} != {b.shape}"
    if a.dtype.kind in "biu" or b.dtype.kind in "biu":
        np.testing.assert_array_equal(a, b, err_msg=what)
        return
    if rtol is None:
        rtol = 2e-5 if dtype == "float32" else 1e-10
    atol = 1e-6 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64),
                               rtol=rtol, atol=atol, equal_nan=True,
                               err_msg=what)


PARAMS = [pytest.param(c, d, id=f"{c.id}-{d}")
          for c in CASES for d in c.dtypes]


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("case,dtype", PARAMS)
def test_matches_pytorch(case, dtype):
    _check(case, dtype)


# the same table with dtorch on CUDA (CuPy, or the CuPy stand-in under
# DTORCH_FAKE_CUDA=1): the ops' array code is written once for both
# (float64: what every CUDA device computes as the CPU does)
# (the 'cuda' parameter gives them the gpu marker: tests/run.sh's pass on
# the stand-in selects them)
CUDA_PARAMS = [pytest.param(c, "cuda", id=f"{c.id}-cuda") for c in CASES
               if "float64" in c.dtypes and not c.raises]


@pytest.mark.filterwarnings("ignore")
@pytest.mark.skipif(not dtorch.cuda.is_available(),
                    reason="needs CuPy (or DTORCH_FAKE_CUDA=1)")
@pytest.mark.parametrize("case,device", CUDA_PARAMS)
def test_matches_pytorch_on_cuda(case, device):
    _check(case, "float64", device=device)


def _check(case, dtype, device=None):
    if case.raises:
        with pytest.raises(Exception):
            _run(torch, case, dtype)
        with pytest.raises(Exception):
            _run(dtorch, case, dtype)
        return
    with np.errstate(all="ignore"):
        tf, tg = _run(torch, case, dtype)
        df, dg = _run(dtorch, case, dtype, device)
    assert len(df) == len(tf)
    for i, ((d, ddt), (t, tdt)) in enumerate(zip(df, tf)):
        assert ddt == tdt, f"output {i} dtype {ddt} != {tdt}"
        _close(d, t, dtype, f"{case.id}: forward output {i}", case.rtol)
    assert len(dg) == len(tg)
    for i, (d, t) in enumerate(zip(dg, tg)):
        if d is None and t is None:
            continue
        shape = (t if t is not None else d).shape
        d = np.zeros(shape) if d is None else d
        t = np.zeros(shape) if t is None else t
        _close(d, t, dtype, f"{case.id}: gradient of input {i}", case.rtol)


# ------------------------------------- finite differences, off the kinks --
# Every op that got its own backward for the table above, checked against
# central differences in float64 at points away from kinks, thresholds and
# ties (where a finite difference straddles two pieces).

def _away(shape, seed, lo=0.2, hi=2.0, signed=True):
    """Values with |v| in [lo, hi] (random signs): clear of 0 and of each
    other's ties."""
    rng = np.random.default_rng(seed)
    v = rng.uniform(lo, hi, size=shape)
    if signed:
        v *= rng.choice([-1.0, 1.0], size=shape)
    return v


def _t(v, req=True):
    return dtorch.tensor(np.asarray(v, dtype=np.float64), requires_grad=req)


Fd = dtorch.nn.functional
GRADCHECK = {
    "leaky_relu": (lambda x: Fd.leaky_relu(x, 0.2), [(3, 4)]),
    "elu": (lambda x: Fd.elu(x, 0.7), [(3, 4)]),
    "softplus": (lambda x: Fd.softplus(x), [(3, 4)]),
    "softplus_beta_thr": (lambda x: Fd.softplus(x * 3, 2.0, 2.5), [(3, 4)]),
    "silu": (Fd.silu, [(3, 4)]),
    "mish": (Fd.mish, [(3, 4)]),
    "logsigmoid": (Fd.logsigmoid, [(3, 4)]),
    "hardtanh": (lambda x: Fd.hardtanh(x, -1.1, 0.9), [(3, 4)]),
    "relu6": (lambda x: Fd.relu6(x * 4), [(3, 4)]),
    "relu": (Fd.relu, [(3, 4)]),
    "abs": (lambda x: x.abs(), [(3, 4)]),
    "clamp": (lambda x: x.clamp(-1.0, 1.0), [(3, 4)]),
    "clamp_tensor": (lambda x, lo, hi: x.clamp(lo - 1.5, hi + 1.5),
                     [(3, 4), (3, 4), (4,)]),
    "maximum": (lambda x, y: dtorch.maximum(x, y), [(3, 4), (4,)]),
    "minimum": (lambda x, y: dtorch.minimum(x, y), [(3, 4), (3, 1)]),
    "where": (lambda x, y: dtorch.where(x > 0, x, y), [(3, 4), (3, 4)]),
    "pow_scalars": (lambda x: x.abs() ** 0.5 + x.abs() ** -0.5 + x ** 2
                    + x ** 3 + x ** -1 + x ** -2 + x.abs() ** 2.5, [(3, 4)]),
    "pow_tensor": (lambda x, y: x.abs() ** y, [(3, 4), (3, 4)]),
    "reciprocal": (lambda x: x.reciprocal(), [(3, 4)]),
    "rsqrt": (lambda x: x.abs().rsqrt(), [(3, 4)]),
    "prod_dim": (lambda x: x.prod(1), [(3, 4)]),
    "prod_all": (lambda x: x.prod(), [(2, 3)]),
    "std": (lambda x: x.std(1), [(3, 4)]),
    "max_all": (lambda x: x.max(), [(3, 4)]),
    "min_all": (lambda x: x.min(), [(3, 4)]),
    "xlogy_kl_div": (lambda x, t: Fd.kl_div(x, t.abs(), reduction="sum"),
                     [(3, 4), (3, 4)]),
    "smooth_l1": (lambda x, t: Fd.smooth_l1_loss(x * 2, t, beta=0.7,
                                                 reduction="none"),
                  [(3, 4), (3, 4)]),
    "huber": (lambda x, t: Fd.huber_loss(x * 2, t, delta=0.6,
                                         reduction="sum"),
              [(3, 4), (3, 4)]),
    "bce": (lambda x, t: Fd.binary_cross_entropy(
        x.sigmoid(), t.sigmoid(), reduction="none"), [(3, 4), (3, 4)]),
    "bce_weight": (lambda x, t: Fd.binary_cross_entropy(
        x.sigmoid(), t.sigmoid(), dtorch.linspace(0.5, 2, 4).double()),
        [(3, 4), (3, 4)]),
    "bce_logits": (lambda x, t: Fd.binary_cross_entropy_with_logits(
        x, t.sigmoid(), reduction="none"), [(3, 4), (3, 4)]),
    "bce_logits_weights": (lambda x, t: Fd.binary_cross_entropy_with_logits(
        x, t.sigmoid(), dtorch.linspace(0.5, 2, 4).double(),
        pos_weight=dtorch.linspace(3, 0.25, 4).double()), [(3, 4), (3, 4)]),
    "cross_entropy_smooth": (lambda x: Fd.cross_entropy(
        x, dtorch.tensor([0, -100, 2]), label_smoothing=0.2), [(3, 4)]),
}
for _p in (2, 1, 3, 0.5, 1.5, INF, -INF):
    GRADCHECK[f"norm_{_p}"] = (lambda x, p=_p: x.norm(p, 1), [(3, 4)])
    GRADCHECK[f"norm_{_p}_all"] = (lambda x, p=_p: x.norm(p), [(3, 4)])
GRADCHECK["normalize"] = (lambda x: Fd.normalize(x, dim=1), [(3, 4)])
GRADCHECK.update({
    "hardswish": (lambda x: Fd.hardswish(x * 2), [(3, 4)]),
    "hardsigmoid": (lambda x: Fd.hardsigmoid(x * 2), [(3, 4)]),
    "celu": (lambda x: Fd.celu(x, 0.6), [(3, 4)]),
    "selu": (Fd.selu, [(3, 4)]),
    "hardshrink": (lambda x: Fd.hardshrink(x, 0.1), [(3, 4)]),
    "softshrink": (lambda x: Fd.softshrink(x, 0.1), [(3, 4)]),
    "threshold": (lambda x: Fd.threshold(x, 0.1, -2.0), [(3, 4)]),
    "prelu": (lambda x, w: Fd.prelu(x, w), [(2, 3, 4), (3,)]),
    "rrelu_eval": (Fd.rrelu, [(3, 4)]),
    "soft_margin": (lambda x, t: Fd.soft_margin_loss(x, t.sign()),
                    [(3, 4), (3, 4)]),
    "multi_margin": (lambda x: Fd.multi_margin_loss(
        x, dtorch.tensor([0, 3, 1]), p=2, margin=0.5), [(3, 4)]),
    "lerp": (lambda a, b, w: dtorch.lerp(a, b, w.abs() / 2.5),
             [(3, 4), (3, 4), (3, 4)]),
    "lerp_scalar": (lambda a, b: a.lerp(b, 0.75), [(3, 4), (3, 4)]),
    "fmod": (lambda a, b: dtorch.fmod(a * 3, b), [(3, 4), (3, 4)]),
    "remainder": (lambda a, b: dtorch.remainder(a * 3, b),
                  [(3, 4), (3, 4)]),
    "expm1": (lambda x: x.expm1(), [(3, 4)]),
    "log1p": (lambda x: x.abs().log1p(), [(3, 4)]),
    "logcumsumexp": (lambda x: x.logcumsumexp(1), [(3, 4)]),
    "median_all": (lambda x: x.median(), [(3, 5)]),
    "xlogy": (lambda x, y: dtorch.xlogy(x, y.abs()), [(3, 4), (3, 4)]),
    "atan2": (lambda x, y: dtorch.atan2(x, y), [(3, 4), (3, 4)]),
    "sigmoid": (lambda x: x.sigmoid(), [(3, 4)]),
    "sinc": (lambda x: dtorch.sinc(x), [(3, 4)]),
    "nll_ignore_weight": (lambda x: Fd.nll_loss(
        x, dtorch.tensor([0, -100, 2]),
        dtorch.tensor([1.0, 0.5, 2.0, 1.0]).double()), [(3, 4)]),
    "max_pool2d_overlap": (lambda x: Fd.max_pool2d(x, 3, 1, 1),
                           [(1, 2, 4, 4)]),
    "max_pool2d_2x2": (lambda x: Fd.max_pool2d(x, 2), [(1, 2, 4, 4)]),
    "cumprod_with_zero": (lambda x: (x * dtorch.tensor(
        [1.0, 0.0, 1.0, 1.0]).double()).cumprod(1), [(3, 4)]),
})


@pytest.mark.parametrize("name", sorted(GRADCHECK))
def test_gradcheck_off_the_kinks(name):
    fn, shapes = GRADCHECK[name]
    ins = [_t(_away(s, seed=i + 7 * len(name))) for i, s in enumerate(shapes)]
    assert dtorch.autograd.gradcheck(fn, ins, eps=1e-6, atol=1e-6, rtol=1e-5)

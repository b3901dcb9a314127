"""Tensor methods keep float16/bfloat16 as PyTorch does (a Python float
inside an op's NumPy code can silently widen bfloat16 to float32: cummax
did). Output dtype and values against torch."""
import numpy as np
import pytest

import dtorch
from torch_oracle import torch_oracle

UNARY = """abs neg exp exp2 expm1 log log2 log10 log1p sqrt rsqrt sin cos tan
asin acos atan sinh cosh tanh asinh acosh atanh sigmoid relu floor ceil round
trunc frac sign reciprocal square erf erfc erfinv lgamma digamma sinc logit
nan_to_num sum mean prod amax amin max min std var norm nanmean nansum
sort argsort msort t tril triu clone diff""".split()
ALONG_DIM = """flip cumsum cumprod cummax cummin logcumsumexp softmax log_softmax
logsumexp""".split()
K = ["topk", "kthvalue"]


def _first(r):
    return r[0] if isinstance(r, tuple) else r


@pytest.mark.parametrize("dt", ["bfloat16", "float16"])
@pytest.mark.parametrize("name", UNARY + ALONG_DIM + K)
def test_method_keeps_reduced_precision_dtype_as_torch(name, dt):
    torch = pytest.importorskip("torch")
    a = np.random.RandomState(0).rand(4, 5).astype(np.float32) * 0.8 + 0.1
    x = dtorch.tensor(a).to(getattr(dtorch, dt))
    y = torch.tensor(a).to(getattr(torch, dt))
    args = (0,) if name in ALONG_DIM else (2,) if name in K else ()
    out = _first(getattr(x, name)(*args))
    got = out.float().numpy().astype(np.float64)
    # alone: near dtorch's own float32 answer on the same rounded input
    _near(got, _first(getattr(x.float(), name)(*args)), dt)
    want = _first(torch_oracle(getattr(y, name), *args))
    assert str(out.dtype).split(".")[-1] == str(want.dtype).split(".")[-1]
    _near(got, want, dt)


def _near(got, ref, dt):
    ref = ref.float().numpy().astype(np.float64)
    tol = 0.05 if dt == "bfloat16" else 0.01
    big = np.abs(np.nan_to_num(ref, nan=0, posinf=0, neginf=0)).max()
    np.testing.assert_allclose(got, ref, atol=tol * (1 + big),
                               equal_nan=True)

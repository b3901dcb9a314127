"""Linear functions: linear, bilinear."""
from ... import ops as P
from ...ops.base import dtype_name


# ============================================================ linear ==

def linear(input, weight, bias=None):
    """y = input @ weight.T + bias, one fused node."""
    return P.Linear.apply(input, weight, bias)


def bilinear(input1, input2, weight, bias=None):
    """y_k = x1^T A_k x2 + b_k for weight (out, in1, in2)."""
    ts = [input1, input2, weight] + ([bias] if bias is not None else [])
    if len({t.dtype for t in ts}) > 1:      # PyTorch does not promote
        names = [dtype_name(t.dtype.np, True) for t in ts]
        raise RuntimeError(
            "All tensors must have the same dtype, got " + ", ".join(
                f"{k}: {n}" for k, n in zip(
                    ("input1", "input2", "weight", "bias"), names)))
    o, i1, i2 = weight.shape
    t = input1 @ weight.permute(1, 0, 2).reshape(i1, o * i2)
    t = t.reshape(*input1.shape[:-1], o, i2)
    out = (t * input2.unsqueeze(-2)).sum(-1)
    return out if bias is None else out + bias

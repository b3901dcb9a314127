"""pad (PyTorch lists it with the vision functions; conv, pooling and
normalization use it too)."""
from ... import ops as N
from ...autograd.function import autocast_op


# ================================================================ padding ==

def pad(input, pad, mode="constant", value=None):
    """Pad the last len(pad) // 2 dims; pad = (left, right, top, bottom, ...)
    starting from the last dim, as in PyTorch. Negative pads crop."""
    if len(pad) % 2:
        raise RuntimeError("Padding length must be divisible by 2")
    if len(pad) // 2 > input.ndim:
        raise RuntimeError("Padding length should be less than or equal to "
                           "two times the input dimension but got padding "
                           f"length {len(pad)} and input of dimension "
                           f"{input.ndim}")
    if mode not in ("constant", "reflect", "replicate", "circular"):
        raise NotImplementedError(f"Unrecognised padding mode {mode}")
    pads = [[0, 0] for _ in range(input.ndim)]
    for i in range(len(pad) // 2):
        pads[input.ndim - 1 - i] = [int(pad[2 * i]), int(pad[2 * i + 1])]
    if any(a < 0 for pr in pads for a in pr):
        key = tuple(slice(-lo if lo < 0 else 0, hi if hi < 0 else None)
                    for lo, hi in pads)
        input = input[key]
        pads = [[max(lo, 0), max(hi, 0)] for lo, hi in pads]
    value = 0.0 if value is None else value
    if mode in ("reflect", "replicate"):
        return _pad_fp32(input, tuple(map(tuple, pads)), mode, value)
    return N.Pad.apply(input, pads=tuple(map(tuple, pads)), mode=mode,
                       value=value)


@autocast_op({"cpu": "fp32"})    # PyTorch's CPU reflection/replication_pad
def _pad_fp32(input, pads, mode, value):
    return N.Pad.apply(input, pads=pads, mode=mode, value=value)

"""``dtorch.backends.cuda``: the matmul precision flags and the
scaled-dot-product-attention kernel switches. dtorch's float32 matmuls are
full precision whatever the flags say; they are kept so scripts can set and
read them."""
from ... import _backend as B


class _MatmulFlags:
    def __init__(self):
        self.allow_tf32 = False
        self.allow_fp16_reduced_precision_reduction = True
        self.allow_bf16_reduced_precision_reduction = True
        self.fp32_precision = "ieee"


matmul = _MatmulFlags()

_sdp = {"flash": True, "mem_efficient": True, "math": True, "cudnn": True}


def is_built():
    """True when dtorch can reach CUDA (CuPy is importable and a GPU is
    there)."""
    return B.cupy_available()


def _sdp_switch(kernel):
    """PyTorch's ``<kernel>_sdp_enabled()`` and ``enable_<kernel>_sdp(on)``
    for one attention kernel (recorded only: see sdp_kernel)."""
    def enabled():
        return _sdp[kernel]

    def enable(enabled):
        _sdp[kernel] = bool(enabled)
    enabled.__name__ = enabled.__qualname__ = f"{kernel}_sdp_enabled"
    enable.__name__ = enable.__qualname__ = f"enable_{kernel}_sdp"
    return enabled, enable


flash_sdp_enabled, enable_flash_sdp = _sdp_switch("flash")
mem_efficient_sdp_enabled, enable_mem_efficient_sdp = _sdp_switch(
    "mem_efficient")
math_sdp_enabled, enable_math_sdp = _sdp_switch("math")
cudnn_sdp_enabled, enable_cudnn_sdp = _sdp_switch("cudnn")


class sdp_kernel:
    """Context manager selecting attention kernels; dtorch has one (math)
    implementation, so it only records the choice for the block."""

    def __init__(self, enable_flash=True, enable_math=True,
                 enable_mem_efficient=True, enable_cudnn=True):
        self.new = {"flash": enable_flash, "math": enable_math,
                    "mem_efficient": enable_mem_efficient,
                    "cudnn": enable_cudnn}
        self.old = None

    def __enter__(self):
        self.old = dict(_sdp)
        _sdp.update(self.new)
        return self

    def __exit__(self, *exc):
        _sdp.update(self.old)
        return False

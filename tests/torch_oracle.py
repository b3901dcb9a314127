"""Running PyTorch as the oracle on a CPU whose features it depends on.

torch's CPU kernels differ from machine to machine: under bfloat16/float16
(autocast, or reduced-precision tensors) it dispatches to oneDNN (mkldnn)
primitives and to kernels built for the CPU's instruction set, and on some
CPUs those raise (nn.LSTM under CPU bfloat16 autocast on an AVX2-only AMD
EPYC: oneDNN cannot create the primitive). That is the oracle failing, not
dtorch: ``torch_oracle`` turns exactly that into a skip whose reason names
the CPU and torch's error. A test calls it *after* the checks dtorch can do
alone (its dtype, its values against its own float32 run), so those still
run on such a machine. Any other exception of torch propagates."""
import re

import pytest

# the texts of torch errors that come from the CPU's kernels, not from the
# call: oneDNN/mkldnn primitives, reduced-precision kernels missing for this
# instruction set, the x86 quantized engine (fbgemm needs AVX2)
_CPU_KERNEL_ERROR = re.compile(
    r"onednn|mkldnn|dnnl|primitive descriptor|could not create a primitive"
    r"|not implemented for '(BFloat16|Half)'|fbgemm", re.IGNORECASE)

# CPU flags that decide which of those kernels torch can use
_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16")


def cpu_features():
    """'AVX2; avx2' style: torch's CPU capability and the relevant flags."""
    try:
        import torch
        cap = torch.backends.cpu.get_cpu_capability()
    except (ImportError, AttributeError, RuntimeError):
        cap = "unknown capability"
    flags = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        return f"{cap}; CPU flags unknown"
    have = [fl for fl in _FLAGS if fl in flags]
    lack = [fl for fl in _FLAGS if fl not in flags]
    return f"{cap}; has {' '.join(have) or '-'}; lacks {' '.join(lack) or '-'}"


def is_cpu_kernel_error(exc):
    return isinstance(exc, RuntimeError) and bool(
        _CPU_KERNEL_ERROR.search(str(exc)))


def torch_oracle(fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, torch's answer; if torch's own CPU kernel
    raises (see ``is_cpu_kernel_error``), skip the rest of the test with the
    CPU and the error in the reason."""
    try:
        return fn(*args, **kwargs)
    except RuntimeError as e:
        if not is_cpu_kernel_error(e):
            raise
        first = (str(e).strip().splitlines() or [""])[0][:200]
        pytest.skip(f"the torch oracle cannot run this on this CPU "
                    f"({cpu_features()}): RuntimeError: {first}")

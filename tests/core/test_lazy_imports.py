"""`import dtorch` / `import dtorch.nn` load no distribution code: the
single-process path (a laptop, a unit test) imports neither collectives nor
dtorch.distributed, nn.parallel or the distributed checkpoint; they load
on first use, under their usual names. Nor does it import einops, which
still finds dtorch tensors whichever of the two comes first."""
import pytest

from helpers import run_python

DISTRIBUTION = ("collectives", "dtorch.distributed", "dtorch.nn.parallel",
                "mpi4py", "cupy")


def _run(code):
    return run_python(code).stdout


def test_import_dtorch_loads_no_distribution_code():
    out = _run(
        "import sys, dtorch, dtorch.nn, dtorch.optim, dtorch.utils.data\n"
        f"bad = sorted(m for m in sys.modules if m.startswith({DISTRIBUTION!r}))\n"
        "print(bad)\n")
    assert out.strip() == "[]"


@pytest.mark.parametrize("expr, module", [
    ("dtorch.nn.parallel.DistributedDataParallel", "dtorch.nn.parallel"),
    ("dtorch.nn.SyncBatchNorm", "dtorch.nn.parallel.sync_batchnorm"),
    ("dtorch.nn.DataParallel", "dtorch.nn.parallel.data_parallel"),
    ("dtorch.distributed.all_reduce", "collectives"),
])
def test_lazy_names_load_on_first_use(expr, module):
    out = _run(
        "import sys, dtorch, dtorch.nn\n"
        f"assert {module!r} not in sys.modules\n"
        f"obj = {expr}\n"
        f"print({module!r} in sys.modules, obj.__name__)\n")
    assert out.split() == ["True", expr.rsplit(".", 1)[1]]


def test_from_import_and_unknown_names():
    import dtorch.nn as nn
    from dtorch.nn import SyncBatchNorm, DataParallel  # noqa: F401
    assert "SyncBatchNorm" in dir(nn) and "parallel" in dir(nn)
    with pytest.raises(AttributeError, match="no attribute 'NoSuchLayer'"):
        nn.NoSuchLayer
    import dtorch
    with pytest.raises(AttributeError, match="no attribute 'no_such'"):
        dtorch.no_such


def test_import_dtorch_does_not_load_ml_dtypes():
    """ml_dtypes costs 0.5-1.2 s of CPU at import: it loads with the first
    bfloat16, and bfloat16 then works on every path (a caller's ml_dtypes
    array, the float32-accumulating matmul, save/load, CPU autocast)."""
    out = _run(
        "import sys, io, numpy as np, dtorch, dtorch.nn, dtorch.optim\n"
        "import dtorch.utils.data, dtorch.amp, dtorch.distributed\n"
        "from dtorch.utils.checkpoint import checkpoint\n"
        "m = dtorch.nn.Linear(4, 3)\n"
        "m(dtorch.ones(2, 4)).sum().backward()\n"
        # a recomputation replays the (disabled) autocast state
        "x = dtorch.ones(2, 4, requires_grad=True)\n"
        "checkpoint(m, x, use_reentrant=False).sum().backward()\n"
        "f = io.BytesIO(); dtorch.save(m.state_dict(), f); f.seek(0)\n"
        "dtorch.load(f)\n"
        "assert dtorch.is_floating_point(dtorch.ones(1))\n"
        "print('ml_dtypes' in sys.modules)\n"
        "a = dtorch.full((2, 3), 1.5, dtype=dtorch.bfloat16, requires_grad=True)\n"
        "print('ml_dtypes' in sys.modules)\n"
        "y = a @ dtorch.ones(3, 2, dtype=dtorch.bfloat16)\n"
        "y.sum().backward()\n"
        "print(y.dtype, y[0, 0].item(), a.grad.dtype, a.grad[0, 0].item())\n"
        "f = io.BytesIO(); dtorch.save({'a': a.detach()}, f); f.seek(0)\n"
        "b = dtorch.load(f)['a']\n"
        "print(b.dtype, bool((b == a).all()))\n"
        "with dtorch.autocast('cpu'):\n"
        "    print(m(dtorch.ones(2, 4)).dtype)\n")
    assert out.split() == ["False", "True", "dtorch.bfloat16", "4.5",
                           "dtorch.bfloat16", "2.0", "dtorch.bfloat16",
                           "True", "dtorch.bfloat16"]


def test_foreign_ml_dtypes_array_before_first_bfloat16():
    out = _run(
        "import numpy as np, ml_dtypes, dtorch\n"
        "x = np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16)\n"
        "for t in (dtorch.from_numpy(x), dtorch.tensor(x), dtorch.as_tensor(x)):\n"
        "    print(t.dtype, t.tolist())\n"
        "print(dtorch.float32.is_floating_point, dtorch.bfloat16.itemsize)\n")
    assert out.splitlines() == ["dtorch.bfloat16 [1.5, -2.0]"] * 3 + ["True 2"]


def test_einops_finds_dtorch_in_either_import_order():
    """dtorch/_einops_hook.py: import dtorch does not import einops; the
    backend is defined when einops comes, after or before dtorch."""
    pytest.importorskip("einops")
    after = _run(
        "import sys, dtorch\n"
        "print('einops' in sys.modules)\n"
        "import einops\n"
        "x = einops.rearrange(dtorch.ones(2, 3), 'a b -> b a')\n"
        "print(tuple(x.shape), type(x).__module__)\n"
        "print(any(type(f).__name__ == '_AfterEinops' "
        "for f in sys.meta_path))")
    assert after.strip().splitlines() == ["False", "(3, 2) dtorch.tensor", "False"]
    before = _run(
        "import einops, dtorch\n"
        "print(tuple(einops.reduce(dtorch.ones(2, 3), 'a b -> a', 'sum')"
        ".tolist()))")
    assert before.strip() == "(3.0, 3.0)"


def test_no_einops_installed_means_no_einops_hook():
    # einops unimportable (None in sys.modules): import dtorch adds no
    # import finder
    out = _run(
        "import sys; sys.modules['einops'] = None\n"
        "import dtorch\n"
        "print(any(type(f).__name__ == '_AfterEinops' "
        "for f in sys.meta_path))")
    assert out.strip() == "False"

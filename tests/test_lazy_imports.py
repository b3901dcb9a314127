"""`import dtorch` / `import dtorch.nn` load no distribution code: the
single-process path (a laptop, a unit test) imports neither collectives nor
dtorch.distributed, nn.parallel or the distributed checkpoint; they load
on first use, under their usual names. Nor does it import einops, which
still finds dtorch tensors whichever of the two comes first."""
import subprocess
import sys

import pytest

DISTRIBUTION = ("collectives", "dtorch.distributed", "dtorch.nn.parallel",
                "mpi4py", "cupy")


def _run(code):
    r = subprocess.run([sys.executable, "-c", code], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


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

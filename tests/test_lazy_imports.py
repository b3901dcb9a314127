"""`import dtorch` / `import dtorch.nn` load no distribution code: the
single-process path (a laptop, a unit test) imports neither collectives nor
dtorch.distributed, nn.parallel or the distributed checkpoint; they load
on first use, under their usual names."""
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

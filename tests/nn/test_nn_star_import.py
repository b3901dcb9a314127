"""`from dtorch.nn import *` exports PyTorch's torch.nn names, the lazily
loaded distribution ones (SyncBatchNorm, DataParallel, parallel) included,
while a plain `import dtorch.nn` still loads no distribution code."""
from helpers import run_python


def _run(code):
    return run_python(code).stdout.split()


def test_star_import_brings_lazy_names():
    out = _run(
        "import sys\n"
        "import dtorch.nn\n"
        "print('dtorch.nn.parallel' in sys.modules)\n"
        "from dtorch.nn import *\n"
        "print(SyncBatchNorm.__name__, DataParallel.__name__,\n"
        "      parallel.__name__, Linear.__name__, Parameter.__name__,\n"
        "      functional.__name__, init.__name__, utils.__name__)\n")
    assert out == ["False", "SyncBatchNorm", "DataParallel",
                   "dtorch.nn.parallel", "Linear", "Parameter",
                   "dtorch.nn.functional", "dtorch.nn.init",
                   "dtorch.nn.utils"]


def test_all_names_resolve_and_cover_the_public_names():
    # in a fresh process: what `import dtorch.nn` defines is all exported
    out = _run(
        "import dtorch.nn as nn\n"
        "public = {k for k in vars(nn) if not k.startswith('_')}\n"
        "print(sorted(public - set(nn.__all__)),\n"
        "      len(nn.__all__) == len(set(nn.__all__)))\n"
        "for name in nn.__all__:\n"
        "    getattr(nn, name)\n")
    assert out == ["[]", "True"]

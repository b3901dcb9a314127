"""dtorch/ops as a package of op families: importing an ops module changes
nothing process-wide (glibc's malloc is tuned by one explicit call that
``import dtorch`` makes, unless DTORCH_MALLOC_TUNING=0), and
``dtorch.ops`` indexes every op its modules define."""
import importlib
import inspect
import json
import os
import pkgutil
import subprocess
import sys

import dtorch.ops
from dtorch.ops import Op

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))

# Records every libc call made through ctypes with the files on the stack;
# then re-executes every dtorch.ops module (a side effect at import time
# would run again).
_PROBE = r"""
import ctypes, json, traceback
calls = []


class _Libc:
    def __getattr__(self, name):
        def call(*args):
            stack = [f.filename for f in traceback.extract_stack()[:-1]]
            calls.append({"name": name, "stack": stack})
            return 1
        return call


_real = ctypes.CDLL
ctypes.CDLL = lambda name, *a, **k: (_Libc() if "libc" in str(name)
                                     else _real(name, *a, **k))
import importlib, pkgutil
import dtorch, dtorch.ops
at_import = list(calls)
del calls[:]
for m in pkgutil.iter_modules(dtorch.ops.__path__):
    importlib.reload(importlib.import_module("dtorch.ops." + m.name))
print(json.dumps({"import": at_import, "ops_reload": calls}))
"""


def _probe(**env):
    e = dict(os.environ, **env)
    e.pop("DTORCH_MALLOC_TUNING", None)
    e.update(env)
    out = subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, env=e,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _short(path):
    return os.path.relpath(path, ROOT).replace(os.sep, "/")


def test_malloc_tuned_once_by_import_dtorch_not_by_ops_modules():
    r = _probe()
    if not sys.platform.startswith("linux"):
        assert r["import"] == []
        return
    assert [c["name"] for c in r["import"]] == ["mallopt", "mallopt"]
    for c in r["import"]:
        files = [_short(f) for f in c["stack"]]
        # tune_malloc() in dtorch/_malloc.py, called from dtorch/__init__.py
        assert files[-1] == "dtorch/_malloc.py", files
        assert files[-2] == "dtorch/__init__.py", files
        assert not any(f.startswith("dtorch/ops/") for f in files), files
    assert r["ops_reload"] == []


def test_malloc_tuning_off_leaves_malloc_alone():
    r = _probe(DTORCH_MALLOC_TUNING="0")
    assert r == {"import": [], "ops_reload": []}


def test_tune_malloc_is_an_explicit_call():
    from dtorch._malloc import tune_malloc
    assert tune_malloc() is sys.platform.startswith("linux")


def _op_classes():
    for m in pkgutil.iter_modules(dtorch.ops.__path__):
        mod = importlib.import_module("dtorch.ops." + m.name)
        for name, obj in vars(mod).items():
            if (inspect.isclass(obj) and issubclass(obj, Op) and obj is not Op
                    and obj.__module__ == mod.__name__):
                yield name, obj


def test_every_op_is_indexed_by_dtorch_ops():
    ops = dict(_op_classes())
    assert len(ops) > 50
    missing = sorted(n for n, c in ops.items()
                     if getattr(dtorch.ops, n, None) is not c)
    assert missing == []

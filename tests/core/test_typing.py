"""The typed public API (issue 10 item 7): the packages ship py.typed, and
the annotated functions keep complete annotations that resolve (a misspelt
or unimported name in a postponed annotation only fails when a type checker
or typing.get_type_hints reads it: this test reads them all)."""
import inspect
import os
import typing

import pytest

import collectives
import collectives.tcp
import dtorch
import dtorch.nn as nn
import dtorch.optim as optim

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def test_py_typed_is_shipped():
    tomllib = pytest.importorskip("tomllib")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        data = tomllib.load(f)["tool"]["setuptools"]["package-data"]
    for pkg in ("dtorch", "collectives"):
        assert os.path.isfile(os.path.join(ROOT, pkg, "py.typed"))
        assert "py.typed" in data.get(pkg, []), pkg


def _public_methods(cls):
    """cls's own public methods and __init__ (inherited ones are checked
    on the class that defines them)."""
    out = []
    for name, f in vars(cls).items():
        if isinstance(f, (staticmethod, classmethod)):
            f = f.__func__
        if inspect.isfunction(f) and (not name.startswith("_") or name in (
                "__init__", "__call__", "__getitem__", "__setitem__",
                "__delitem__", "__len__", "__iter__", "__contains__")):
            out.append(f)
    return out


def _typed_api():
    fns = [collectives.init, collectives.discover, collectives.spawn_threads,
           collectives.single_group, collectives.pack, collectives.unpack,
           collectives.bucketize, collectives.get_array_module,
           collectives.env_flag, collectives.env_number,
           collectives.env_choice, collectives.tcp.tcp_group,
           dtorch.save, dtorch.load]
    classes = [collectives.ProcessGroup, collectives.Work,
               collectives.TCPStore, collectives.FlatLayout,
               collectives.CollectiveTimeoutError,
               collectives.CollectiveMismatchError,
               collectives.RankFailureError,
               nn.Module, nn.Sequential, nn.ModuleList, nn.ModuleDict,
               nn.ParameterList, nn.ParameterDict, optim.Optimizer]
    for c in classes:
        fns += _public_methods(c)
    fns += [c.__init__ for c in (
        optim.SGD, optim.Adam, optim.AdamW, optim.Adagrad, optim.Adadelta,
        optim.Adamax, optim.ASGD, optim.NAdam, optim.RAdam, optim.RMSprop,
        optim.Rprop, optim.LBFGS)]
    return fns


@pytest.mark.parametrize("fn", _typed_api(), ids=lambda f: f.__qualname__)
def test_public_api_is_annotated(fn):
    hints = typing.get_type_hints(fn)      # raises on a broken annotation
    params = [p for p in inspect.signature(fn).parameters
              if p not in ("self", "cls")]
    missing = [p for p in params if p not in hints]
    if "return" not in hints:
        missing.append("return")
    assert not missing, f"{fn.__module__}.{fn.__qualname__}: {missing}"

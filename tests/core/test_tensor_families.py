"""Tensor's API by family (issue 30 item 3): dtorch/tensor.py holds the
class core, and every other method lives in exactly one family mixin in
dtorch/_tensor_methods/ (the rule is tensor.py's module docstring)."""
import inspect

import dtorch
from dtorch._tensor_methods._common import methods

_PLUMBING = {"__slots__", "__doc__", "__module__", "__qualname__",
             "__dict__", "__weakref__", "__firstlineno__",
             "__static_attributes__", "__hash__"}


def _families():
    return [c for c in dtorch.Tensor.__mro__[1:]
            if c.__module__.startswith("dtorch._tensor_methods.")]


def test_each_method_is_defined_in_one_family():
    seen = {}
    for cls in _families():
        for name in set(vars(cls)) - _PLUMBING:
            assert name not in seen, (
                f"Tensor.{name} is defined by both {seen[name].__name__} "
                f"and {cls.__name__}")
            seen[name] = cls
    # what the class body itself defines overrides no family method,
    # except the numpy-alias wrappers that tensor.py puts over them
    over = set(vars(dtorch.Tensor)) & set(seen)
    for name in over:
        fn = vars(dtorch.Tensor)[name]
        assert getattr(fn, "__wrapped__", None) is getattr(
            seen[name], name), f"tensor.py redefines Tensor.{name}"
    assert len(seen) > 300


def test_families_add_no_instance_state():
    # empty __slots__: a tensor's layout is Tensor's own slots
    for cls in _families():
        assert vars(cls).get("__slots__") == (), cls
    t = dtorch.ones(2)
    assert not hasattr(t, "__dict__") or t.__dict__ == {}
    # __eq__ is elementwise (maths family), hashing stays by identity
    assert {t: 1}[t] == 1 and hash(t) == hash(t)


def test_methods_binds_module_functions_and_refuses_a_double():
    ns = {"__name__": __name__}
    exec("def twice(self):\n    return 2 * self\n", ns)
    globals()["twice"] = ns["twice"]
    try:
        C = methods("twice")(type("C", (), {"__module__": __name__}))
        assert C.twice(3) == 6 and inspect.isfunction(vars(C)["twice"])
        D = type("D", (), {"__module__": __name__, "twice": lambda s: 0})
        try:
            methods("twice")(D)
        except TypeError as e:
            assert "D.twice is defined twice" in str(e)
        else:
            raise AssertionError("a double definition passed")
    finally:
        del globals()["twice"]

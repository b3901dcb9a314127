"""Issue 10 item 2: the core's dependencies are explicit and point down.

- dtorch/tensor.py, the Tensor method families (dtorch/_tensor_methods) and
  nn.functional's families (dtorch/nn/_functional) import what they use at
  the top: no function-local import of a dtorch module (they hid the circle
  tensor <-> _creation <-> nn.functional);
- autograd knows Tensor only through its TensorBase protocol: no module
  assigns into autograd at import, and the tensors autograd makes (results,
  .grad, hook arguments, custom Functions' gradients) come from ``_make`` of
  the tensors it was given.
(The layer rules themselves are tests/project/test_layering.py.)
"""
import ast
import glob
import os

import numpy as np
import pytest

import dtorch
from dtorch.autograd import function as _function

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def _local_dtorch_imports(path):
    """(line, text) of each import of a dtorch module inside a function."""
    tree = ast.parse(open(path).read())
    out = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.ImportFrom) and (
                    node.level > 0 or (node.module or "").startswith(
                        "dtorch")):
                out.append((node.lineno, ast.unparse(node)))
            elif isinstance(node, ast.Import) and any(
                    a.name.startswith("dtorch") for a in node.names):
                out.append((node.lineno, ast.unparse(node)))
    return out


CORE_FILES = (["dtorch/tensor.py", "dtorch/_creation.py"]
              + sorted(glob.glob(os.path.join(ROOT, "dtorch/_tensor_methods",
                                              "*.py")))
              + sorted(glob.glob(os.path.join(ROOT, "dtorch/nn/_functional",
                                              "*.py")))
              + ["dtorch/nn/functional.py"])


@pytest.mark.parametrize("path", CORE_FILES,
                         ids=lambda p: os.path.relpath(p, ROOT)
                         if os.path.isabs(p) else p)
def test_core_modules_import_at_the_top(path):
    found = _local_dtorch_imports(os.path.join(ROOT, path))
    assert not found, (f"{path}: function-local imports of dtorch modules "
                       f"(import at the top, pointing down): {found}")


def test_autograd_has_no_injected_tensor_class():
    # tensor.py used to set autograd.function._Tensor at import
    assert not hasattr(_function, "_Tensor")
    assert issubclass(dtorch.Tensor, _function.TensorBase)
    src = open(os.path.join(ROOT, "dtorch/tensor.py")).read()
    assert "_function._" not in src.replace("_function.TensorBase", "")


def test_results_grads_and_hook_arguments_are_plain_tensors():
    w = dtorch.nn.Parameter(dtorch.ones(3, dtype=dtorch.float64))
    seen = []
    h = w.register_hook(lambda g: seen.append(type(g)) or g * 2)
    y = w * 3.0                       # an op on a Parameter
    assert type(y) is dtorch.Tensor
    seen_y = []
    y.register_hook(lambda g: seen_y.append(type(g)))   # None: keep g
    y.sum().backward()
    assert type(w.grad) is dtorch.Tensor
    np.testing.assert_array_equal(w.grad.numpy(), [6.0, 6.0, 6.0])
    assert seen == [dtorch.Tensor] and seen_y == [dtorch.Tensor]
    h.remove()                        # the handle removes the stored hook
    w.grad = None
    (w * 3.0).sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), [3.0, 3.0, 3.0])
    assert len(seen) == 1


def test_custom_function_backward_gets_tensors():
    class Twice(dtorch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            assert type(g) is dtorch.Tensor
            return g * 2

    x = dtorch.nn.Parameter(dtorch.ones(2, dtype=dtorch.float64))
    Twice.apply(x).sum().backward()
    assert type(x.grad) is dtorch.Tensor
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 2.0])


def test_op_without_a_tensor_argument_names_the_problem():
    with pytest.raises(TypeError, match="Add.apply.*tensor argument"):
        dtorch.ops.Add.apply(np.ones(2), np.ones(2))


def test_tensor_softmax_is_nn_functional_softmax():
    x = dtorch.randn(3, 4, dtype=dtorch.float64, requires_grad=True)
    for m, f in ((x.softmax, dtorch.nn.functional.softmax),
                 (x.log_softmax, dtorch.nn.functional.log_softmax)):
        np.testing.assert_array_equal(m(1).detach().numpy(),
                                      f(x, 1).detach().numpy())
        assert m(1, dtype=dtorch.float32).dtype == dtorch.float32
    assert dtorch.tensor(2.0).softmax(0).item() == 1.0     # 0-d
    assert dtorch.autograd.gradcheck(lambda t: t.log_softmax(0), (x,))

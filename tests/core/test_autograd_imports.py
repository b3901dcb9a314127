"""autograd's modules import each other at module level: no function-local
import hides a dependency (functional/gradcheck took ``grad`` from the
package __init__ inside their functions, because __init__ imports them)."""
import ast
import os

import dtorch.autograd

HERE = os.path.dirname(dtorch.autograd.__file__)


def _local_imports(path):
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    out = []
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and node.level == 1:
                    out.append(f"{os.path.basename(path)}:{node.lineno}")
    return out


def test_no_function_local_imports_within_autograd():
    bad = [x for f in sorted(os.listdir(HERE)) if f.endswith(".py")
           for x in _local_imports(os.path.join(HERE, f))]
    assert not bad, bad


def test_grad_is_one_function_everywhere():
    import sys
    # the package's `gradcheck` attribute is the function: the module by name
    mods = sys.modules
    assert mods["dtorch.autograd.functional"].grad is dtorch.autograd.grad
    assert mods["dtorch.autograd.gradcheck"]._grad is dtorch.autograd.grad

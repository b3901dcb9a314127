"""The test suite's layout (issue 30 item 5): every test file lives in one
of the packages below, file names are unique across them (pytest imports
test modules by file name: tests/conftest.py), the packages have no
__init__.py, and only the shared modules stay directly in tests/."""
import os

import pytest

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = {"amp", "collectives", "core", "data", "distributed", "examples",
            "launch", "nn", "optim", "project", "serialization", "tools"}
SHARED = {"conftest.py", "helpers.py", "torch_oracle.py", "opinfo_table.py",
          "collectives_helpers.py", "netns_nodes.py", "run.sh", "fakecupy",
          "launch_scripts", "__pycache__"}


def _test_files():
    for d in sorted(PACKAGES):
        for f in sorted(os.listdir(os.path.join(TESTS, d))):
            if f.startswith("test_") and f.endswith(".py"):
                yield d, f


def test_no_test_file_directly_in_tests():
    loose = sorted(set(os.listdir(TESTS)) - SHARED - PACKAGES)
    assert not loose, (f"not in a package of tests/ ({sorted(PACKAGES)}): "
                       f"{loose}")


def test_test_file_names_are_unique_across_packages():
    seen = {}
    for d, f in _test_files():
        seen.setdefault(f, []).append(d)
    dup = {f: ds for f, ds in seen.items() if len(ds) > 1}
    assert not dup, f"one file name in several packages: {dup}"


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_package_is_a_plain_directory(package):
    # an __init__.py would make tests/collectives shadow collectives/
    assert not os.path.exists(os.path.join(TESTS, package, "__init__.py"))
    assert any(d == package for d, _ in _test_files())


def test_scripts_that_put_tests_on_the_path_put_the_checkout_too():
    """tests/collectives and tests/launch are namespace directories: a test
    file run as a rank script with tests/ on sys.path but not the checkout
    imports them as `collectives` / `launch` under an editable install (its
    finder comes after sys.path): every rank of CI's fresh install failed
    with "cannot import name ... from 'collectives' (unknown location)"."""
    bad = []
    for d, f in _test_files():
        src = open(os.path.join(TESTS, d, f)).read()
        if "__main__" in src and "sys.path" in src and \
                "os.path.dirname(_TESTS)" not in src and \
                "sys.path.insert(0, ROOT)" not in src and \
                "os.path.dirname(TESTS)" not in src:
            bad.append(f"{d}/{f}")
    assert not bad, bad

"""The examples' optional packages: import one, or stop with the line that
installs it (the pyproject extra, from this clone)."""
import importlib
import os

_CLONE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def require(module, package, extra, need):
    """``import module`` (pip name ``package``); when it is not installed,
    exit saying what ``need``s it and to install the ``extra``."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != module.split(".")[0]:      # broken inside, not missing
            raise
        raise SystemExit(
            f"{need} needs {package} (module {e.name!r} is not installed): "
            f'pip install -e "{_CLONE}[{extra}]"   '
            f"(the '{extra}' extra of this dtorch clone)") from None

"""Makes dtorch a backend that einops finds, without importing einops.

einops picks a backend among the subclasses of its ``AbstractBackend``
whose ``framework_name`` module is imported, so dtorch's subclass
(``dtorch._einops``) must exist once einops runs, and defining it means
importing einops. ``install()`` (called by ``import dtorch``) therefore
defines it at once when einops is already imported; when einops is
installed but not imported it puts a one-shot finder on ``sys.meta_path``
that defines it right after einops is first imported, then removes itself
(the one process-wide change an ``import dtorch`` makes besides the malloc
tuning). Without einops installed it does nothing. Cost measured: one
``find_spec`` (~0.1 ms) at ``import dtorch``, no einops import.
"""
import importlib.util
import sys


def _register():
    try:
        import dtorch._einops  # noqa: F401  (defines the backend class)
    except Exception as e:     # an einops whose internals moved
        import warnings
        warnings.warn(f"dtorch could not register itself as an einops "
                      f"backend ({type(e).__name__}: {e}); einops will not "
                      f"recognise dtorch tensors")


class _AfterEinops:
    """A meta-path finder for the name 'einops' only: it lets the normal
    finders load einops and runs _register after the module executed."""

    def find_spec(self, name, path=None, target=None):
        if name != "einops":
            return None
        _uninstall()
        # the other finders (this one is gone) locate einops as usual
        spec = importlib.util.find_spec(name)
        if spec is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_then_register(module):
            exec_module(module)
            _register()
        loader.exec_module = exec_then_register
        return spec


_finder = _AfterEinops()


def _uninstall():
    try:
        sys.meta_path.remove(_finder)
    except ValueError:
        pass


def install():
    if sys.modules.get("einops") is not None:
        _register()
    elif _finder not in sys.meta_path and \
            importlib.util.find_spec("einops") is not None:
        sys.meta_path.insert(0, _finder)

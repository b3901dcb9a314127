"""``dtorch.backends.cudnn``: cuDNN's flags. dtorch does not use cuDNN
(convolutions are im2col + GEMM on NumPy/CuPy); ``is_available()`` is
False and the flags only record what a script set."""
enabled = True
benchmark = False
benchmark_limit = 10
deterministic = False
allow_tf32 = True


def is_available():
    return False


def version():
    return None


class flags:
    """``with dtorch.backends.cudnn.flags(enabled=False):`` sets the flags
    for the block and restores them after."""

    def __init__(self, enabled=False, benchmark=False, benchmark_limit=10,
                 deterministic=False, allow_tf32=True):
        self.new = dict(enabled=enabled, benchmark=benchmark,
                        benchmark_limit=benchmark_limit,
                        deterministic=deterministic, allow_tf32=allow_tf32)
        self.old = None

    def __enter__(self):
        g = globals()
        self.old = {k: g[k] for k in self.new}
        g.update(self.new)
        return self

    def __exit__(self, *exc):
        globals().update(self.old)
        return False

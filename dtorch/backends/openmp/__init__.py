"""``dtorch.backends.openmp``: whether the BLAS runs OpenMP threads."""


def is_available():
    return False

"""``dtorch.backends.mps``: Apple's Metal backend, which dtorch does not
have."""


def is_available():
    return False


def is_built():
    return False

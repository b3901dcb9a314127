"""``dtorch.backends.mkldnn``: oneDNN, which dtorch does not use."""
enabled = False


def is_available():
    return False

"""The slot through which a dtorch.compile capture (dtorch/_compile)
sees what happens outside ops, and the two helpers that report to it.
A module of its own so that the autograd core does not carry the
compiler's hooks; layer 1 (beside autograd.function), it imports nothing
of dtorch."""
import functools


# While a dtorch.compile capture runs (in any thread), its tracer
# (dtorch/_compile/trace.py), else None. Ops reach it through the recorder
# chain (rank 4); what happens outside ops reaches it here: Tensor methods
# that read values to the host (.item(), .tolist(), bool(), .numpy()) call
# active.host_read(tensor, what), Tensor._bump_version (an in-place
# change) calls active.mutated(tensor), and a function marked
# ``array_source`` runs as active.source(fn, args, kwargs), which records
# it so that a replay calls it again.
active = None


def array_source(fn):
    """Decorator: ``fn`` makes an untracked array or tensor outside ops,
    from its arguments (tensors' values and metadata) and the RNG state
    alone: a comparison, a random draw (dropout's mask). A dtorch.compile
    replay calls it again (fresh random numbers, current values) instead
    of reusing what the capture saw."""
    @functools.wraps(fn)
    def source(*args, **kwargs):
        if active is not None:
            return active.source(fn, args, kwargs)
        return fn(*args, **kwargs)
    return source


def array_copy(a, requires_grad):
    """``a.copy()`` for the old value an in-place op on a tracked tensor
    keeps (Tensor._rebase): a capture records it as a step whose gradient
    passes through to ``a``."""
    out = a.copy()
    if active is not None:
        active.copied(a, out, requires_grad)
    return out

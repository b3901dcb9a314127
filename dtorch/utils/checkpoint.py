"""``dtorch.utils.checkpoint``: activation checkpointing's API.

``checkpoint(fn, *args)`` returns what ``fn(*args)`` returns, with the same
gradients; dtorch keeps the activations instead of recomputing them in
backward, so the call trades no memory for time (results are identical)."""

__all__ = ["checkpoint", "checkpoint_sequential"]


def checkpoint(function, *args, use_reentrant=None, context_fn=None,
               determinism_check="default", debug=False,
               preserve_rng_state=True, **kwargs):
    return function(*args, **kwargs)


def checkpoint_sequential(functions, segments, input, use_reentrant=None,
                          **kwargs):
    mods = list(functions.children()) if hasattr(functions, "children") \
        else list(functions)
    for m in mods:
        input = m(input)
    return input

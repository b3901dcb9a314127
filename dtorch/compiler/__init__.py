"""``torch.compiler`` for dtorch: the compiler's controls and its report
(the compiler itself is ``dtorch._compile``; ``dtorch.compile`` is its entry
point).

- ``reset()``: every compiled callable forgets its captures.
- ``explain(fn_or_compiled)``: captures, programs, graph breaks, recaptures,
  eager fallbacks with their reasons (torch._dynamo.explain's shape) and
  the fused elementwise groups.
- ``config.cache_size_limit`` (8, torch's): guard keys kept per callable;
  ``config.disable``: run everything eagerly.
- ``counters``: totals since the last reset (captures, programs, replays,
  recaptures, fallbacks, breaks, segments, fused).
- ``disable(fn)``, ``is_compiling()``, ``Unsupported`` (the error a graph
  break raises under ``fullgraph=True``).
"""
from .._compile import (Unsupported, config, counters, disable,  # noqa: F401
                        explain, ExplainOutput, is_compiling, reset)

__all__ = ["reset", "explain", "ExplainOutput", "config", "counters",
           "disable", "is_compiling", "Unsupported"]

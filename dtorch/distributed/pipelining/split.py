"""Cutting a model into pipeline stages.

dtorch does not trace programs, so the splitter needs a model whose forward
is a chain of blocks: an ``nn.Sequential``, or a module whose forward calls
its children one after the other in registration order, each on the
previous one's output (children that are ``nn.Sequential`` or
``nn.ModuleList`` are chains of their own children). That is the shape of
most deep models: embedding, N transformer blocks, final norm, head.

``pipeline(module, mb_args, split_spec={"blocks.4": SplitPoint.BEGINNING})``
cuts the chain before block 4 (PyTorch's spelling); ``split_spec`` may also
be a list of block numbers in the flattened chain. With ``mb_args`` the
chain is run once against ``module(*mb_args)`` to check that the module
really is that chain. Each stage module keeps the original parameter names
(``blocks.4.attn.q.weight``), so the stages' state dicts together are the
model's. A parameter used by blocks of two stages (a head tied to the
embedding) is held by both; their gradients are summed after backward.
"""
import enum

import dtorch
from dtorch import nn

from .stage import PipelineStage


class SplitPoint(enum.Enum):
    """Cut before (BEGINNING) or after (END) the named block."""
    BEGINNING = 1
    END = 2


def chain_blocks(module):
    """[(qualified name, block)] of the chain ``module``'s forward runs."""
    out = []

    def walk(m, prefix):
        for name, child in m.named_children():
            q = prefix + name
            if isinstance(child, (nn.Sequential, nn.ModuleList)):
                walk(child, q + ".")
            else:
                out.append((q, child))
    walk(module, "")
    if not out:
        raise ValueError(f"{type(module).__name__} has no child modules "
                         f"to split into pipeline stages")
    return out


class _StageModule(nn.Module):
    """A run of consecutive blocks, registered under their original paths
    (so names, state_dict keys and checkpoints match the whole model)."""

    def __init__(self, blocks):
        super().__init__()
        self._order = [name for name, _ in blocks]
        for name, block in blocks:
            parent = self
            *path, leaf = name.split(".")
            for part in path:
                if part not in parent._modules:
                    parent.add_module(part, nn.Module())
                parent = parent._modules[part]
            parent.add_module(leaf, block)

    def forward(self, *args, **kwargs):
        x = args
        for i, name in enumerate(self._order):
            block = self.get_submodule(name)
            x = block(*x, **(kwargs if i == 0 else {}))
            x = tuple(x) if isinstance(x, (tuple, list)) else (x,)
        return x[0] if len(x) == 1 else x

    def extra_repr(self):
        return f"blocks {self._order[0]} .. {self._order[-1]}"


class Pipe:
    """A model cut into stages: ``num_stages``, ``get_stage_module(i)``,
    ``build_stage(i, device, group)``, ``split_points`` (the flattened
    block numbers each stage starts at) and ``tied_parameters(i)``."""

    def __init__(self, module, blocks, starts):
        self.module = module
        self.split_points = list(starts)
        bounds = list(starts) + [len(blocks)]
        self._stages = [_StageModule(blocks[a:b])
                        for a, b in zip(bounds, bounds[1:])]
        self.num_stages = len(self._stages)
        # a parameter object in several stages: tied (e.g. embedding/head)
        where = {}
        for i, sm in enumerate(self._stages):
            for p in sm.parameters():
                where.setdefault(id(p), []).append(i)
        self._tied = {i: [(p, where[id(p)]) for p in sm.parameters()
                          if len(where[id(p)]) > 1]
                      for i, sm in enumerate(self._stages)}

    def get_stage_module(self, stage_index):
        self._check(stage_index)
        return self._stages[stage_index]

    def tied_parameters(self, stage_index):
        """[(parameter, stage indices holding it)] of this stage's
        parameters that other stages hold too."""
        self._check(stage_index)
        return list(self._tied[stage_index])

    def build_stage(self, stage_index, device, group=None):
        """The ``PipelineStage`` of ``stage_index``, its module moved to
        ``device``."""
        sm = self.get_stage_module(stage_index).to(device)
        return PipelineStage(sm, stage_index, self.num_stages, device,
                             group=group,
                             tied_parameters=self.tied_parameters(
                                 stage_index))

    def _check(self, i):
        if not 0 <= int(i) < self.num_stages:
            raise ValueError(f"stage_index {i} is out of range for "
                             f"{self.num_stages} stages")

    def __repr__(self):
        body = "\n".join(f"  stage {i}: {sm.extra_repr()}"
                         for i, sm in enumerate(self._stages))
        return f"Pipe({self.num_stages} stages\n{body})"


def _starts_from_spec(blocks, split_spec):
    names = [n for n, _ in blocks]
    n = len(names)
    if split_spec is None:
        return [0]
    starts = set()
    if isinstance(split_spec, dict):
        for key, point in split_spec.items():
            if not isinstance(point, SplitPoint):
                raise TypeError(f"split_spec[{key!r}] must be a SplitPoint,"
                                f" got {point!r}")
            hit = [i for i, q in enumerate(names)
                   if q == key or q.startswith(key + ".")]
            if not hit:
                raise ValueError(
                    f"split_spec names {key!r}, which is not a block of the "
                    f"chain (blocks: {', '.join(names)})")
            starts.add(hit[0] if point is SplitPoint.BEGINNING
                       else hit[-1] + 1)
    else:
        for i in split_spec:
            if isinstance(i, bool) or not isinstance(i, int):
                raise TypeError(f"split points must be block numbers, got "
                                f"{i!r}")
            starts.add(i)
    bad = sorted(i for i in starts if not 0 < i < n)
    if bad:
        raise ValueError(
            f"split points {bad} would leave a stage without blocks: cut "
            f"strictly between blocks 1 and {n - 1} of the chain "
            f"({', '.join(names)})")
    return [0] + sorted(starts)


def pipeline(module, mb_args=None, mb_kwargs=None, split_spec=None):
    """Cut ``module`` (a chain of blocks, see the module docstring) at
    ``split_spec``; returns a ``Pipe``. ``mb_args``: an example
    micro-batch; when given, the chain's output is checked against
    ``module(*mb_args)``."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"pipeline() splits an nn.Module, got "
                        f"{type(module).__name__}")
    blocks = chain_blocks(module)
    pipe = Pipe(module, blocks, _starts_from_spec(blocks, split_spec))
    if mb_args is not None:
        _check_chain(module, blocks, tuple(mb_args), dict(mb_kwargs or {}))
    return pipe


def _check_chain(module, blocks, args, kwargs):
    modes = [(m, m.training) for m in module.modules()]
    module.eval()        # no dropout: both runs must be comparable
    try:
        with dtorch.no_grad():
            want = module(*args, **kwargs)
            got = _StageModule.forward(_Chain(blocks), *args, **kwargs)
    finally:
        for m, t in modes:
            m.training = t
    w = want if isinstance(want, (tuple, list)) else (want,)
    g = got if isinstance(got, (tuple, list)) else (got,)
    same = len(w) == len(g) and all(
        isinstance(a, dtorch.Tensor) and isinstance(b, dtorch.Tensor)
        and a.shape == b.shape and dtorch.allclose(a, b)
        for a, b in zip(w, g))
    if not same:
        raise ValueError(
            f"pipeline(): {type(module).__name__}'s forward is not the "
            f"chain of its blocks ({', '.join(n for n, _ in blocks)}) "
            f"run in order on mb_args; split only modules whose forward "
            f"is that chain (or pass an nn.Sequential)")


class _Chain:
    """The blocks of the whole module as one chain (for the check)."""

    def __init__(self, blocks):
        self._order = [n for n, _ in blocks]
        self._by = dict(blocks)

    def get_submodule(self, name):
        return self._by[name]

"""einsum, forward and backward side by side.

The gradient of operand i is itself an einsum: the output gradient
contracted with the other operands onto operand i's letters. Letters that
only operand i has (summed away in forward) come back by broadcasting, and a
letter repeated within operand i (a diagonal, ``'ii->i'``) is written back on
that diagonal.
"""
import string

from .._backend import get_array_module
from .base import Op, promote, float32_compute, unbroadcast, grad_xp
from .index import SetIndex

_LETTERS = string.ascii_letters


def parse(equation, shapes):
    """Explicit subscripts: a list of operand letter strings and the
    output's, with '...' spelled out as letters."""
    eq = equation.replace(" ", "")
    if "->" in eq:
        lhs, out = eq.split("->")
    else:
        lhs, out = eq, None
    ins = lhs.split(",")
    if len(ins) != len(shapes):
        raise RuntimeError(f"einsum(): more operands were provided than "
                           f"specified in the equation" if len(shapes) >
                           len(ins) else "einsum(): fewer operands were "
                           "provided than specified in the equation")
    used = set(c for c in eq if c.isalpha())
    free = [c for c in _LETTERS if c not in used]
    ell_n = 0
    for sub, shp in zip(ins, shapes):
        if "..." in sub:
            ell_n = max(ell_n, len(shp) - (len(sub) - 3))
    ell = "".join(free[:ell_n])
    res = []
    for sub, shp in zip(ins, shapes):
        if "..." in sub:
            k = len(shp) - (len(sub) - 3)
            sub = sub.replace("...", ell[ell_n - k:] if k else "")
        if len(sub) != len(shp):
            raise RuntimeError(
                f"einsum(): the number of subscripts in the equation "
                f"({len(sub)}) does not match the number of dimensions "
                f"({len(shp)}) for operand {len(res)}")
        res.append(sub)
    if out is None:
        counts = {}
        for sub in res:
            for c in sub:
                counts[c] = counts.get(c, 0) + 1
        out = ell + "".join(sorted(c for c, n in counts.items()
                                   if n == 1 and c not in ell))
    else:
        out = out.replace("...", ell)
    return res, out


@float32_compute
class Einsum(Op):
    @staticmethod
    def forward(ctx, *xs, equation=""):
        xp = get_array_module(*xs)
        if len(xs) == 2:
            a, b = promote(xs[0], xs[1], "einsum")
            xs = (a, b)
        subs, out = parse(equation, [x.shape for x in xs])
        ctx.subs, ctx.out = subs, out
        ctx.save_for_backward(*xs)
        sizes = {}
        for s, x in zip(subs, xs):
            for c, n in zip(s, x.shape):
                sizes[c] = n
        ctx.sizes = sizes
        return xp.einsum(",".join(subs) + "->" + out, *xs, optimize=True)

    @staticmethod
    def backward(ctx, g):
        xs = ctx.to_save
        xp = grad_xp(g)
        grads = []
        for i, need in enumerate(ctx.needs_input_grad[:len(xs)]):
            if not need:
                grads.append(None)
                continue
            sub = ctx.subs[i]
            uniq = "".join(dict.fromkeys(sub))
            others = [(s, ctx.input(j, x)) for j, (s, x) in
                      enumerate(zip(ctx.subs, xs)) if j != i]
            avail = set(ctx.out).union(*[set(s) for s, _ in others])
            keep = "".join(c for c in uniq if c in avail)
            eq = ",".join([ctx.out] + [s for s, _ in others]) + "->" + keep
            gi = xp.einsum(eq, g, *[x for _, x in others], optimize=True)
            # letters summed away in forward only: broadcast back
            full = tuple(ctx.sizes[c] for c in uniq)
            view = tuple(ctx.sizes[c] if c in keep else 1 for c in uniq)
            gi = xp.broadcast_to(gi.reshape(view), full)
            if len(uniq) != len(sub):
                gi = _undiagonal(xp, gi, uniq, sub, ctx.sizes)
            # (ascontiguousarray makes a 0-d operand's gradient 1-d)
            gi = xp.ascontiguousarray(gi).reshape(gi.shape)
            grads.append(unbroadcast(gi, xs[i].shape, xs[i].dtype))
        return tuple(grads)


def _undiagonal(xp, gi, uniq, sub, sizes):
    """Place gi (indexed by the unique letters) on the diagonals of an
    array indexed by ``sub`` (with repeats); zeros elsewhere. In place on
    an array; a gradient tensor under create_graph goes there by SetIndex
    (no tensor is written in place)."""
    shape = tuple(sizes[c] for c in sub)
    grids = get_array_module(getattr(gi, "_data", gi)).indices(
        gi.shape, sparse=True)
    key = tuple(grids[uniq.index(c)] for c in sub)
    out = xp.zeros(shape, gi.dtype)
    if hasattr(gi, "_make"):
        return SetIndex.apply(out, gi, key=key)
    out[key] = gi
    return out

"""``dtorch.utils.flop_counter``: FLOPs of the forward and backward passes
(``torch.utils.flop_counter``).

::

    from dtorch.utils.flop_counter import FlopCounterMode
    with FlopCounterMode(display=False) as fc:
        model(x).sum().backward()
    fc.get_total_flops()        # int
    fc.get_flop_counts()        # {'Global': {'aten.mm': n, ...}, 'Net.fc1': ...}
    print(fc.get_table())

What is counted is what PyTorch's counter counts, with its formulas: the
matrix products (``aten.mm`` / ``aten.addmm`` / ``aten.bmm``: 2 x m x n x k;
a bias add is not counted), convolutions (``aten.convolution``, and
``aten.convolution_backward`` for the gradients that are computed),
attention (``aten._scaled_dot_product_flash_attention`` and its backward)
and two-operand einsums (as the bmm PyTorch lowers them to). Elementwise
ops, reductions and matrix-vector products count nothing, as in PyTorch.
Module names are PyTorch's too: the outermost module by its class, children
by their attribute path (``Net.layers.0``), and ``Global`` for everything.

Where the counts differ from PyTorch's on the CPU, and why:
- attention: PyTorch's CPU kernel is not in its registry, so it counts 0
  (its CUDA kernels are counted with the formula used here); its math
  backend (``sdpa_kernel(SDPBackend.MATH)``) counts the same numbers as
  bmm's.
- recurrent layers: PyTorch's fused CPU/cuDNN kernels count 0. dtorch runs
  an RNN as an input projection (a Linear op, counted as such) and the
  recurrent products h @ W_hh^T, counted here as the per-step ``aten.addmm``
  (``aten.mm`` without bias) of PyTorch's unfused implementation.
- Conv3d runs as an einsum over windows here, so it is counted as
  ``aten.bmm`` with the convolution's FLOPs.

Backward FLOPs are counted when a node runs, for the inputs that needed a
gradient, and attributed to the modules the forward op ran in (PyTorch's
tracker, driven by gradient hooks, also adds a sibling's backward to modules
that share an input, such as the q, k and v projections of one attention;
totals are the same). Under
``create_graph=True`` the backward's own ops are counted as they run.

Counting is per thread (as PyTorch's dispatch modes): each rank of a
``spawn_threads`` job counts its own ops. While no counter is open the only
cost is the one hook check ``Function.apply`` already makes.
"""
import math
import threading
import weakref
from collections import defaultdict

from ..autograd import function as _function
from ..autograd.function import TensorBase
from ..autograd.grad_mode import _state as _grad_state
from ..nn.modules import module as _module
from .. import ops as _ops

__all__ = ["FlopCounterMode", "register_flop_formula", "mm_flop",
           "bmm_flop", "conv_flop_count", "sdpa_flop_count",
           "get_suffix_str", "convert_num_with_suffix"]

# --------------------------------------------------------------- formulas --


def mm_flop(m, k, n):
    """FLOPs of an (m, k) @ (k, n) product: 2 m n k."""
    return 2 * m * k * n


def bmm_flop(b, m, k, n):
    return 2 * b * m * k * n


def conv_flop_count(x_shape, w_shape, out_shape, transposed=False):
    """PyTorch's convolution count: 2 x batch x C_out x C_in/groups x
    kernel x (output positions; input positions when transposed)."""
    conv_shape = (x_shape if transposed else out_shape)[2:]
    return 2 * x_shape[0] * math.prod(w_shape) * math.prod(conv_shape)


def _conv_backward_flop(x_shape, w_shape, out_shape, transposed,
                        need_input, need_weight):
    """PyTorch's convolution_backward count: the input gradient is a
    convolution of the output gradient with the weight; the weight
    gradient one of the input with the output gradient, batch and channel
    axes swapped (so a grouped convolution's weight gradient counts groups
    times its forward, as PyTorch counts it)."""
    def t(s):
        return [s[1], s[0]] + list(s[2:])
    flops = 0
    if need_input:
        flops += conv_flop_count(out_shape, w_shape, x_shape,
                                 not transposed)
    if need_weight:
        if transposed:
            flops += conv_flop_count(t(out_shape), t(x_shape), t(w_shape))
        else:
            flops += conv_flop_count(t(x_shape), t(out_shape), t(w_shape))
    return flops


def sdpa_flop_count(q_shape, k_shape, v_shape):
    """Attention's two batched products: scores (L x E @ E x S) and the
    weighted sum (L x S @ S x Ev), per batch x head; a causal mask is not
    discounted (as PyTorch)."""
    *lead, L, E = q_shape
    S, Ev = k_shape[-2], v_shape[-1]
    b = math.prod(lead)
    return bmm_flop(b, L, E, S) + bmm_flop(b, L, S, Ev)


def _rows(shape):
    return math.prod(shape[:-1])


def _matmul(x, y):
    """matmul as PyTorch lowers it: (key, FLOPs) of the mm / bmm it calls,
    or None for the dot and matrix-vector forms, which PyTorch does not
    count."""
    if y.ndim == 1:
        return None                                   # dot, mv
    k, n = y.shape[-2:]
    if x.ndim == 1:
        m, batch = 1, y.shape[:-2]
    else:
        m = x.shape[-2]
        batch = tuple(x.shape[:-2])
        if y.ndim == 2:                               # folded into one mm
            return "aten.mm", mm_flop(_rows(x.shape), k, n)
        if len(y.shape) - 2 > len(batch):
            batch = (1,) * (y.ndim - 2 - len(batch)) + batch
        ybatch = (1,) * (len(batch) - (y.ndim - 2)) + tuple(y.shape[:-2])
        batch = tuple(max(a, b) for a, b in zip(batch, ybatch))
    if not batch:
        return "aten.mm", mm_flop(m, k, n)
    return "aten.bmm", bmm_flop(math.prod(batch), m, k, n)


def _einsum_flops(shapes, equation):
    """A two-operand einsum is one bmm: 2 x the product of every letter
    that survives into the contraction (letters only one operand has and
    the output lacks are summed away first, as PyTorch does)."""
    if len(shapes) != 2:
        return 0
    (sa, sb), out = _ops.einsum.parse(equation, shapes)
    size = {}
    for sub, shape in zip((sa, sb), shapes):
        size.update(zip(sub, shape))
    kept = [c for c in size if (c in sa and c in sb) or c in out]
    return 2 * math.prod(size[c] for c in kept)


def _shape(a):
    return tuple(a.shape) if isinstance(a, TensorBase) else None


# Each formula: (args, kwargs, out, need) -> [(key, forward FLOPs)],
# [(key, backward FLOPs)]; ``need`` is the op's needs_input_grad (None when
# no graph was recorded). Keyed by dtorch's op classes.

def _f_matmul(args, kwargs, out, need):
    x, y = args[0], args[1]
    got = _matmul(x, y)
    if got is None:
        return [], []
    key, f = got
    nb = sum(bool(n) for n in need[:2]) if need else 0
    return [(key, f)], [(key, f * nb)] if nb else []


def _f_linear(args, kwargs, out, need):
    x, w = args[0], args[1]
    b = args[2] if len(args) > 2 else kwargs.get("b")
    f = mm_flop(_rows(x.shape), w.shape[1], w.shape[0])
    key = "aten.addmm" if b is not None and x.ndim > 1 else "aten.mm"
    nb = sum(bool(n) for n in need[:2]) if need else 0
    return [(key, f)], [("aten.mm", f * nb)] if nb else []


def _conv(transposed):
    def formula(args, kwargs, out, need):
        x, w = _shape(args[0]), _shape(args[1])
        o = _shape(out)
        f = conv_flop_count(x, w, o, transposed)
        bw = []
        if need and (need[0] or need[1]):
            bw = [("aten.convolution_backward", _conv_backward_flop(
                x, w, o, transposed, need[0], need[1]))]
        return [("aten.convolution", f)], bw
    return formula


def _f_sdpa(args, kwargs, out, need):
    q, k, v = (_shape(a) for a in args[:3])
    f = sdpa_flop_count(q, k, v)
    key = "aten._scaled_dot_product_flash_attention"
    bw = [(key + "_backward", 2 * f)] if need and any(need[:3]) else []
    return [(key, f)], bw


def _recurrent(w_index, b_index):
    """The recurrent products of an RNN/LSTM/GRU layer op: one
    (n, H) @ (H, G*H) product per time step (the input projection is a
    Linear op of its own); backward: the hidden-state gradient always, the
    weight gradient when W_hh needs one."""
    def formula(args, kwargs, out, need):
        xw, w = args[0], args[w_index]
        b = args[b_index] if len(args) > b_index else kwargs.get("b_hh")
        T, n = xw.shape[0], _rows(xw.shape[1:])
        f = T * mm_flop(n, w.shape[1], w.shape[0])
        key = "aten.addmm" if b is not None else "aten.mm"
        bw = []
        if need and any(need):
            bw = [("aten.mm", f * (1 + bool(need[w_index])))]
        return [(key, f)], bw
    return formula


def _f_einsum(args, kwargs, out, need):
    f = _einsum_flops([a.shape for a in args], kwargs.get("equation", ""))
    if not f:
        return [], []
    nb = sum(bool(n) for n in need[:len(args)]) if need else 0
    return [("aten.bmm", f)], [("aten.bmm", f * nb)] if nb else []


_FORMULAS = {
    _ops.matmul.MatMul: _f_matmul,
    _ops.matmul.Linear: _f_linear,
    _ops.conv.Conv2d: _conv(False),
    _ops.conv.ConvTranspose2d: _conv(True),
    _ops.attention.ScaledDotProductAttention: _f_sdpa,
    _ops.rnn.RNNLayer: _recurrent(2, 3),
    _ops.rnn.LSTMLayer: _recurrent(3, 4),
    _ops.rnn.GRULayer: _recurrent(2, 3),
    _ops.einsum.Einsum: _f_einsum,
}


def register_flop_formula(op_class, formula=None):
    """Count ``op_class`` (a dtorch op or a user ``autograd.Function``)
    with ``formula(args, kwargs, out, needs_input_grad)``, which returns
    ``([(key, forward FLOPs)], [(key, backward FLOPs)])``. Usable as a
    decorator: ``@register_flop_formula(MyFunction)``."""
    def register(fn):
        _FORMULAS[op_class] = fn
        return fn
    return register(formula) if formula is not None else register


# --------------------------------------------------------------- display --

_SUFFIXES = ["", "K", "M", "B", "T"]


def get_suffix_str(number):
    """The suffix PyTorch's table uses for ``number`` (1.01B shows as
    1010M, one digit of overflow)."""
    i = max(0, min(len(_SUFFIXES) - 1, (len(str(number)) - 2) // 3))
    return _SUFFIXES[i]


def convert_num_with_suffix(number, suffix):
    return f"{number / 1000 ** _SUFFIXES.index(suffix):.3f}{suffix}"


def _percent(num, denom):
    return f"{num / denom:.2%}" if denom else "0%"


# ------------------------------------------------------ module tracking --

class _Modules:
    """The names of the modules whose forward is running in this thread,
    PyTorch's ModuleTracker naming: the first module seen by its class,
    its children by attribute path."""

    def __init__(self, owner):
        self.owner = owner
        self.names = weakref.WeakKeyDictionary()
        self.seen = weakref.WeakSet()
        self.parents = ["Global"]

    def name(self, mod):
        name = self.names.get(mod)
        if name is None:
            name = self.names[mod] = type(mod).__name__
        if mod not in self.seen:     # name the whole subtree once
            self.seen.add(mod)
            for child_name, child in mod.named_children():
                if child not in self.names:
                    self.names[child] = f"{name}.{child_name}"
                self.name(child)
        return name

    def enter(self, mod, args):
        if self.owner in _tls.counters:      # the counter's own thread
            self.parents.append(self.name(mod))

    def leave(self, mod, args, out):
        if self.owner not in _tls.counters:
            return
        name = self.name(mod)
        for i in range(len(self.parents) - 1, 0, -1):
            if self.parents[i] == name:
                del self.parents[i]
                break


# --------------------------------------------------------------- counting --

class _Thread(threading.local):
    counters = ()       # FlopCounterModes open in this thread, outermost first
    inside = None       # the op class being counted (re-entry guard)


_tls = _Thread()


def _first_node(out):
    if isinstance(out, TensorBase):
        return out.grad_fn
    if isinstance(out, (tuple, list)):
        for o in out:
            if isinstance(o, TensorBase) and o.grad_fn is not None:
                return o.grad_fn
    return None


class _Recorder:
    """Rank 2 of the op recorder chain (autograd.function._set_recorder):
    runs the op, adds its forward FLOPs to this thread's open counters and
    keeps the backward FLOPs on its graph node for the engine to count."""
    inner = None

    def __call__(self, cls, args, kwargs):
        st = _tls
        formula = _FORMULAS.get(cls)
        if not st.counters or formula is None or st.inside is cls:
            return _function._pass(self.inner, cls, args, kwargs)
        prev, st.inside = st.inside, cls
        try:
            out = _function._pass(self.inner, cls, args, kwargs)
            if out is NotImplemented:
                out = cls.apply(*args, **kwargs)
        finally:
            st.inside = prev
        node = _first_node(out) if _grad_state.enabled else None
        need = tuple(node.needs_input_grad) if node is not None else None
        fwd, bwd = formula(args, kwargs, out, need)
        for c in st.counters:
            parents = c._modules.parents
            c._add(parents, fwd)
            if bwd and node is not None:
                c._pending[node] = (tuple(parents), bwd)
        return out

    def backward_node(self, run):
        if self.inner is not None:
            run = self.inner.backward_node(run)
        counters = _tls.counters
        if not counters:
            return run

        def counted(node, *rest):
            # under create_graph the backward's own ops are counted as ops
            if not _grad_state.enabled:
                for c in counters:
                    got = c._pending.get(node)
                    if got is not None:
                        c._add(*got)
            return run(node, *rest)
        return counted


_recorder = _Recorder()


def _install(delta):
    _function._use_recorder(2, _recorder, delta)


class FlopCounterMode:
    """Counts the FLOPs of what runs inside it (forward and backward), per
    module (see the module docstring). PyTorch's signature: ``mods`` is
    accepted and unused (PyTorch deprecates it too), ``depth`` limits the
    table, ``display`` prints it on exit, ``custom_mapping`` maps op
    classes to extra formulas (see ``register_flop_formula``)."""

    def __init__(self, mods=None, depth=2, display=True,
                 custom_mapping=None):
        if mods is not None:
            import warnings
            warnings.warn("mods argument is not needed anymore, you can stop "
                          "passing it", stacklevel=2)
        self.depth = depth
        self.display = display
        self.flop_counts = defaultdict(lambda: defaultdict(int))
        self._custom = dict(custom_mapping or {})
        self._modules = _Modules(self)
        self._pending = weakref.WeakKeyDictionary()
        self._hooks = None

    def _add(self, parents, entries):
        for key, flops in entries:
            for name in set(parents):
                self.flop_counts[name][key] += flops

    def get_total_flops(self):
        return sum(self.flop_counts["Global"].values())

    def get_flop_counts(self):
        """{module name: {op key: FLOPs}}, 'Global' for the whole run."""
        return {k: dict(v) for k, v in self.flop_counts.items()}

    def get_table(self, depth=None):
        depth = self.depth if depth is None else depth
        depth = 999999 if depth is None else depth
        total = self.get_total_flops()
        suffix = get_suffix_str(total)
        rows, subsumed = [], False
        for name in sorted(self.flop_counts):
            if name == "Global" or name.count(".") + 1 > depth:
                continue
            rows += self._rows(name, name.count("."), total, suffix)
            subsumed |= sum(self.flop_counts[name].values()) >= total
        if "Global" in self.flop_counts and not subsumed:
            rows = self._rows("Global", 0, total, suffix) + \
                [[" " + r[0]] + r[1:] for r in rows]
        rows = rows or [["Global", "0", "0%"]]
        head = ["Module", "FLOP", "% Total"]
        w = [max(len(r[i]) for r in rows + [head]) for i in range(3)]
        line = "  ".join("-" * n for n in w)
        fmt = [f"{head[0]:<{w[0]}}  {head[1]:>{w[1]}}  {head[2]:>{w[2]}}",
               line]
        fmt += [f"{a:<{w[0]}}  {b:>{w[1]}}  {c:>{w[2]}}" for a, b, c in rows]
        return "\n".join(fmt)

    def _rows(self, name, depth, total, suffix):
        pad = " " * depth
        counts = self.flop_counts[name]
        rows = [[pad + name,
                 convert_num_with_suffix(sum(counts.values()), suffix),
                 _percent(sum(counts.values()), total)]]
        for k, v in counts.items():
            rows.append([pad + " - " + str(k),
                         convert_num_with_suffix(v, suffix),
                         _percent(v, total)])
        return rows

    # NB: as PyTorch's, not reentrant (one instance, one region at a time)
    def __enter__(self):
        self.flop_counts.clear()
        self._modules.parents = ["Global"]
        self._pending = weakref.WeakKeyDictionary()
        self._saved = {}
        for cls, formula in self._custom.items():
            self._saved[cls] = _FORMULAS.get(cls)
            _FORMULAS[cls] = formula
        pre = _module.register_module_forward_pre_hook(self._modules.enter)
        post = _module.register_module_forward_hook(self._modules.leave)
        self._hooks = (pre, post)
        _tls.counters = _tls.counters + (self,)
        _install(+1)
        return self

    def __exit__(self, *exc):
        _install(-1)
        _tls.counters = tuple(c for c in _tls.counters if c is not self)
        for h in self._hooks:
            h.remove()
        self._hooks = None
        for cls, formula in self._saved.items():
            if formula is None:
                _FORMULAS.pop(cls, None)
            else:
                _FORMULAS[cls] = formula
        if self.display:
            print(self.get_table(self.depth))
        return False

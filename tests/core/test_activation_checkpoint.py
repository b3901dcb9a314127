"""Activation checkpointing (dtorch.utils.checkpoint) and the saved-tensor
hooks it is built on: gradients bitwise equal to the run without
checkpointing (dropout replayed), against torch's checkpoint and finite
differences, create_graph, AMP, DDP and tensor parallel on thread ranks,
selective policies, PyTorch's warnings and errors."""
import functools
import warnings

import numpy as np
import pytest

import dtorch
import dtorch.distributed as dist
from dtorch import nn
from dtorch.autograd.graph import (saved_tensors_hooks, save_on_cpu,
                                   disable_saved_tensors_hooks)
from dtorch.utils.checkpoint import (
    checkpoint, checkpoint_sequential, CheckpointError, CheckpointPolicy,
    create_selective_checkpoint_contexts)

torch = pytest.importorskip("torch")
import torch.utils.checkpoint as tcp  # noqa: E402

F64 = dtorch.float64


def blocks(n=3, d=8, p=0.25, seed=0):
    dtorch.manual_seed(seed)
    return [nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.GELU(),
                          nn.Linear(4 * d, d), nn.Dropout(p))
            for _ in range(n)]


def run(bs, wrap, x0, seed=1):
    """Gradients (input first) of sum(residual blocks), each block through
    wrap(block, h)."""
    dtorch.manual_seed(seed)
    x = x0.clone().requires_grad_()
    h = x
    for b in bs:
        h = h + wrap(b, h)
    h.sum().backward()
    params = [p for b in bs for p in b.parameters()]
    grads = [x.grad] + [p.grad for p in params]
    for p in params:
        p.grad = None
    return [g.numpy().copy() for g in grads]


def assert_bitwise(a, b):
    assert len(a) == len(b)
    for u, v in zip(a, b):
        assert u.dtype == v.dtype and np.array_equal(u, v)


PLAIN = staticmethod(lambda b, h: b(h))

WRAPS = {
    "non-reentrant": lambda b, h: checkpoint(b, h, use_reentrant=False),
    "reentrant": lambda b, h: checkpoint(b, h, use_reentrant=True),
    "selective": lambda b, h: checkpoint(
        b, h, use_reentrant=False, context_fn=functools.partial(
            create_selective_checkpoint_contexts, [dtorch.ops.Linear])),
}


@pytest.mark.parametrize("kind", sorted(WRAPS))
def test_dropout_replayed_gradients_bitwise_equal(kind):
    bs = blocks()
    x0 = dtorch.randn(5, 8)
    ref = run(bs, lambda b, h: b(h), x0)
    assert_bitwise(run(bs, WRAPS[kind], x0), ref)
    # the RNG after a checkpointed step is where the plain one leaves it
    run(bs, WRAPS[kind], x0, seed=3)
    a = dtorch.rand(3)
    run(bs, lambda b, h: b(h), x0, seed=3)
    assert dtorch.equal(a, dtorch.rand(3))


@pytest.mark.parametrize("re", [False, True])
def test_recomputation_draws_the_forwards_mask(re):
    # d sum(y)/dx = y for y = dropout(x) at x = 1
    x = dtorch.ones(512, requires_grad=True)
    y = checkpoint(lambda v: nn.functional.dropout(v * 1, 0.5), x,
                   use_reentrant=re)
    dtorch.rand(7)                     # the stream moves on meanwhile
    y.sum().backward()
    assert dtorch.equal(x.grad, y.detach())


def test_forward_keeps_only_inputs_and_recomputes_once():
    calls = []

    def fn(x):
        calls.append(1)
        return (x.sin() * 2).exp()

    x = dtorch.randn(4, requires_grad=True)
    y = checkpoint(fn, x, use_reentrant=False)
    node = y.grad_fn
    assert "_packed" in node.__dict__            # nothing saved but holders
    y.sum().backward(retain_graph=True)
    assert len(calls) == 2
    g1 = x.grad.clone()
    y.sum().backward()                           # recomputes again
    assert len(calls) == 3
    assert dtorch.equal(x.grad, 2 * g1)


def _torch_pair(fn_d, fn_t, use_reentrant):
    rng = np.random.default_rng(0)
    xa, wa = rng.standard_normal((3, 4)), rng.standard_normal((4, 4))
    xd = dtorch.tensor(xa, requires_grad=True)
    wd = dtorch.tensor(wa, requires_grad=True)
    xt = torch.tensor(xa, requires_grad=True)
    wt = torch.tensor(wa, requires_grad=True)
    checkpoint(fn_d, xd, wd, use_reentrant=use_reentrant).sum().backward()
    tcp.checkpoint(fn_t, xt, wt, use_reentrant=use_reentrant).sum() \
        .backward()
    np.testing.assert_allclose(xd.grad.numpy(), xt.grad.numpy(), 1e-12)
    np.testing.assert_allclose(wd.grad.numpy(), wt.grad.numpy(), 1e-12)


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_same_gradients_as_torch(use_reentrant):
    _torch_pair(lambda x, w: dtorch.tanh(x @ w).pow(2),
                lambda x, w: torch.tanh(x @ w).pow(2), use_reentrant)


def test_finite_differences_and_create_graph():
    x = dtorch.randn(3, 4, dtype=F64, requires_grad=True)
    w = dtorch.randn(4, 2, dtype=F64, requires_grad=True)

    def fn(x, w):
        return checkpoint(lambda a, b: dtorch.tanh(a @ b) * a.sum(),
                          x, w, use_reentrant=False)
    assert dtorch.autograd.gradcheck(fn, (x, w))
    assert dtorch.autograd.gradgradcheck(fn, (x, w))
    # a gradient penalty through the checkpoint equals the plain one
    out = []
    for ck in (False, True):
        f = fn if ck else (lambda a, b: dtorch.tanh(a @ b) * a.sum())
        g, = dtorch.autograd.grad(f(x, w).sum(), w, create_graph=True)
        g.pow(2).sum().backward()
        out.append(x.grad.clone())
        x.grad = None
    assert dtorch.equal(out[0], out[1])


def test_amp_autocast_state_replayed():
    bs = blocks(2, p=0.0)
    x0 = dtorch.randn(4, 8)

    def amp(wrap):
        def f(b, h):
            with dtorch.autocast("cpu", dtype=dtorch.bfloat16):
                return wrap(b, h).float()
        return f
    ref = run(bs, amp(lambda b, h: b(h)), x0)
    got = run(bs, amp(WRAPS["non-reentrant"]), x0)
    got_re = run(bs, amp(WRAPS["reentrant"]), x0)
    assert_bitwise(got, ref)
    assert_bitwise(got_re, ref)
    # the backward ran outside the region: the recomputation restored it
    assert not dtorch.amp.autocast_mode.is_autocast_enabled("cpu")


def test_checkpoint_sequential_equals_plain():
    seq = nn.Sequential(*blocks(4))
    x0 = dtorch.randn(3, 8)
    ref = run([seq], lambda b, h: b(h), x0)
    for re in (False, True):
        got = run([seq], lambda b, h: checkpoint_sequential(
            b, 2, h, use_reentrant=re), x0)
        assert_bitwise(got, ref)


def test_use_reentrant_warning_and_errors_as_torch():
    x = dtorch.randn(2, requires_grad=True)
    xt = torch.randn(2, requires_grad=True)
    for ck, a in ((checkpoint, x), (tcp.checkpoint, xt)):
        with pytest.warns(UserWarning, match="use_reentrant parameter "
                          "should be passed explicitly"):
            ck(lambda v: v * 2, a)
    for ck, a in ((checkpoint_sequential, x),
                  (tcp.checkpoint_sequential, xt)):
        with pytest.warns(UserWarning, match="use_reentrant"):
            ck([lambda v: v * 2] * 2, 1, a)
    for ck, a in ((checkpoint, x), (tcp.checkpoint, xt)):
        with pytest.raises(ValueError, match="Unexpected keyword arguments"
                           ": k"):
            ck(lambda v, k: v, a, k=1, use_reentrant=True)
        with pytest.raises(ValueError, match="only supported when "
                           "use_reentrant=False"):
            ck(lambda v: v, a, use_reentrant=True, debug=True)
        with pytest.raises(ValueError, match="determinism_check should be "
                           "one of"):
            ck(lambda v: v, a, use_reentrant=False, determinism_check="x")
    with pytest.warns(UserWarning, match="None of the inputs have "
                      "requires_grad=True"):
        checkpoint(lambda v: v * 2, dtorch.randn(2), use_reentrant=True)
    # reentrant under autograd.grad: PyTorch's refusal
    msgs = []
    for ck, a, grad in ((checkpoint, x, dtorch.autograd.grad),
                        (tcp.checkpoint, xt, torch.autograd.grad)):
        y = ck(lambda v: v.exp(), a, use_reentrant=True)
        with pytest.raises(RuntimeError) as e:
            grad(y.sum(), a)
        msgs.append(str(e.value))
    assert msgs[0] == msgs[1]


def test_recomputation_with_other_shapes_raises():
    msgs = []
    for ck, mod in ((checkpoint, dtorch), (tcp.checkpoint, torch)):
        n = [3]

        def fn(x):
            n[0] += 1               # the recomputation sees another shape
            return (x[:n[0] - 1] * 2).exp().sum()
        x = mod.ones(8, requires_grad=True)
        y = ck(fn, x, use_reentrant=False)
        with pytest.raises(RuntimeError, match="torch.utils.checkpoint: "
                           "Recomputed values for the following tensors "
                           "have different metadata"):
            y.backward()
        y = ck(fn, x, use_reentrant=False, determinism_check="none")
    # fewer saved values in the recomputation
    k = [0]

    def fewer(x):
        k[0] += 1
        return x.exp() if k[0] > 1 else x.exp().sin()
    x = dtorch.ones(3, requires_grad=True)
    y = checkpoint(fewer, x, use_reentrant=False)
    with pytest.raises(CheckpointError, match="A different number of "
                       "tensors was saved"):
        y.sum().backward()
    k[0] = 0
    y = checkpoint(fewer, x, use_reentrant=False, debug=True)
    with pytest.raises(CheckpointError, match=r"original forward: \['Exp"
                       r"Backward'|original forward: \['Exp"):
        y.sum().backward()


def test_early_stop_skips_the_rest_of_the_recomputation():
    from dtorch.utils.checkpoint import set_checkpoint_early_stop
    tail = []

    def fn(x):
        y = x.exp()                 # the last op that saves anything
        tail.append(1)
        return y * 1.0
    for stop, runs in ((True, 1), (False, 2)):
        tail.clear()
        x = dtorch.ones(2, requires_grad=True)
        with set_checkpoint_early_stop(stop):
            y = checkpoint(fn, x, use_reentrant=False)
        y.sum().backward()
        assert len(tail) == runs
        assert dtorch.allclose(x.grad, x.exp())


def test_nested_checkpoints():
    x0 = dtorch.randn(4, dtype=F64)

    def inner(v):
        return v.sin().exp()

    def outer(v):
        return checkpoint(inner, v * 2, use_reentrant=False).cos()
    grads = []
    for f in (lambda v: outer(v), lambda v: checkpoint(
            outer, v, use_reentrant=False)):
        x = x0.clone().requires_grad_()
        f(x).sum().backward()
        grads.append(x.grad)
    x = x0.clone().requires_grad_()
    (x * 2).sin().exp().cos().sum().backward()
    assert dtorch.equal(grads[0], x.grad) and dtorch.equal(grads[1], x.grad)


# ------------------------------------------------------ saved tensors --

def test_saved_tensors_hooks_as_torch():
    """pack sees the saved tensors (the inputs themselves), what unpack
    returns is what backward uses: a hook that doubles them doubles the
    gradients of x * y, as in torch."""
    res = []
    for mod in (dtorch, torch):
        x = mod.tensor([1.0, 2.0], requires_grad=True)
        y = mod.tensor([3.0, 5.0], requires_grad=True)
        seen = []

        def pack(t):
            seen.append(t)
            return t * 2
        with mod.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            z = x * y
        z.sum().backward()
        assert any(s is x for s in seen) and any(s is y for s in seen)
        res.append((x.grad.tolist(), y.grad.tolist()))
    assert res[0] == res[1] == ([6.0, 10.0], [2.0, 4.0])


def test_saved_tensors_hooks_custom_function_nesting_and_errors():
    class Cube(dtorch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x.pow(3)

        @staticmethod
        def backward(ctx, grad):
            x, = ctx.saved_tensors
            return grad * 3 * x.pow(2)
    log = []
    outer = saved_tensors_hooks(lambda t: log.append("outer") or t,
                                lambda t: t)
    inner = saved_tensors_hooks(lambda t: log.append("inner") or t,
                                lambda t: (log.append("unpack"), t)[1])
    x = dtorch.tensor([1.5], requires_grad=True)
    with outer:
        with inner:
            y = Cube.apply(x)
        z = y.exp()
    assert log == ["inner", "outer"]
    z.backward()
    assert "unpack" in log
    np.testing.assert_allclose(x.grad.numpy(), 6.75 * np.exp(3.375), 1e-6)
    with saved_tensors_hooks(lambda t: t, lambda t: 1.0):
        y = dtorch.tensor([1.0], requires_grad=True).exp()
    with pytest.raises(TypeError, match="unpack hook"):
        y.backward()
    with disable_saved_tensors_hooks("no hooks here"):
        with pytest.raises(RuntimeError, match="no hooks here"):
            with saved_tensors_hooks(lambda t: t, lambda t: t):
                pass
    # save_on_cpu keeps CPU tensors as they are
    x = dtorch.randn(3, requires_grad=True)
    with save_on_cpu():
        y = x.exp().sin()
    y.sum().backward()
    assert dtorch.allclose(x.grad, x.exp().cos() * x.exp())


def test_in_place_change_of_a_checkpoint_input_detected():
    x = dtorch.randn(3, requires_grad=True)
    h = x * 1
    y = checkpoint(lambda v: v.exp(), h, use_reentrant=False)
    with dtorch.no_grad():
        h.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace "
                       "operation"):
        y.sum().backward()


# ---------------------------------------------------------- selective --

def test_selective_saves_listed_ops_and_recomputes_the_rest(monkeypatch):
    calls = []
    fwd = dtorch.ops.Linear.forward

    def counted(*a, **k):
        calls.append(1)
        return fwd(*a, **k)
    monkeypatch.setattr(dtorch.ops.Linear, "forward", staticmethod(counted))
    bs = blocks(2)
    x0 = dtorch.randn(3, 8)
    ref = run(bs, lambda b, h: b(h), x0)
    n_plain = len(calls)
    calls.clear()
    assert_bitwise(run(bs, WRAPS["selective"], x0), ref)
    assert len(calls) == n_plain          # no Linear ran again
    calls.clear()
    assert_bitwise(run(bs, WRAPS["non-reentrant"], x0), ref)
    assert len(calls) == 2 * n_plain      # every Linear ran again

    seen = []

    def policy(ctx, op, *args, **kwargs):
        seen.append(op)
        assert not ctx.is_recompute and ctx.op_output is not None
        return op is dtorch.ops.MatMul      # a bool: True saves
    x = dtorch.randn(2, 3, requires_grad=True)
    w = dtorch.randn(3, 3, requires_grad=True)
    y = checkpoint(lambda a: (a @ w).relu(), x, use_reentrant=False,
                   context_fn=functools.partial(
                       create_selective_checkpoint_contexts, policy))
    assert dtorch.ops.MatMul in seen
    y.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="Trying to backward an extra "
                       "time"):
        y.sum().backward()
    with pytest.raises(ValueError, match="Expected op in `op_list`"):
        create_selective_checkpoint_contexts(["mm"])
    with pytest.raises(TypeError, match="policy_fn_or_list must be"):
        create_selective_checkpoint_contexts(3)
    assert CheckpointPolicy.PREFER_SAVE.value == 1


# ------------------------------------------------------ DDP, TP, FSDP --

def test_ddp_ready_hooks_fire_once_per_parameter():
    bs = blocks(2, p=0.0)
    x0 = dtorch.randn(8, 8)
    init = [p.detach().clone() for b in bs for p in b.parameters()]

    def body(rank, ws, ck):
        model = nn.Sequential(*blocks(2, p=0.0))
        for p, v in zip(model.parameters(), init):
            p.data.copy_(v)
        fired = {}
        for i, p in enumerate(model.parameters()):
            p.register_post_accumulate_grad_hook(
                lambda t, i=i: fired.__setitem__(i, fired.get(i, 0) + 1))
        ddp = dtorch.nn.parallel.DistributedDataParallel(model)
        xs = x0[rank * 4:(rank + 1) * 4]

        def fwd(h):
            for b in ddp.module:
                h = h + (checkpoint(b, h, use_reentrant=False) if ck
                         else b(h))
            return h
        ddp.module.forward = fwd
        ddp(xs).pow(2).sum().backward()
        return fired, [p.grad.numpy().copy() for p in model.parameters()]
    plain = dist.spawn_threads(lambda r, n: body(r, n, False), 2,
                               timeout=60)
    ck = dist.spawn_threads(lambda r, n: body(r, n, True), 2, timeout=60)
    for (f, g), (_, g_ref) in zip(ck, plain):
        assert set(f.values()) == {1} and len(f) == len(g)
        assert_bitwise(g, g_ref)


def test_tensor_parallel_block_under_checkpoint():
    from dtorch.nn.parallel import tensor_parallel as tp
    dtorch.manual_seed(0)
    l1, l2 = nn.Linear(6, 8).to(F64), nn.Linear(8, 6).to(F64)
    x0 = dtorch.randn(4, 6, dtype=F64)

    def body(rank, n):
        c = tp.ColumnParallelLinear.from_linear(l1, gather_output=False)
        r = tp.RowParallelLinear.from_linear(l2, input_is_parallel=True)

        def block(h):
            return r(nn.functional.gelu(c(h)))
        out = []
        for ck in (False, True):
            x = x0.clone().requires_grad_()
            y = checkpoint(block, x, use_reentrant=False) if ck \
                else block(x)
            y.pow(2).sum().backward()
            out.append([x.grad.numpy().copy(), c.weight.grad.numpy().copy(),
                        r.weight.grad.numpy().copy()])
            for p in (*c.parameters(), *r.parameters()):
                p.grad = None
        assert_bitwise(out[1], out[0])
        return True
    assert all(dist.spawn_threads(body, 2, timeout=60))

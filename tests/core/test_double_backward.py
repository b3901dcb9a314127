"""create_graph=True: gradients that can be differentiated again (issue 14).

The engine and the core primitives (arithmetic, elementwise maths,
reductions, moves, matmul/linear): second derivatives by gradgradcheck in
float64, higher orders against closed forms, autograd.functional against
torch.autograd.functional, and the contract around it (.grad under
create_graph, retain_graph's default, hooks, custom Functions, a primitive
without a differentiable backward raising an error that names it). The nn
families (activations, losses, norms, conv, pool, indexing) are in
test_double_backward_nn.py.
"""
import numpy as np
import pytest

import dtorch
import dtorch.nn.functional as F
from dtorch.autograd import grad, gradgradcheck
from dtorch.autograd import functional as AF
from dtorch.autograd.function import once_differentiable

f64 = dtorch.float64


def _t(a, req=True):
    return dtorch.tensor(np.asarray(a, dtype=np.float64), requires_grad=req)


@pytest.fixture
def xy():
    rng = np.random.default_rng(0)
    # away from 0 and from ties: the kinks of abs/relu/max/clamp
    x = rng.uniform(0.2, 1.5, (3, 4)) * rng.choice([-1, 1], (3, 4))
    return _t(x), _t(rng.uniform(0.5, 1.5, 4))


CORE = {
    "add_sub_broadcast": (lambda a, c: (a + c) * (a - c), 2),
    "mul": (lambda a, c: a * c * a, 2),
    "div": (lambda a, c: a / (c * c + 1), 2),
    "pow_scalar": (lambda a, c: a ** 3 + a ** -2, 1),
    "pow_tensor": (lambda a, c: (a * a + 1) ** c, 2),
    "rpow": (lambda a, c: 2 ** a, 1),
    "exp_log": (lambda a, c: (a.exp() + 1).log(), 1),
    "expm1_log1p": (lambda a, c: (a * a).log1p() * a.expm1(), 1),
    "tanh_sigmoid": (lambda a, c: a.tanh() * a.sigmoid(), 1),
    "trig": (lambda a, c: a.sin() * a.cos() + (a / 2).atan(), 1),
    "hyperbolic": (lambda a, c: (a / 2).sinh() * (a / 3).cosh()
                   + (a / 3).asinh(), 1),
    "inverse_trig": (lambda a, c: (a / 3).asin() + (a / 3).acos()
                     + (a / 3).atanh(), 1),
    "erf": (lambda a, c: dtorch.erf(a) * a + dtorch.erfc(a), 1),
    "lgamma": (lambda a, c: (a * a + 1).lgamma(), 1),
    "sinc": (lambda a, c: dtorch.sinc(a) * a, 1),
    "xlogy": (lambda a, c: dtorch.xlogy(a * a, c * c + 0.5), 2),
    "sqrt_rsqrt": (lambda a, c: (a * a + 1).sqrt() * (a * a + 2).rsqrt(), 1),
    "reciprocal": (lambda a, c: (a * a + 1).reciprocal(), 1),
    "abs_neg": (lambda a, c: -a.abs() * a, 1),
    "relu": (lambda a, c: F.relu(a) * a, 1),
    "clamp": (lambda a, c: a.clamp(-0.9, 0.9) * a, 1),
    "clamp_tensor": (lambda a, c: dtorch.clamp(a * c, min=-c) * a, 2),
    "maximum": (lambda a, c: dtorch.maximum(a * a, c * c) * a, 2),
    "where": (lambda a, c: dtorch.where(a > 0, a * a, a.exp()), 1),
    "lerp": (lambda a, c: dtorch.lerp(a, c.expand(3, 4), 0.3) ** 2, 2),
    "fmod": (lambda a, c: dtorch.fmod(a * a, c) * a, 2),
    "atan2_hypot": (lambda a, c: dtorch.atan2(a, c + a * a)
                    + dtorch.hypot(a, c), 2),
    "sum_mean": (lambda a, c: (a * a).sum(1) * (a ** 3).mean(), 1),
    "prod": (lambda a, c: a.prod(1) + a.prod(), 1),
    "amax_max_dim": (lambda a, c: (a * a).amax(1) + (a ** 3).max(0)[0]
                     .sum(), 1),
    "norm": (lambda a, c: a.norm(dim=1) + a.norm(p=1), 1),
    "matmul_vec": (lambda a, c: (a @ c) ** 2, 2),
    "matmul_mat": (lambda a, c: (a @ a.t()).tanh(), 1),
    "linear": (lambda a, c: F.linear(a * c, a * 0.5, a.sum(1)).tanh(),
               2),
    "views": (lambda a, c: (a.t() * a.t()).reshape(-1)
              * a.unsqueeze(0).expand(2, 3, 4).sum(), 1),
    "cat_stack": (lambda a, c: dtorch.cat([a * a, a.exp()], 1).sum(0)
                  * dtorch.stack([c, c * c]).prod(0).sum(), 2),
    "pad_constant": (lambda a, c: F.pad(a * a, (1, 2)) ** 2, 1),
}


@pytest.mark.parametrize("name", sorted(CORE))
def test_gradgradcheck_core(name, xy):
    fn, nargs = CORE[name]
    x, y = xy
    args = (x, y)[:nargs]
    if nargs == 1:
        assert gradgradcheck(lambda a: fn(a, None), args)
    else:
        assert gradgradcheck(fn, args)


def test_through_a_dtype_cast():
    x = dtorch.tensor([0.5, -1.25], requires_grad=True)      # float32
    g, = grad((x.double() ** 3).sum(), x, create_graph=True)
    assert g.dtype == dtorch.float32
    g2, = grad(g.sum(), x)
    assert g2.dtype == dtorch.float32
    np.testing.assert_allclose(g2.numpy(), [3.0, -7.5])


def test_third_order_closed_form():
    x = _t([0.3, -1.2, 2.0])
    y = (x ** 4).sum()
    g1, = grad(y, x, create_graph=True)
    g2, = grad(g1.sum(), x, create_graph=True)
    g3, = grad(g2.sum(), x, create_graph=True)
    g4, = grad(g3.sum(), x)
    xa = x.detach().numpy()
    np.testing.assert_allclose(g1.detach().numpy(), 4 * xa ** 3, rtol=1e-14)
    np.testing.assert_allclose(g2.detach().numpy(), 12 * xa ** 2, rtol=1e-14)
    np.testing.assert_allclose(g3.detach().numpy(), 24 * xa, rtol=1e-14)
    np.testing.assert_allclose(g4.numpy(), np.full(3, 24.0), rtol=1e-14)
    assert g1.requires_grad and g1.grad_fn is not None


def test_without_create_graph_gradients_carry_no_graph():
    x = _t([1.0, 2.0])
    g, = grad((x ** 3).sum(), x)
    assert not g.requires_grad and g.grad_fn is None


def test_backward_create_graph_sets_differentiable_grad():
    torch = pytest.importorskip("torch")
    xa = np.array([0.5, -1.5, 2.0])
    x, xt = _t(xa), torch.tensor(xa, requires_grad=True)
    for a, lib in ((x, dtorch), (xt, torch)):
        (a.sin() * a ** 2).sum().backward(create_graph=True)
        assert a.grad.requires_grad
        # retain_graph defaults to create_graph: a second pass through the
        # same graph is allowed, and adds the second derivatives into .grad
        a.grad.sum().backward()
    np.testing.assert_allclose(x.grad.detach().numpy(),
                               xt.grad.detach().numpy(), rtol=1e-14)


def test_grad_of_leaf_is_a_copy_not_the_callers_tensor():
    x = _t([1.0, 2.0])
    v = _t([3.0, 4.0], req=False)
    x.backward(gradient=v, create_graph=True)
    assert x.grad is not v
    x.grad.data.zero_()
    assert v.tolist() == [3.0, 4.0]


def test_gradient_penalty_on_an_mlp_matches_torch():
    """WGAN-GP's penalty (||d D(x) / dx|| - 1)^2 and its gradient with
    respect to D's weights."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    w1, b1 = rng.standard_normal((8, 5)), rng.standard_normal(8)
    w2, b2 = rng.standard_normal((1, 8)), rng.standard_normal(1)
    xa = rng.standard_normal((4, 5))

    def run(lib, tf):
        ps = [tf(a) for a in (w1, b1, w2, b2)]
        for p in ps:
            p.requires_grad_(True)
        x = tf(xa).requires_grad_(True)
        d = lib.nn.functional.linear(
            lib.tanh(lib.nn.functional.linear(x, ps[0], ps[1])), ps[2],
            ps[3])
        g, = lib.autograd.grad(d.sum(), x, create_graph=True)
        pen = ((g.norm(2, dim=1) - 1) ** 2).mean()
        pen.backward()
        # b2 does not change d D / dx: no gradient in either framework
        assert ps[3].grad is None
        return [pen.item()] + [p.grad.detach().numpy() for p in ps[:3]] + \
            [x.grad.detach().numpy()]

    ours = run(dtorch, lambda a: dtorch.tensor(a))
    ref = run(torch, lambda a: torch.tensor(a))
    assert ours[0] == pytest.approx(ref[0], rel=1e-13)
    for a, b in zip(ours[1:], ref[1:]):
        np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-13)


def test_grad_outputs_that_require_grad():
    # d/dv of (J^T v) is J: the double-backward trick behind jvp
    x = _t([0.5, 1.0, 2.0])
    v = _t([1.0, -1.0, 0.5])
    y = x.exp()
    g, = grad(y, x, v, create_graph=True)
    gv, = grad(g.sum(), v)
    np.testing.assert_allclose(gv.numpy(), np.exp([0.5, 1.0, 2.0]),
                               rtol=1e-15)


def test_tensor_hooks_see_the_differentiable_gradient():
    x = _t([1.0, 2.0])
    h = x * x
    seen = []
    h.register_hook(lambda g: seen.append(g.requires_grad) or g * 2)
    g, = grad((h * x).sum(), x, create_graph=True)
    assert seen == [True]
    # x * 2x doubled by the hook, plus h: 5 x^2 (torch gives the same)
    np.testing.assert_allclose(g.detach().numpy(), [5.0, 20.0])
    # the hook fires again when the second pass goes through h: 12 x, as
    # in torch 2.13
    g2, = grad(g.sum(), x)
    np.testing.assert_allclose(g2.numpy(), [12.0, 24.0])


class Cube(dtorch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 3

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return g * 3 * x * x


class OnceCube(Cube):
    """Cube with PyTorch's @once_differentiable backward."""
    backward = staticmethod(once_differentiable(Cube.backward))


def test_custom_function_backward_is_differentiated():
    x = _t([0.5, -2.0])
    g, = grad(Cube.apply(x).sum(), x, create_graph=True)
    g2, = grad(g.sum(), x)
    np.testing.assert_allclose(g2.numpy(), [3.0, -12.0])
    assert gradgradcheck(Cube.apply, (x,))


def test_once_differentiable_user_function():
    x = dtorch.tensor([2.0], requires_grad=True)
    (g,) = grad(OnceCube.apply(x).sum(), x, create_graph=True)
    assert g.tolist() == [12.0] and g.requires_grad
    with pytest.raises(RuntimeError, match="OnceCube"):
        g.sum().backward()


def test_op_without_double_backward_names_itself():
    # digamma has a first-order backward only: its gradient under
    # create_graph is right, differentiating it again is an error naming it
    # (reflect padding was the example here; it has a backward_graph now)
    x = _t(np.arange(6.0) / 7 + 0.5)
    g, = grad((x.digamma() ** 2).sum(), x, create_graph=True)
    ref, = grad((x.digamma() ** 2).sum(), x)
    np.testing.assert_allclose(g.detach().numpy(), ref.numpy())
    with pytest.raises(RuntimeError, match="double backward is not "
                       "implemented for DigammaBackward"):
        grad(g.sum(), x)


def test_create_graph_false_after_true_on_same_graph():
    x = _t([1.0, 3.0])
    y = (x ** 3).sum()
    g, = grad(y, x, create_graph=True)
    g_again, = grad(y, x)          # retained by the first call
    np.testing.assert_allclose(g.detach().numpy(), g_again.numpy())


# ------------------------------------------------ autograd.functional --

def _torch_pair():
    torch = pytest.importorskip("torch")
    return torch


def test_functional_against_torch():
    torch = _torch_pair()
    rng = np.random.default_rng(3)
    a, b = rng.uniform(0.1, 1, 3), rng.uniform(0.1, 1, 3)
    v = (rng.standard_normal(3), rng.standard_normal(3))

    def scalar(lib):
        return lambda x: (x.tanh() ** 2).sum() + (x * x.sin()).prod()

    def pair(lib):
        return lambda x, y: (x * y.exp(), (x @ x) * y)

    def close(ours, ref):
        if isinstance(ref, (tuple, list)):
            assert len(ours) == len(ref)
            for o, r in zip(ours, ref):
                close(o, r)
        else:
            np.testing.assert_allclose(ours.detach().numpy(),
                                       ref.detach().numpy(), rtol=1e-12,
                                       atol=1e-14)

    for lib, T, AFl in ((dtorch, dtorch.tensor, AF),
                        (torch, torch.tensor, None)):
        pass
    TA = torch.autograd.functional
    D = dtorch.tensor
    close(AF.hessian(scalar(dtorch), D(a)), TA.hessian(scalar(torch),
                                                      torch.tensor(a)))
    close(AF.hessian(lambda x, y: (x * y).sum() ** 2, (D(a), D(b))),
          TA.hessian(lambda x, y: (x * y).sum() ** 2,
                     (torch.tensor(a), torch.tensor(b))))
    for name in ("jvp", "vjp"):
        ours = getattr(AF, name)(pair(dtorch), (D(a), D(b)),
                                 (D(v[0]), D(v[1])))
        ref = getattr(TA, name)(pair(torch), (torch.tensor(a),
                                              torch.tensor(b)),
                                (torch.tensor(v[0]), torch.tensor(v[1])))
        close(ours, ref)
    for name in ("hvp", "vhp"):
        close(getattr(AF, name)(scalar(dtorch), D(a), D(v[0])),
              getattr(TA, name)(scalar(torch), torch.tensor(a),
                                torch.tensor(v[0])))
    close(AF.jacobian(lambda x: x.exp() * x, D(a)),
          TA.jacobian(lambda x: x.exp() * x, torch.tensor(a)))


def test_jacobian_create_graph_is_differentiable():
    x = _t([0.5, 1.5])
    J = AF.jacobian(lambda t: t ** 3, x, create_graph=True)
    assert J.requires_grad
    g, = grad(J.sum(), x)          # d/dx sum(diag(3 x^2)) = 6 x
    np.testing.assert_allclose(g.numpy(), [3.0, 9.0])
    J0 = AF.jacobian(lambda t: t ** 3, x)
    assert not J0.requires_grad


def test_functional_checks():
    x = _t([1.0, 2.0], req=False)
    with pytest.raises(RuntimeError, match="v can only be None"):
        AF.vjp(lambda t: t * 2, x)
    with pytest.raises(RuntimeError, match="invalid size"):
        AF.jvp(lambda t: t * 2, x, _t([1.0], req=False))
    with pytest.raises(RuntimeError, match="independent of input 1"):
        AF.jacobian(lambda a, b: a * 2, (x, x.clone()), strict=True)
    with pytest.raises(RuntimeError, match="single element"):
        AF.hessian(lambda t: t * 2, x)
    with pytest.raises(TypeError, match="must be either a Tensor"):
        AF.vjp(lambda t: t, [1.0, 2.0])


@pytest.mark.parametrize("op", ["relu", "relu6", "abs", "clamp", "maximum"])
def test_zero_link_like_torch(op):
    """relu, hardtanh (relu6) and abs join their create_graph gradient to
    the input by a zero derivative, so a bias before them gets .grad == 0;
    clamp and maximum do not (their gradient has no graph): as torch."""
    torch = pytest.importorskip("torch")
    fns = {"relu": lambda lib, t: lib.nn.functional.relu(t),
           "relu6": lambda lib, t: lib.nn.functional.relu6(t),
           "abs": lambda lib, t: t.abs(),
           "clamp": lambda lib, t: t.clamp(-0.5, 0.5),
           "maximum": lambda lib, t: lib.maximum(t, lib.zeros(3))}
    res = []
    for lib in (dtorch, torch):
        b = lib.zeros(3, requires_grad=True)
        x = lib.tensor([0.3, -0.2, 1.5], requires_grad=True)
        g, = lib.autograd.grad(fns[op](lib, x + b).sum(), x,
                               create_graph=True)
        res.append(g.requires_grad)
        if g.requires_grad:
            g.sum().backward()
            # + zeros: torch's abs gives an unallocated ZeroTensor
            res.append((b.grad + lib.zeros(3)).tolist())
    assert res[:len(res) // 2] == res[len(res) // 2:]

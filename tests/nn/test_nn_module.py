"""nn.Module semantics: registration, iteration, state_dict, hooks, modes,
device/dtype moves, repr, containers, init, clipping."""
import math
from collections import OrderedDict

import numpy as np
import pytest

import dtorch
import dtorch as torch
from dtorch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 3)
        self.bn = nn.BatchNorm1d(3)
        self.fc2 = nn.Linear(3, 2, bias=False)
        self.register_buffer("scratch", torch.zeros(2), persistent=False)
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, x):
        return self.fc2(self.bn(self.fc1(x)).relu()) * self.scale


def test_registration_and_iteration():
    m = Net()
    names = [n for n, _ in m.named_parameters()]
    assert names == ["scale", "fc1.weight", "fc1.bias", "bn.weight",
                     "bn.bias", "fc2.weight"]
    assert [n for n, _ in m.named_buffers()] == [
        "scratch", "bn.running_mean", "bn.running_var",
        "bn.num_batches_tracked"]
    assert [n for n, _ in m.named_children()] == ["fc1", "bn", "fc2"]
    assert [n for n, _ in m.named_modules()] == ["", "fc1", "bn", "fc2"]
    assert len(list(m.parameters(recurse=False))) == 1
    assert m.get_submodule("bn") is m.bn
    assert m.get_parameter("fc1.bias") is m.fc1.bias
    with pytest.raises(AttributeError):
        m.get_submodule("nope")
    # shared modules and parameters appear once
    seq = nn.Sequential(m.fc1, m.fc1)
    assert len(list(seq.parameters())) == 2
    # reassigning a plain attribute over a parameter is an error
    with pytest.raises(TypeError, match="cannot assign"):
        m.scale = torch.ones(1)
    m.scale = None
    assert "scale" not in dict(m.named_parameters())
    with pytest.raises(AttributeError, match="has no attribute 'missing'"):
        m.missing
    del m.fc2
    assert "fc2" not in dict(m.named_children())


def test_parameter():
    t = torch.zeros(2, 2)
    p = nn.Parameter(t)
    assert isinstance(p, torch.Tensor) and p.requires_grad and p.is_leaf
    p.data[0, 0] = 5.0
    assert t[0, 0].item() == 5.0          # shares memory
    assert repr(p).startswith("Parameter containing:\ntensor(")
    q = nn.Parameter(torch.zeros(1), requires_grad=False)
    assert not q.requires_grad
    import copy
    r = copy.deepcopy(p)
    assert isinstance(r, nn.Parameter) and r._data is not p._data


def test_state_dict_round_trip_and_keys():
    torch.manual_seed(0)
    a, b = Net(), Net()
    a.bn.running_mean.fill_(0.5)
    sd = a.state_dict()
    assert list(sd) == ["scale", "fc1.weight", "fc1.bias", "bn.weight",
                        "bn.bias", "bn.running_mean", "bn.running_var",
                        "bn.num_batches_tracked", "fc2.weight"]
    assert "scratch" not in sd           # non-persistent
    assert not sd["fc1.weight"].requires_grad
    res = b.load_state_dict(sd)
    assert res.missing_keys == [] and res.unexpected_keys == []
    assert str(res) == "<All keys matched successfully>"
    x = torch.randn(5, 4)
    a.eval(), b.eval()
    np.testing.assert_allclose(a(x).detach().numpy(), b(x).detach().numpy())
    # the loaded values are copies, not aliases
    sd["fc1.weight"].fill_(0)
    assert b.fc1.weight.abs().sum().item() > 0


def test_load_state_dict_errors():
    m = Net()
    sd = m.state_dict()
    sd["fc1.weight"] = torch.zeros(5, 4)
    with pytest.raises(RuntimeError) as e:
        m.load_state_dict(sd)
    msg = str(e.value)
    assert msg.startswith("Error(s) in loading state_dict for Net:")
    assert ("size mismatch for fc1.weight: copying a param with shape "
            "dtorch.Size([5, 4]) from checkpoint, the shape in current model "
            "is dtorch.Size([3, 4]).") in msg
    sd = m.state_dict()
    del sd["fc2.weight"]
    sd["extra.weight"] = torch.zeros(1)
    with pytest.raises(RuntimeError) as e:
        m.load_state_dict(sd)
    assert 'Missing key(s) in state_dict: "fc2.weight".' in str(e.value)
    assert 'Unexpected key(s) in state_dict: "extra.weight".' in str(e.value)
    res = m.load_state_dict(sd, strict=False)   # reports, does not raise
    assert res.missing_keys == ["fc2.weight"]
    assert res.unexpected_keys == ["extra.weight"]


def test_train_eval_zero_grad_apply_requires_grad():
    m = Net()
    assert m.training and m.bn.training
    m.eval()
    assert not m.training and not m.bn.training
    m.train()
    m(torch.randn(4, 4)).sum().backward()
    assert m.fc1.weight.grad is not None
    m.zero_grad(set_to_none=False)
    assert m.fc1.weight.grad.abs().sum().item() == 0
    m.zero_grad()
    assert m.fc1.weight.grad is None
    seen = []
    m.apply(lambda mod: seen.append(type(mod).__name__))
    assert seen == ["Linear", "BatchNorm1d", "Linear", "Net"]
    m.requires_grad_(False)
    assert not any(p.requires_grad for p in m.parameters())


def test_to_dtype_keeps_parameter_objects():
    m = Net()
    w = m.fc1.weight
    m.double()
    assert m.fc1.weight is w and w.dtype == torch.float64
    assert m.bn.running_mean.dtype == torch.float64
    assert m.bn.num_batches_tracked.dtype == torch.int64
    m.to(torch.float32)
    assert w.dtype == torch.float32
    m.to("cpu")
    with pytest.raises(TypeError, match="floating point"):
        m.to(torch.int64)
    m.half()
    assert w.dtype == torch.float16
    m.float()


def test_hooks():
    m = nn.Linear(3, 2)
    calls = []
    h1 = m.register_forward_pre_hook(
        lambda mod, args: calls.append("pre") or (args[0] * 0,))
    h2 = m.register_forward_hook(
        lambda mod, args, out: calls.append("post") or out + 1)
    out = m(torch.ones(1, 3))
    assert calls == ["pre", "post"]
    np.testing.assert_allclose(out.detach().numpy(),
                               m.bias.detach().numpy()[None] + 1, rtol=1e-6)
    h1.remove()
    h2.remove()
    out = m(torch.ones(1, 3))
    assert calls == ["pre", "post"]
    h = m.register_forward_hook(lambda mod, a, kw, o: o * 2,
                                with_kwargs=True)
    base = m.forward(torch.ones(1, 3))
    np.testing.assert_allclose(m(torch.ones(1, 3)).detach().numpy(),
                               2 * base.detach().numpy())
    h.remove()


def test_repr_like_pytorch():
    m = nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Flatten(), nn.Linear(10, 2, bias=False),
                      nn.Dropout(0.1))
    assert repr(m) == (
        "Sequential(\n"
        "  (0): Conv2d(1, 32, kernel_size=(3, 3), stride=(1, 1))\n"
        "  (1): ReLU()\n"
        "  (2): MaxPool2d(kernel_size=2, stride=2, padding=0, dilation=1, "
        "ceil_mode=False)\n"
        "  (3): Flatten(start_dim=1, end_dim=-1)\n"
        "  (4): Linear(in_features=10, out_features=2, bias=False)\n"
        "  (5): Dropout(p=0.1, inplace=False)\n"
        ")")
    assert repr(nn.LSTM(10, 20, 2, batch_first=True)) == \
        "LSTM(10, 20, num_layers=2, batch_first=True)"
    assert repr(nn.Embedding(10, 3, padding_idx=0)) == \
        "Embedding(10, 3, padding_idx=0)"
    assert repr(nn.BatchNorm2d(4)) == ("BatchNorm2d(4, eps=1e-05, "
                                       "momentum=0.1, affine=True, "
                                       "track_running_stats=True)")
    assert repr(nn.LayerNorm(8)) == \
        "LayerNorm((8,), eps=1e-05, elementwise_affine=True)"
    assert repr(nn.Conv2d(2, 4, 3, stride=2, padding=1, groups=2,
                          bias=False)) == (
        "Conv2d(2, 4, kernel_size=(3, 3), stride=(2, 2), padding=(1, 1), "
        "groups=2, bias=False)")
    nested = nn.ModuleDict({"enc": nn.Sequential(nn.Linear(1, 1))})
    assert repr(nested) == ("ModuleDict(\n  (enc): Sequential(\n    (0): "
                            "Linear(in_features=1, out_features=1, "
                            "bias=True)\n  )\n)")


def test_containers():
    s = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    assert isinstance(s[0], nn.Linear) and isinstance(s[-1], nn.Linear)
    sub = s[1:]
    assert isinstance(sub, nn.Sequential) and len(sub) == 2
    assert list(sub._modules) == ["1", "2"]
    s.append(nn.Sigmoid())
    assert len(s) == 4 and list(s.state_dict()) == [
        "0.weight", "0.bias", "2.weight", "2.bias"]
    del s[1]
    assert list(s._modules) == ["0", "1", "2"]
    od = nn.Sequential(OrderedDict([("a", nn.Linear(1, 1)),
                                    ("b", nn.Tanh())]))
    assert list(od.state_dict()) == ["a.weight", "a.bias"]
    ml = nn.ModuleList([nn.Linear(1, 1) for _ in range(3)])
    ml.append(nn.Linear(1, 2))
    assert len(ml) == 4 and len(list(ml.parameters())) == 8
    assert ml[-1].out_features == 2
    md = nn.ModuleDict({"x": nn.Linear(1, 1)})
    md["y"] = nn.ReLU()
    assert list(md.keys()) == ["x", "y"] and "x" in md
    pl = nn.ParameterList([nn.Parameter(torch.zeros(2)) for _ in range(2)])
    assert len(list(pl.parameters())) == 2


def test_default_initialisation_statistics():
    torch.manual_seed(0)
    lin = nn.Linear(400, 300)
    bound = 1 / math.sqrt(400)
    w = lin.weight.detach().numpy()
    assert w.max() <= bound and w.min() >= -bound
    assert abs(w.std() - bound / math.sqrt(3)) < 0.02 * bound
    b = lin.bias.detach().numpy()
    assert b.max() <= bound and b.min() >= -bound
    conv = nn.Conv2d(16, 8, 3)
    cb = 1 / math.sqrt(16 * 9)
    assert conv.weight.abs().max().item() <= cb
    emb = nn.Embedding(1000, 20, padding_idx=3)
    assert abs(emb.weight.detach().numpy().std() - 1) < 0.05
    assert emb.weight[3].abs().sum().item() == 0
    lstm = nn.LSTM(10, 25)
    assert all(p.abs().max().item() <= 0.2 for p in lstm.parameters())


def test_init_functions():
    from dtorch.nn import init
    w = torch.empty(64, 32)
    assert init.calculate_gain("relu") == math.sqrt(2)
    assert init.calculate_gain("leaky_relu", 0.2) == math.sqrt(2 / 1.04)
    assert init._calculate_fan_in_and_fan_out(torch.empty(8, 4, 3, 3)) == \
        (36, 72)
    init.xavier_uniform_(w)
    a = math.sqrt(6 / 96)
    assert w.abs().max().item() <= a
    init.kaiming_normal_(w, mode="fan_out", nonlinearity="relu")
    assert abs(w.numpy().std() - math.sqrt(2 / 64)) < 0.02
    init.orthogonal_(w)
    np.testing.assert_allclose(w.numpy().T @ w.numpy(), np.eye(32),
                               atol=1e-5)
    init.trunc_normal_(w, std=1.0, a=-0.5, b=0.5)
    assert w.abs().max().item() <= 0.5
    init.eye_(w)
    assert w.sum().item() == 32
    init.constant_(w, 0.3)
    assert np.allclose(w.numpy(), 0.3)
    p = nn.Parameter(torch.empty(3, 3))
    init.normal_(p)               # works on leaves that require grad
    assert p.grad_fn is None and p.requires_grad
    with pytest.raises(ValueError, match="fewer than 2 dimensions"):
        init.xavier_uniform_(torch.empty(3))


def test_clip_grad_norm_and_value():
    from dtorch.nn.utils import (clip_grad_norm_, clip_grad_value_,
                                 parameters_to_vector, vector_to_parameters)
    p1 = nn.Parameter(torch.zeros(3))
    p2 = nn.Parameter(torch.zeros(4))
    p1.grad = torch.tensor([3.0, 0.0, 0.0])
    p2.grad = torch.tensor([0.0, 4.0, 0.0, 0.0])
    total = clip_grad_norm_([p1, p2], 1.0)
    assert abs(total.item() - 5.0) < 1e-6
    g = np.concatenate([p1.grad.numpy(), p2.grad.numpy()])
    assert abs(np.linalg.norm(g) - 1.0) < 1e-5
    # below the threshold: unchanged
    p1.grad = torch.tensor([0.1, 0.0, 0.0])
    clip_grad_norm_(p1, 1.0)
    assert abs(p1.grad[0].item() - 0.1) < 1e-7
    p2.grad = torch.tensor([1.0, -7.0, 2.0, 0.0])
    t = clip_grad_norm_([p2], 3.5, norm_type=float("inf"))
    assert t.item() == 7.0
    np.testing.assert_allclose(p2.grad.numpy(),
                               np.array([1.0, -7.0, 2.0, 0.0]) * 3.5 / (7 + 1e-6),
                               rtol=1e-6)
    p2.grad = torch.tensor([float("nan"), 1.0, 0.0, 0.0])
    with pytest.raises(RuntimeError, match="non-finite"):
        clip_grad_norm_(p2, 1.0, error_if_nonfinite=True)
    p2.grad = torch.tensor([5.0, -5.0, 0.5, 0.0])
    clip_grad_value_(p2, 1.0)
    np.testing.assert_allclose(p2.grad.numpy(), [1.0, -1.0, 0.5, 0.0])
    # a plugged-in (e.g. global) norm
    p1.grad = torch.tensor([2.0, 0.0, 0.0])
    clip_grad_norm_([p1], 1.0, total_norm_fn=lambda g, p, e:
                    torch.tensor(4.0))
    assert abs(p1.grad[0].item() - 0.5) < 1e-6
    v = parameters_to_vector([p1, p2])
    assert v.shape == (7,)
    vector_to_parameters(torch.arange(7.0), [p1, p2])
    np.testing.assert_allclose(p2.detach().numpy(), [3, 4, 5, 6])

"""kaiming_uniform_'s bound is PyTorch's to the bit: sqrt(3) * std with
std = gain / sqrt(fan), rounded in that order (dtorch computed
sqrt(3) * gain / sqrt(fan), one ulp off for about a quarter of fans)."""
import math

import pytest

import dtorch
from dtorch.nn import init


@pytest.mark.parametrize("fan_in", [3, 7, 10, 75, 300])
def test_kaiming_uniform_bound_is_torchs(fan_in, monkeypatch):
    torch = pytest.importorskip("torch")
    seen = []
    monkeypatch.setattr(init, "uniform_",
                        lambda t, a, b, g=None: seen.append(b) or t)
    init.kaiming_uniform_(dtorch.empty(4, fan_in), a=math.sqrt(5))
    gain = torch.nn.init.calculate_gain("leaky_relu", math.sqrt(5))
    assert seen == [math.sqrt(3.0) * (gain / math.sqrt(fan_in))]


def test_kaiming_zero_element_warns_and_returns_the_tensor():
    t = dtorch.empty(0, 3)
    for fn in (init.kaiming_uniform_, init.kaiming_normal_):
        with pytest.warns(UserWarning, match="zero-element"):
            assert fn(t) is t

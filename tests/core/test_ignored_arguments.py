"""PyTorch keyword arguments that dtorch accepts but does not act on warn
once, naming the argument; given their default (or a value that means the
same here) they are silent."""
import warnings

import pytest

import dtorch
import dtorch.distributed as dist
from dtorch import _ignored, nn
from dtorch.nn.parallel import DistributedDataParallel as DDP


@pytest.fixture(autouse=True)
def fresh():
    _ignored._warned.clear()
    yield
    _ignored._warned.clear()


def _ddp_warnings(**kw):
    def body(rank, n):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            DDP(nn.Linear(2, 2), **kw)
            DDP(nn.Linear(2, 2), **kw)       # once per process
        return [str(x.message) for x in w if x.category is UserWarning]
    return dist.spawn_threads(body, 1)[0]


@pytest.mark.parametrize("kw, name", [
    ({"static_graph": True}, "static_graph"),
    ({"check_reduction": True}, "check_reduction"),
    ({"dim": 1}, "dim"),
    ({"output_device": 0}, "output_device"),
    ({"device_ids": [0], "output_device": 1}, "output_device"),
])
def test_ddp_ignored_argument_warns_once(kw, name):
    msgs = _ddp_warnings(**kw)
    assert len(msgs) == 1, msgs
    assert msgs[0].startswith(f"DistributedDataParallel: argument {name}=")
    assert "has no effect" in msgs[0]


@pytest.mark.parametrize("kw", [
    {}, {"static_graph": False, "check_reduction": False, "dim": 0},
    {"device_ids": [0], "output_device": 0}, {"device_ids": None},
    {"gradient_as_bucket_view": True, "find_unused_parameters": True,
     "broadcast_buffers": False, "bucket_cap_mb": 1, "init_sync": False},
])
def test_ddp_defaults_and_implemented_arguments_are_silent(kw):
    assert _ddp_warnings(**kw) == []


def test_ddp_several_devices_is_an_error():
    def body(rank, n):
        with pytest.raises(ValueError, match="device_ids=.0, 1.: one device"):
            DDP(nn.Linear(2, 2), device_ids=[0, 1])
        return True
    assert dist.spawn_threads(body, 1) == [True]


def test_warning_points_at_the_caller():
    def body(rank, n):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            DDP(nn.Linear(2, 2), static_graph=True)
        return w[0].filename
    assert dist.spawn_threads(body, 1)[0] == __file__


def test_distributed_ignored_arguments():
    def body(rank, n):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            dist.barrier(device_ids=[0])
            dist.barrier(device_ids=[0])
            dist.new_group([0], backend="gloo")
            dist.broadcast_object_list([1], device="cpu")
            dist.barrier()
        return [str(x.message) for x in w]
    msgs = dist.spawn_threads(body, 1)[0]
    assert [m.split(" has no effect")[0] for m in msgs] == [
        "barrier: argument device_ids=[0]",
        "new_group: argument backend='gloo'",
        "broadcast_object_list: argument device='cpu'"]


def test_data_parallel_ignored_arguments():
    with pytest.warns(UserWarning, match="DataParallel: argument dim=1 has "
                      "no effect"):
        nn.DataParallel(nn.Linear(2, 2), dim=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nn.DataParallel(nn.Linear(2, 2), device_ids=[0])
    out = nn.DataParallel(nn.Linear(2, 2))(dtorch.ones(3, 2))
    assert tuple(out.shape) == (3, 2)

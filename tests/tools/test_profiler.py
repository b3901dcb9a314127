"""dtorch.profiler: op and backward events, record_function scopes, module
scopes, shapes, the summary table in PyTorch's layout, Chrome traces,
schedules, sharing the dispatch hook with autocast, and one profile per
rank under DDP (thread ranks)."""
import json

import numpy as np
import pytest

import dtorch
import dtorch.nn as nn
from dtorch.autograd import function as _function
from dtorch.profiler import (profile, record_function, ProfilerActivity,
                             ProfilerAction, schedule)


def _step(model, x):
    with record_function("step"):
        model(x).sum().backward()


def _model():
    dtorch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def test_ops_backward_and_scopes_are_recorded():
    m, x = _model(), dtorch.randn(3, 8)
    with profile(activities=[ProfilerActivity.CPU],
                 record_shapes=True) as p:
        _step(m, x)
    names = [e.name for e in p.events()]
    assert names[0] == "step"
    assert names.count("dtorch::Linear") == 2
    assert "dtorch::Relu" in names
    assert "autograd::engine::evaluate_function: LinearBackward" in names
    ev = {e.name: e for e in p.events()}
    step = ev["step"]
    lin = [e for e in p.events() if e.name == "dtorch::Linear"]
    # nesting: every op ran inside the scope, in time and in the tree
    for e in p.events()[1:]:
        assert e.cpu_parent is step
        assert step.start_us <= e.start_us <= e.end_us <= step.end_us
    assert lin[0].input_shapes == [[3, 8], [16, 8], [16]]
    assert lin[1].input_shapes == [[3, 16], [4, 16], [4]]
    assert step.input_shapes == []
    assert step.self_cpu_time_total == pytest.approx(
        step.cpu_time_total - sum(c.cpu_time_total
                                  for c in step.cpu_children))
    assert all(e.self_cpu_time_total >= 0 for e in p.events())


def test_hook_removed_and_nothing_recorded_outside():
    m, x = _model(), dtorch.randn(2, 8)
    assert _function._hook is None
    with profile() as p:
        assert _function._profile is not None
        m(x)
    assert _function._hook is None and _function._profile is None
    n = len(p.events())
    m(x).sum().backward()
    with record_function("outside"):      # no profile: nothing, no error
        m(x)
    assert len(p.events()) == n


def test_key_averages_and_table_layout_match_torch():
    torch = pytest.importorskip("torch")
    from torch.profiler import profile as tprofile
    m, x = _model(), dtorch.randn(3, 8)
    with profile(record_shapes=True) as p:
        for _ in range(3):
            _step(m, x)
    avg = {a.key: a for a in p.key_averages()}
    assert avg["dtorch::Linear"].count == 6
    assert avg["step"].count == 3
    total = sum(a.self_cpu_time_total for a in avg.values())
    assert total == pytest.approx(
        sum(e.cpu_time_total for e in p.events() if e.name == "step"))
    table = p.key_averages().table(sort_by="self_cpu_time_total",
                                   row_limit=5)
    lines = table.rstrip("\n").split("\n")
    tm = torch.nn.Linear(8, 4)
    with tprofile(record_shapes=True) as tp:
        tm(torch.randn(3, 8))
    tlines = tp.key_averages().table(sort_by="self_cpu_time_total",
                                     row_limit=5).rstrip("\n").split("\n")
    # same frame: dashes, header, dashes, rows, dashes, total line
    assert lines[1].split() == tlines[1].split()
    assert set(lines[0]) == set(tlines[0]) == {"-", " "}
    assert lines[0] == lines[2] == lines[-2]
    assert [len(c) for c in lines[0].split("  ")[1:-1]] == \
        [len(c) for c in tlines[0].split("  ")[1:-1]]
    assert lines[-1].startswith("Self CPU time total: ")
    assert tlines[-1].startswith("Self CPU time total: ")
    rows = lines[3:-2]
    assert len(rows) == 5
    # sorted by self CPU time, descending, and each row right-aligned
    # under the frame
    selfs = [a.self_cpu_time_total for a in sorted(
        p.key_averages(), key=lambda a: -a.self_cpu_time_total)][:5]
    assert selfs == sorted(selfs, reverse=True)
    assert all(len(r) == len(lines[0]) for r in rows)
    assert rows[0].split()[-1].isdigit()
    # grouped by input shape: the column appears with the shapes
    g = p.key_averages(group_by_input_shape=True).table(
        sort_by="cpu_time_total")
    assert "Input Shapes" in g and "[[3, 8], [16, 8], [16]]" in g
    with pytest.raises(AttributeError, match="sort_by"):
        p.key_averages().table(sort_by="no_such_column")


def test_chrome_trace(tmp_path):
    m, x = _model(), dtorch.randn(2, 8)
    with profile(record_shapes=True) as p:
        _step(m, x)
    path = tmp_path / "trace.json"
    p.export_chrome_trace(str(path))
    doc = json.loads(path.read_text())
    evs = doc["traceEvents"]
    assert len(evs) == len(p.events())
    assert all(e["ph"] == "X" and e["dur"] >= 0 for e in evs)
    step = next(e for e in evs if e["name"] == "step")
    assert step["cat"] == "user_annotation"
    lin = next(e for e in evs if e["name"] == "dtorch::Linear")
    assert lin["cat"] == "cpu_op"
    assert lin["args"]["Input Dims"] == [[2, 8], [16, 8], [16]]
    assert step["ts"] <= lin["ts"] and \
        lin["ts"] + lin["dur"] <= step["ts"] + step["dur"] + 1e-3


def test_with_modules_and_record_function_decorator():
    m, x = _model(), dtorch.randn(2, 8)

    @record_function("fwd")
    def fwd():
        return m(x)

    with profile(with_modules=True) as p:
        fwd()
    names = [e.name for e in p.events()]
    assert names[:3] == ["fwd", "nn.Module: Sequential", "nn.Module: Linear"]
    assert names.count("nn.Module: Linear") == 2
    lin_mod = [e for e in p.events() if e.name == "nn.Module: Linear"][0]
    assert [c.name for c in lin_mod.cpu_children] == ["dtorch::Linear"]
    from dtorch.nn.modules import module as M
    assert not any(isinstance(k, tuple) and k[0] == "dtorch.profiler"
                   for k in M._global_forward_pre_hooks)


def test_autocast_inside_a_profile_shares_the_hook():
    x, w = dtorch.randn(4, 8), dtorch.randn(8, 8)
    with profile() as p:
        with dtorch.autocast("cpu"):
            y = nn.functional.linear(x, w)
        assert _function._hook is _function._profile   # profiler still on
        z = nn.functional.linear(x, w)
    assert y.dtype is dtorch.bfloat16 and z.dtype is dtorch.float32
    names = [e.name for e in p.events()]
    assert names.count("dtorch::Linear") == 2      # each op once
    first = next(e for e in p.events() if e.name == "dtorch::Linear")
    assert [c.name for c in first.cpu_children] == ["dtorch::Cast"] * 2
    assert _function._hook is None and _function._autocast is None
    # and a profile opened inside an autocast region
    with dtorch.autocast("cpu"):
        with profile() as p2:
            y = nn.functional.linear(x, w)
        assert _function._hook is _function._autocast
        assert nn.functional.linear(x, w).dtype is dtorch.bfloat16
    assert y.dtype is dtorch.bfloat16
    assert "dtorch::Linear" in [e.name for e in p2.events()]


def test_custom_function_and_exception_inside():
    class Twice(dtorch.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            return a * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    a = dtorch.randn(3, requires_grad=True)
    with profile() as p:
        Twice.apply(a).sum().backward()
        with pytest.raises(RuntimeError):
            with record_function("fails"):
                dtorch.randn(2, 3) @ dtorch.randn(4, 5)
    names = [e.name for e in p.events()]
    assert "Twice" in names
    tw = next(e for e in p.events() if e.name == "Twice")
    assert [c.name for c in tw.cpu_children] == ["dtorch::Mul"]
    assert "autograd::engine::evaluate_function: TwiceBackward" in names
    fails = next(e for e in p.events() if e.name == "fails")
    assert fails.end_us >= fails.start_us
    np.testing.assert_allclose(a.grad.numpy(), 2.0)


def test_schedule_records_active_steps_only():
    fn = schedule(wait=1, warmup=1, active=2, repeat=2)
    assert [fn(i) for i in range(9)] == [
        ProfilerAction.NONE, ProfilerAction.WARMUP, ProfilerAction.RECORD,
        ProfilerAction.RECORD_AND_SAVE, ProfilerAction.NONE,
        ProfilerAction.WARMUP, ProfilerAction.RECORD,
        ProfilerAction.RECORD_AND_SAVE, ProfilerAction.NONE]
    seen = []
    x = dtorch.randn(2, 2)

    def ready(prof):
        seen.append([e.name for e in prof.events()])

    with profile(schedule=fn, on_trace_ready=ready) as p:
        for step in range(9):
            with record_function(f"step{step}"):
                x + x
            p.step()
    assert seen == [["step2", "dtorch::Add", "step3", "dtorch::Add"],
                    ["step6", "dtorch::Add", "step7", "dtorch::Add"]]
    with pytest.raises(ValueError):
        schedule(wait=0, warmup=0, active=0)


def test_errors():
    with pytest.raises(TypeError, match="ProfilerActivity"):
        profile(activities=["cpu"])
    with profile():
        with pytest.raises(RuntimeError, match="already recording"):
            with profile():
                pass
    assert _function._hook is None
    with pytest.raises(TypeError, match="str"):
        record_function(3)


def test_one_profile_per_rank_under_ddp(tmp_path):
    import dtorch.distributed as dist
    from dtorch.nn.parallel import DistributedDataParallel as DDP

    def body(rank, world):
        dtorch.manual_seed(0)
        model = DDP(nn.Linear(4, 2))
        x = dtorch.randn(3, 4) + rank
        with profile(record_shapes=True) as p:
            with record_function(f"rank{rank}_step"):
                model(x).sum().backward()
        path = tmp_path / f"rank{rank}.json"
        p.export_chrome_trace(str(path))
        return p.rank, [e.name for e in p.events()], \
            json.loads(path.read_text())["distributedInfo"]

    res = dist.spawn_threads(body, 2, timeout=60)
    for rank, (prank, names, info) in enumerate(res):
        assert prank == rank and info["rank"] == rank
        assert info["world_size"] == 2
        assert names[0] == f"rank{rank}_step"
        assert f"rank{1 - rank}_step" not in names   # its own events only
        assert "dtorch::Linear" in names
        assert any(n.endswith("LinearBackward") for n in names)
    assert _function._hook is None


@pytest.mark.mpi(min_size=2)
def test_each_mpi_rank_profiles_its_own_ddp_step(mpi_world, tmp_path):
    from dtorch.nn.parallel import DistributedDataParallel as DDP
    dist = mpi_world
    rank = dist.get_rank()
    dtorch.manual_seed(0)
    model = DDP(nn.Linear(4, 2))
    with profile(record_shapes=True) as p:
        with record_function(f"rank{rank}_step"):
            model(dtorch.randn(3, 4) + rank).sum().backward()
    path = tmp_path / f"rank{rank}.json"
    p.export_chrome_trace(str(path))
    doc = json.loads(path.read_text())
    assert doc["distributedInfo"]["rank"] == rank
    assert doc["distributedInfo"]["world_size"] == dist.get_world_size()
    names = [e["name"] for e in doc["traceEvents"]]
    assert names[0] == f"rank{rank}_step" and "dtorch::Linear" in names
    assert all(e["args"]["rank"] == rank for e in doc["traceEvents"])


def test_on_the_device(device):
    m = nn.Linear(4, 3).to(device)
    with profile(record_shapes=True) as p:
        m(dtorch.randn(2, 4, device=device)).sum().backward()
    names = [e.name for e in p.events()]
    assert "dtorch::Linear" in names
    assert any(n.endswith("LinearBackward") for n in names)
    assert _function._hook is None


def test_arguments_without_effect_warn():
    import dtorch._ignored as ig
    ig._warned.clear()
    with pytest.warns(UserWarning, match="profile_memory=True has no effect"):
        with profile(profile_memory=True):
            pass
    with pytest.warns(UserWarning, match="no kernel timings"):
        profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])

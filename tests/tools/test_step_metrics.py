"""dtorch.utils.step_metrics: the phase breakdown, rates, MFU from the
counted FLOPs, the JSON lines and TensorBoard agreeing, optimizer step
hooks (torch's API) that it is built on."""
import importlib
import json
import os
import time

import numpy as np
import pytest

import dtorch
import dtorch.nn as nn
from dtorch.utils.step_metrics import StepMetrics, measure_peak_flops


class Slow(nn.Module):
    """An MLP whose forward also sleeps: a phase of known length."""

    def __init__(self, sleep=0.0):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 4)
        self.sleep = sleep

    def forward(self, x):
        if self.sleep:
            time.sleep(self.sleep)
        return self.fc2(dtorch.relu(self.fc1(x)))


def loader(n, batch=8, sleep=0.0):
    rng = np.random.default_rng(0)
    for _ in range(n):
        if sleep:
            time.sleep(sleep)
        yield (dtorch.tensor(rng.standard_normal((batch, 16)),
                             dtype=dtorch.float32),
               dtorch.tensor(rng.integers(0, 4, batch)))


def train(metrics, model, opt, batches):
    for x, y in metrics.data(batches):
        with metrics.step() as rec:
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            rec["loss"] = loss.item()


def test_phases_rates_and_mfu(tmp_path, capsys):
    model = Slow(sleep=0.02)
    opt = dtorch.optim.SGD(model.parameters(), lr=0.1)
    m = StepMetrics(model, opt, samples_per_step=8, peak_flops=1e9,
                    log_dir=str(tmp_path), print_every=2)
    # a known optimizer phase: a pre-hook registered after the metrics'
    # runs inside the timed step (hooks run in registration order)
    opt.register_step_pre_hook(lambda o, a, k: time.sleep(0.01))
    train(m, model, opt, loader(4, sleep=0.03))
    m.close()
    recs = m.records
    assert len(recs) == 4
    for r in recs:
        assert r["data_s"] >= 0.03 and r["forward_s"] >= 0.02
        # the pre-hook's sleep runs inside the timed optimizer step
        assert r["optimizer_s"] >= 0.01
        total = sum(r[k] for k in ("forward_s", "backward_s", "comm_wait_s",
                                   "optimizer_s", "other_s"))
        assert total == pytest.approx(r["step_s"], rel=1e-6, abs=1e-6)
        assert r["samples_per_s"] == pytest.approx(
            8 / (r["step_s"] + r["data_s"]))
    # FLOPs counted in the first step: forward 2*8*(16*32+32*4), backward
    # the weight gradients of both layers and the hidden activation's
    fwd = 2 * 8 * (16 * 32 + 32 * 4)
    flops = fwd + 2 * 8 * (16 * 32 + 32 * 4) + 2 * 8 * 32 * 4
    assert m.flops_per_step == flops
    r = recs[-1]
    assert r["mfu"] == pytest.approx(
        flops / (r["step_s"] + r["data_s"]) / 1e9)
    assert r["peak_memory_bytes"] > 0
    # progress lines every 2 steps
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and out[0].startswith("step 2 |") and "MFU" in out[0]
    # the JSON lines hold the same records
    with open(os.path.join(tmp_path, "metrics.jsonl")) as f:
        lines = [json.loads(line) for line in f]
    assert lines == recs


def test_tensorboard_holds_the_same_numbers(tmp_path):
    ea = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator")
    model = Slow()
    opt = dtorch.optim.SGD(model.parameters(), lr=0.1)
    m = StepMetrics(model, opt, tokens_per_step=8, log_dir=str(tmp_path),
                    print_every=0)
    train(m, model, opt, loader(3))
    m.close()
    acc = ea.EventAccumulator(str(tmp_path))
    acc.Reload()
    for key in ("step_s", "forward_s", "loss", "tokens_per_s", "mfu"):
        got = [e.value for e in acc.Scalars(f"step/{key}")]
        want = [r[key] for r in m.records]
        assert got == pytest.approx(want, rel=1e-6), key


def test_ddp_comm_wait_is_measured():
    from dtorch.distributed import spawn_threads
    from dtorch.nn.parallel import DistributedDataParallel as DDP
    import dtorch.distributed as dist
    out = {}

    def rank(r, world):
        dtorch.manual_seed(0)
        model = DDP(Slow())
        opt = dtorch.optim.SGD(model.parameters(), lr=0.1)
        m = StepMetrics(model, opt, samples_per_step=8, peak_flops=1e9,
                        print_every=0)
        train(m, model, opt, loader(3))
        out[dist.get_rank()] = m.records
    spawn_threads(rank, 2)
    for recs in out.values():
        assert len(recs) == 3
        assert not any("stragglers" in r for r in recs)
        assert all(r["comm_wait_s"] >= 0 for r in recs)
        assert all("comm_wait_s" in r and r["backward_s"] >= 0 for r in recs)


def test_steps_do_not_nest_and_hooks_go_away():
    model = Slow()
    opt = dtorch.optim.SGD(model.parameters(), lr=0.1)
    m = StepMetrics(model, opt, flops_per_step=0, print_every=0)
    with m.step():
        with pytest.raises(RuntimeError, match="already open"):
            with m.step():
                pass
    m.close()
    assert not model._forward_pre_hooks and not model._forward_hooks
    assert not opt.__dict__.get("_step_pre_hooks")


def test_optimizer_step_hooks_as_torch():
    torch = pytest.importorskip("torch")
    calls = {}
    for lib in (torch, dtorch):
        p = lib.nn.Parameter(lib.ones(2))
        p.grad = lib.ones(2)
        opts = [lib.optim.SGD([p], lr=0.5), lib.optim.LBFGS([p])]
        seen = []
        om = importlib.import_module(lib.__name__ + ".optim.optimizer")
        g1 = om.register_optimizer_step_pre_hook(
            lambda o, a, k: seen.append(("global-pre", type(o).__name__)))
        h1 = opts[0].register_step_pre_hook(
            lambda o, a, k: seen.append(("pre", len(a), len(k))))
        h2 = opts[0].register_step_post_hook(
            lambda o, a, k: seen.append(("post",)))
        g2 = om.register_optimizer_step_post_hook(
            lambda o, a, k: seen.append(("global-post",)))
        opts[0].step()
        opts[1].step(lambda: (p * p).sum())
        for h in (g1, h1, h2, g2):
            h.remove()
        opts[0].step()
        calls[lib.__name__] = seen
        # a pre-hook's (args, kwargs) replace the step's
        box = []
        opts[0].register_step_pre_hook(
            lambda o, a, k: ((o,), {"closure": lambda: box.append(1) or 0.0}))
        opts[0].step()
        assert box == [1]
    assert calls["dtorch"] == calls["torch"]


def test_measure_peak_flops_is_cached_and_plausible():
    peak = measure_peak_flops(size=128, repeats=2)
    assert measure_peak_flops(size=128, repeats=2) == peak
    assert 1e6 < peak < 1e14

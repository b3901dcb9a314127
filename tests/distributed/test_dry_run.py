"""dtorch-launch --dry-run (dtorch/distributed/dry_run.py) and the byte
ledger it shares with real ranks (dtorch/distributed/_accounting.py,
DTORCH_DRY_RUN_REPORT)."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

import dtorch as torch
import dtorch.distributed as dist
from dtorch.distributed import _accounting, dry_run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
GPT = os.path.join(ROOT, "examples", "gpt.py")
FIGURES = ("parameter_bytes", "gradient_bytes", "optimizer_state_bytes",
           "activation_bytes", "activation_bytes_total", "collective_bytes",
           "collective_calls", "steps")

pytestmark = pytest.mark.skipif(
    "OMPI_COMM_WORLD_SIZE" in os.environ,
    reason="starts its own jobs; run in the single-process phase")


def _env(**extra):
    return dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
                **extra)


def _launch(args, **env):
    return subprocess.run([sys.executable, "-m", "launch"] + list(args),
                          capture_output=True, text=True, timeout=240,
                          cwd=ROOT, env=_env(**env))


def _gpt_args(tmp_path, *layout):
    # --checkpoint under tmp_path: gpt.py deletes and writes it
    return list(layout) + ["--steps", "2", "--sample", "0", "--checkpoint",
                           str(tmp_path / "gpt.safetensors")]


# ------------------------------------------------------------ the launcher

def test_launcher_dry_run_prints_the_table_for_tp2_pp2(tmp_path):
    js = tmp_path / "dry.json"
    p = _launch(["--dry-run", "--nproc-per-node", "4", "--dry-run-json",
                 str(js), GPT] + _gpt_args(tmp_path, "--tp", "2", "--pp",
                                           "2"))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "[rank 0] GPT" in p.stdout and "[rank 1]" not in p.stdout
    table = p.stdout[p.stdout.index("rank  steps"):].splitlines()
    assert table[0].split() == ["rank", "steps", "parameters", "gradients",
                                "optimizer", "activations", "all_reduce",
                                "all_gather", "send", "recv"]
    assert [row.split()[0] for row in table[1:5]] == ["0", "1", "2", "3"]
    rep = json.loads(js.read_text())
    assert rep["world_size"] == 4 and rep["steps"] == 2
    ranks = rep["ranks"]
    for r in ranks:
        assert r["ended"] == "stopped" and r["steps"] == 2
        # AdamW: every parameter has a gradient, two moments and a step
        # count (a float32 scalar per parameter tensor)
        p = r["parameter_bytes"]
        assert r["gradient_bytes"] == p > 0
        assert 2 * p < r["optimizer_state_bytes"] < 2 * p + 1024
        assert r["activation_bytes"] > 0
        assert r["collective_bytes"]["all_reduce"] > 0     # TP
    # mesh (pp, dp, cp, tp): ranks 0, 1 are stage 0, ranks 2, 3 stage 1;
    # what stage 0 sends, stage 1 receives, and back
    for a, b in ((0, 2), (1, 3)):
        ca, cb = ranks[a]["collective_bytes"], ranks[b]["collective_bytes"]
        assert ca["send"] == cb["recv"] > 0 and ca["recv"] == cb["send"] > 0
    # the TP pair of a stage holds shards of equal size
    assert ranks[0]["parameter_bytes"] == ranks[1]["parameter_bytes"]
    assert ranks[0]["parameter_bytes"] != ranks[2]["parameter_bytes"]


def test_launcher_dry_run_bad_layout_exits_nonzero_naming_it(tmp_path):
    ck = tmp_path / "gpt.safetensors"
    p = _launch(["--dry-run", "--nproc-per-node", "4", GPT]
                + _gpt_args(tmp_path, "--tp", "3"))
    assert p.returncode == 1
    assert "dtorch-launch --dry-run: rank " in p.stderr
    assert "--tp 3" in p.stderr and "but the world has 4" in p.stderr
    assert "rank  steps" not in p.stdout and not ck.exists()


def test_dry_run_names_the_rank_and_the_shape_error(tmp_path):
    with pytest.raises(dry_run.DryRunError,
                       match=r"rank \d of 4 failed: ValueError: --n-head 3 "
                             r"is not divisible by --tp 2"):
        dry_run.run(GPT, _gpt_args(tmp_path, "--tp", "2", "--n-head", "3"),
                    nproc_per_node=4)


@pytest.mark.parametrize("layout", [("--pp", "2"), ("--dp", "2")])
def test_predictions_equal_a_real_two_rank_job(tmp_path, layout):
    """A real job of 2 tcp processes under DTORCH_DRY_RUN_REPORT measures,
    with the same ledger, what the dry run predicted."""
    real = tmp_path / "real"
    p = _launch(["--nproc-per-node", "2", GPT] + _gpt_args(tmp_path,
                                                          *layout),
                DTORCH_DRY_RUN_REPORT=str(real))
    assert p.returncode == 0, p.stderr[-3000:]
    rep = dry_run.run(GPT, _gpt_args(tmp_path, *layout), nproc_per_node=2)
    kind = "send" if layout[0] == "--pp" else "all_reduce"
    for pred in rep["ranks"]:
        got = json.loads((real / f"rank{pred['rank']}.json").read_text())
        assert (pred["backend"], got["backend"]) == ("threads", "tcp")
        assert pred["collective_bytes"][kind] > 0
        assert {k: pred[k] for k in FIGURES} == {k: got[k] for k in FIGURES}


# ------------------------------------------- a script written for processes

SCRIPT = textwrap.dedent("""
    import os, signal, sys
    import dtorch as torch
    import dtorch.distributed as dist
    assert not dist.is_initialized()
    dist.init_process_group()
    r, w = dist.get_rank(), dist.get_world_size()
    env = {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                      "LOCAL_WORLD_SIZE", "GROUP_RANK")}
    assert env == {"RANK": str(r), "WORLD_SIZE": str(w),
                   "LOCAL_RANK": str(r % 2), "LOCAL_WORLD_SIZE": "2",
                   "GROUP_RANK": str(r // 2)}, env
    assert os.environ.copy()["RANK"] == str(r) and "RANK" in os.environ
    signal.signal(signal.SIGUSR1, lambda *a: None)     # in a thread
    print(f"hello from {r}")
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.ones(10))
    opt = torch.optim.SGD([w], lr=0.1, momentum=0.9)
    steps, how = int(sys.argv[1]), sys.argv[2]
    if how == "fail" and r == 2:
        raise KeyError("no such column on rank 2")
    if how == "early" and r == 1:
        sys.exit(0)
    for step in range(steps):
        (w * w).sum().backward()
        dist.all_reduce(w.grad)
        opt.step()
        opt.zero_grad()
        print(f"step {step}")
    if how == "exit" and r == 1:
        sys.exit(0)
    dist.destroy_process_group()
""")


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "job.py"
    path.write_text(SCRIPT)
    return str(path)


def test_script_runs_unmodified_and_stops_after_k_steps(script, capsys):
    environ = os.environ
    rep = dry_run.run(script, ["5", "-"], nproc_per_node=2, nnodes=2,
                      steps=2)
    out = capsys.readouterr().out
    assert os.environ is environ and "RANK" not in os.environ
    # the second opt.step() ends the rank: its print does not run
    assert out.splitlines() == ["[rank 0] hello from 0", "[rank 0] step 0"]
    for r in rep["ranks"]:
        assert (r["ended"], r["steps"]) == ("stopped", 2)
        assert r["parameter_bytes"] == r["gradient_bytes"] == 40
        assert r["optimizer_state_bytes"] == 40          # momentum buffer
        assert r["collective_bytes"] == {"all_reduce": 40}
        assert r["collective_calls"] == {"all_reduce": 1}


def test_exit_zero_ends_a_rank_cleanly(script):
    rep = dry_run.run(script, ["1", "exit"], nproc_per_node=2, nnodes=2)
    assert [r["ended"] for r in rep["ranks"]] == [
        "finished", "exited", "finished", "finished"]
    assert "ranks [0, 1, 2, 3] ended before 2" in dry_run.format_table(rep)


def test_an_error_on_one_rank_ends_the_run_naming_it(script):
    with pytest.raises(dry_run.DryRunError,
                       match="rank 2 of 4 failed: KeyError") as e:
        dry_run.run(script, ["3", "fail"], nproc_per_node=2, nnodes=2)
    assert e.value.rank == 2 and e.value.code == 1


def test_a_rank_that_left_early_is_named_not_waited_for(script):
    with pytest.raises(dry_run.DryRunError,
                       match=r"CollectiveTimeoutError: all_reduce .*ranks "
                             r"that did not arrive: \[1\]"):
        dry_run.run(script, ["2", "early"], nproc_per_node=2, nnodes=2,
                    timeout=1)


def test_bad_arguments():
    with pytest.raises(ValueError, match="steps must be >= 1"):
        dry_run.run("x.py", steps=0)
    p = _launch(["--dry-run", "--dry-run-steps", "0", GPT])
    assert p.returncode == 2 and "--dry-run-steps must be >= 1" in p.stderr


# --------------------------------------------------------------- the ledger

class _Save(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        # x and a view of it (one block), a parameter (not an activation)
        ctx.save_for_backward(x, x[1:], w)
        return x * w

    @staticmethod
    def backward(ctx, g):
        x, _, w = ctx.saved_tensors
        return g * w, g * x


def test_activation_bytes_are_what_the_graph_saved():
    led = _accounting.Ledger(0, 1)
    _accounting.start(led)
    try:
        w = torch.nn.Parameter(torch.ones(100, dtype=torch.float64))
        opt = torch.optim.SGD([w], lr=0.1)
        x = torch.randn(100, dtype=torch.float64)
        _Save.apply(x, w).sum().backward()               # 800 B saved
        # a view of a parameter is the parameter's memory
        y = torch.randn(50, dtype=torch.float64)
        _Save.apply(y, w[:50]).sum().backward()          # 400 B
        opt.step()
    finally:
        _accounting.stop()
    rec = led.summary()
    assert rec["activation_bytes"] == 800
    assert rec["activation_bytes_total"] == 1200
    assert rec["parameter_bytes"] == rec["gradient_bytes"] == 800
    assert rec["optimizer_state_bytes"] == 0      # plain SGD keeps none
    # stopped: nothing counts any more
    _Save.apply(x, w).sum().backward()
    assert torch.autograd.function._recorders.get(3) is None


def test_collective_payload_per_kind():
    def body(rank, world):
        led = _accounting.Ledger(rank, world)
        _accounting.start(led)
        try:
            g = dist.group.WORLD
            _accounting.join(g)
            t = torch.ones(10)                              # 40 B
            dist.all_reduce(t)
            dist.all_gather_into_tensor(torch.zeros(20), t)     # input
            dist.reduce_scatter_tensor(t, torch.ones(20))       # input
            dist.broadcast(t, src=0)
            dist.all_to_all_single(torch.zeros(20), torch.ones(20))
            dist.all_reduce_coalesced([t, torch.ones(5)])       # 60 B
            if rank == 0:
                dist.send(t, 1)
            else:
                dist.recv(t, 0)
            sub = dist.new_group([0, 1])                    # inherits
            dist.all_reduce(torch.ones(2, dtype=torch.float64), group=sub)
            dist.barrier()
            w = torch.nn.Parameter(torch.ones(1))
            w.grad = torch.ones(1)
            torch.optim.SGD([w], lr=0.1).step()
        finally:
            _accounting.stop()
        return led.summary()

    recs = dist.spawn_threads(body, 2)
    for rank, rec in enumerate(recs):
        assert rec["collective_bytes"] == {
            "all_reduce": 40 + 60 + 16, "all_gather": 40,
            "reduce_scatter": 80, "broadcast": 40, "all_to_all": 80,
            "barrier": 0, "send" if rank == 0 else "recv": 40}
        assert rec["collective_calls"]["all_reduce"] == 3


def test_real_rank_report_switch(tmp_path, monkeypatch):
    """DTORCH_DRY_RUN_REPORT in a one-rank job: init_process_group opens
    the ledger, each step rewrites DIR/rank0.json."""
    monkeypatch.setenv("DTORCH_DRY_RUN_REPORT", str(tmp_path))
    for k in ("RANK", "WORLD_SIZE", "DTORCH_BACKEND"):
        monkeypatch.delenv(k, raising=False)
    dist.init_process_group()
    try:
        w = torch.nn.Parameter(torch.ones(4))
        opt = torch.optim.Adam([w])
        for _ in range(3):
            (w * w).sum().backward()
            dist.all_reduce(w.grad)
            opt.step()
    finally:
        dist.destroy_process_group()
        _accounting.stop()
    rec = json.loads((tmp_path / "rank0.json").read_text())
    assert rec["steps"] == 3 and len(rec["per_step"]) == 3
    assert rec["collective_bytes"] == {"all_reduce": 16}
    assert rec["parameter_bytes"] == 16
    # two moments and the float32 step count
    assert rec["optimizer_state_bytes"] == 16 + 16 + 4

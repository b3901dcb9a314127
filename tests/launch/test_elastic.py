"""dtorch-launch --elastic / --join and dtorch.distributed.elastic (issue 27):
real launchers and rank processes on loopback, with the small script
tests/launch/elastic_train.py (a tiny MLP) whose ranks log every step they
start and complete; plus the membership protocol with thread members
against an in-process store.

The schedules: 4 ranks -> SIGKILL rank 0 -> 3 -> one joins -> 4 -> SIGKILL
two at once -> 2, under use_deterministic_algorithms(True), ending bitwise
equal to an uninterrupted one-process run; a refused joiner (above MAX, a
different model) and a stop below MIN; a member dying while the group
re-forms.
"""
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections import defaultdict

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tests", "launch", "elastic_train.py")
sys.path.insert(0, ROOT)

from collectives.elastic_store import (ElasticStop, Membership,  # noqa
                                       host_init, key)
from collectives.store import TCPStore  # noqa: E402
from launch import cli  # noqa: E402
from launch.local import _caused_by_peer, first_cause  # noqa: E402


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(token):
    env = dict(os.environ, PYTHONPATH=ROOT, DTORCH_RDZV_TOKEN=token,
               DTORCH_ELASTIC_FORM_TIMEOUT="4", DTORCH_ELASTIC_TIMEOUT="20")
    env.pop("DTORCH_ELASTIC", None)
    return env


class Launcher:
    """A dtorch-launch process whose stderr is collected as it comes."""

    def __init__(self, args, env, wrap=None):
        cmd = [sys.executable, "-m", "launch"] + args
        self.p = subprocess.Popen(
            wrap(cmd) if wrap else cmd, env=env, cwd=ROOT,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True)
        self.err, self.out = [], []
        self._t = [threading.Thread(target=self._pump, args=(s, b),
                                    daemon=True)
                   for s, b in ((self.p.stderr, self.err),
                                (self.p.stdout, self.out))]
        for t in self._t:
            t.start()

    def _pump(self, stream, buf):
        for line in stream:
            buf.append(line)

    def wait_for(self, text, timeout=60):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if any(text in ln for ln in self.err):
                return
            if self.p.poll() is not None:
                break
            time.sleep(0.05)
        self.kill()
        raise AssertionError(f"no {text!r} from the launcher:\n"
                             + "".join(self.err))

    def finish(self, timeout=120):
        try:
            self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        for t in self._t:
            t.join(5)
        return self.p.returncode, "".join(self.err), "".join(self.out)

    def kill(self):
        if self.p.poll() is None:
            self.p.terminate()      # the launcher stops its own ranks
            self.p.wait(30)


def _events(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _check_exactly_once(events, n, epochs):
    """Every sample of every epoch in exactly one completed step."""
    done = {(e["round"], e["step"]) for e in events if e["event"] == "done"}
    got = defaultdict(list)
    for e in events:
        if e["event"] == "begin" and (e["round"], e["step"]) in done:
            got[e["epoch"]] += e["ids"]
    assert sorted(got) == list(range(epochs))
    for ep, ids in got.items():
        assert sorted(ids) == list(range(n)), (ep, len(ids))


def _one_start_per_member(events):
    """No process restarted: each member started once, kept its pid."""
    pids = defaultdict(set)
    starts = defaultdict(int)
    for e in events:
        pids[e["uid"]].add(e["pid"])
        starts[e["uid"]] += e["event"] == "start"
    assert all(len(p) == 1 for p in pids.values()), pids
    assert all(c == 1 for c in starts.values()), starts
    return {u: next(iter(p)) for u, p in pids.items()}


def test_kill_rank0_join_kill_two_bitwise(tmp_path):
    """4 -> SIGKILL rank 0 -> 3 -> +1 joiner -> 4 -> SIGKILL two at once
    -> 2; deterministic, bitwise equal to one uninterrupted process."""
    log, out = tmp_path / "steps.jsonl", tmp_path / "elastic.npz"
    port, env = _port(), _env("t-bitwise")
    common = [SCRIPT, "--deterministic", "--samples", "96", "--epochs", "2",
              "--log", str(log), "--kill", "0:1", "--hold", "3:join",
              "--kill-after-join", "2,4"]
    code, err, jcode, jerr = _four_and_a_joiner("2:5", port, env, common,
                                                out, "elastic round 1:")
    assert code == 0, err + jerr
    assert jcode != 0 and "member 4" in jerr, jerr   # the joiner was killed
    assert ("elastic round 1: lost rank 0 (member 0: was killed by SIGKILL"
            in err and "new world size 3 (was 4)" in err), err
    assert "elastic round 2: 1 joined (member(s) 4); new world size 4" \
        in err, err
    assert "new world size 2 (was 4)" in err and "member 2:" in err, err
    ev = _events(log)
    pids = _one_start_per_member(ev)
    assert sorted(pids) == [0, 1, 2, 3, 4]
    ends = sorted(e["uid"] for e in ev if e["event"] == "end")
    assert ends == [1, 3]                      # the survivors, to the end
    assert {e["world"] for e in ev if e["event"] == "begin"} >= {4, 3, 2}
    _check_exactly_once(ev, 96, 2)
    _assert_bitwise_uninterrupted(out, tmp_path, env, [])


def _four_and_a_joiner(elastic, port, env, common, out, after):
    """A 4-rank elastic job and, once its launcher said ``after``, one
    joiner: (code, stderr) of each."""
    host = Launcher(["--elastic", elastic, "--nproc-per-node", "4",
                     "--master-port", str(port)] + common
                    + ["--out", str(out)], env)
    host.wait_for(after)
    joiner = Launcher(["--join", "--master-port", str(port)] + common, env)
    jcode, jerr, _ = joiner.finish()
    code, err, _ = host.finish()
    return code, err, jcode, jerr


def _assert_bitwise_uninterrupted(out, tmp_path, env, extra):
    """The parameters in ``out`` are bitwise those of the same global
    batch in one process, never interrupted."""
    ref = tmp_path / "ref.npz"
    e1 = dict(env)
    for k in ("MASTER_PORT", "RANK", "WORLD_SIZE"):
        e1.pop(k, None)
    subprocess.run([sys.executable, SCRIPT, "--deterministic", "--samples",
                    "96", "--epochs", "2", "--out", str(ref)] + extra,
                   env=e1, check=True, cwd=ROOT, timeout=120)
    a, b = np.load(out), np.load(ref)
    assert sorted(a.files) == sorted(b.files)
    for k in a.files:
        assert a[k].tobytes() == b[k].tobytes(), k


def test_refused_joiners_and_stop_below_min(tmp_path):
    """Above MAX and a different model are refused with the reason; the
    job stops (non-zero, saying why) when fewer than MIN are left."""
    log, flag = tmp_path / "steps.jsonl", tmp_path / "go"
    port, env = _port(), _env("t-refuse")
    common = [SCRIPT, "--samples", "48", "--epochs", "3", "--log", str(log)]
    host = Launcher(["--elastic", "2:3", "--nproc-per-node", "3",
                     "--master-port", str(port)] + common
                    + ["--hold", f"3:{flag}", "--kill", "2:2,1:4"], env)
    # full (3 of 3): refused before any rank starts
    full = Launcher(["--join", "--master-port", str(port)] + common, env)
    code, err, _ = full.finish()
    assert code != 0 and "--join refused" in err \
        and "maximum 3 (--elastic 2:3)" in err, err
    host.wait_for("elastic round 1:")           # rank 2 died: 2 of 3
    other = Launcher(["--join", "--master-port", str(port)] + common
                     + ["--hidden", "32"], env)
    code, err, _ = other.finish()
    assert code != 0 and "cannot join the elastic job" in err
    assert "parameters.0.weight is [[32, 8]" in err \
        and "[[16, 8], 'dtorch.float32'] in the job" in err, err
    flag.write_text("go")
    code, err, _ = host.finish()
    assert code != 0
    assert "below the minimum 2 of --elastic 2:3; the job stops" in err, err
    ev = _events(log)
    _one_start_per_member(ev)
    assert not [e for e in ev if e["event"] == "end"]


def test_death_while_the_group_reforms(tmp_path):
    """Rank 0 is killed; member 3 checks in for the new round and dies
    before the group forms: the survivors form a further round and
    finish; member 2 dies after the last step (while the others would
    evaluate): the last collective of job.close() drops it, so the job's
    final membership finished and the exit code is 0."""
    log = tmp_path / "steps.jsonl"
    port, env = _port(), _env("t-reform")
    host = Launcher(["--elastic", "1:4", "--nproc-per-node", "4",
                     "--master-port", str(port), SCRIPT, "--samples", "48",
                     "--epochs", "2", "--log", str(log), "--kill", "0:1",
                     "--die-in-reform", "3", "--kill-at-end", "2"], env)
    code, err, _ = host.finish()
    assert code == 0, err
    assert "member 3 (pid" in err and "exited with code 7" in err, err
    assert "new world size 2" in err, err
    assert "lost rank 1 (member 2: was killed by SIGKILL (signal 9)); " \
        "new world size 1 (was 2)" in err, err
    ev = _events(log)
    _one_start_per_member(ev)
    assert sorted(e["uid"] for e in ev if e["event"] == "end") == [1]
    _check_exactly_once(ev, 48, 2)


def test_a_whole_node_lost(tmp_path):
    """Two launchers on loopback as two nodes; node 1 is SIGKILLed with
    its launcher (nobody reports its ranks): node 0's ranks are told by
    the store that the connections closed, and finish on 2 ranks."""
    log, flag = tmp_path / "steps.jsonl", tmp_path / "go"
    port, env = _port(), _env("t-node")
    common = ["--elastic", "2:4", "--nnodes", "2", "--nproc-per-node", "2",
              "--master-port", str(port)]
    script = [SCRIPT, "--samples", "48", "--epochs", "2", "--log", str(log),
              "--hold", f"1:{flag}"]
    node0 = Launcher(common + ["--node-rank", "0"] + script, env)
    node1 = Launcher(common + ["--node-rank", "1"] + script, env)
    end = time.monotonic() + 60
    while time.monotonic() < end:      # every rank has done step 0
        if log.exists() and sum(e["event"] == "done" and e["step"] == 0
                                for e in _events(log)) == 4:
            break
        time.sleep(0.05)
    node1.p.kill()                     # the launcher, without a word
    node1.p.wait()
    flag.write_text("go")              # its ranks die of PDEATHSIG/reaper
    code, err, _ = node0.finish()
    node1.finish()
    assert code == 0, err
    assert "connection to the store closed" in err, err
    assert "new world size 2 (was 4)" in err, err
    ev = _events(log)
    assert sorted(e["uid"] for e in ev if e["event"] == "end") == [0, 1]
    _check_exactly_once(ev, 48, 2)


def test_the_store_host_lost_ends_the_job_saying_so(tmp_path):
    """The store agent (the node-0 launcher's) is SIGKILLed: the ranks
    cannot agree on anything any more and stop with that reason."""
    log, flag = tmp_path / "steps.jsonl", tmp_path / "go"
    host = Launcher(["--elastic", "1:2", "--nproc-per-node", "2",
                     "--master-port", str(_port()), SCRIPT, "--samples",
                     "48", "--log", str(log), "--hold", f"1:{flag}"],
                    _env("t-store"))
    end = time.monotonic() + 60
    while time.monotonic() < end and not (log.exists() and sum(
            e["event"] == "done" for e in _events(log)) == 2):
        time.sleep(0.05)
    agents = [int(p) for p in os.listdir("/proc") if p.isdigit()
              and _ppid(int(p)) == host.p.pid
              and b"collectives.elastic_store" in _cmdline(int(p))]
    assert len(agents) == 1
    os.kill(agents[0], 9)
    flag.write_text("go")
    code, err, _ = host.finish()
    assert code != 0
    assert "elastic store agent" in err and "SIGKILL" in err, err
    assert "the job's store is gone" in err and \
        "served by the launcher of node 0" in err, err


def _ppid(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat[stat.rfind(")") + 2:].split()[1])


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


# ------------------------------------------------ protocol, thread members

@pytest.fixture
def store():
    s = TCPStore("127.0.0.1", 0, "tok", is_server=True, timeout=10)
    yield s
    s.server.close()


def _members(store, uids, timeout=2.0):
    out = []
    for u in uids:
        m = Membership(store.clone(), u, timeout=timeout)
        m.initial()
        out.append(m)
    return out


def _reform_all(ms, done):
    res, errs = {}, {}

    def go(m):
        try:
            res[m.uid] = m.reform(done[m.uid])
        except ElasticStop as e:
            errs[m.uid] = str(e)
    ts = [threading.Thread(target=go, args=(m,)) for m in ms]
    for t in ts:
        t.start()
    for t in ts:
        t.join(20)
    return res, errs


def test_round_two_dead_at_once_and_the_furthest_source(store):
    host_init(store, 5, 2, 5)
    ms = _members(store, range(5))
    store.set(key("dead", 1), "was killed by SIGKILL (signal 9)")
    store.set(key("dead", 3), "exited with code 1")
    res, errs = _reform_all([ms[0], ms[2], ms[4]], {0: 7, 2: 8, 4: 7})
    assert not errs
    dec = res[0]
    assert all(r == dec for r in res.values())
    assert dec["members"] == [0, 2, 4] and dec["source"] == 2
    assert dec["done"] == 8 and dec["stop"] is None
    assert [(x["uid"], x["rank"]) for x in dec["lost"]] == [(1, 1), (3, 3)]


def test_round_below_min_and_a_silent_member(store):
    host_init(store, 3, 2, 3)
    ms = _members(store, range(3), timeout=0.3)
    store.set(key("dead", 2), "was killed by SIGKILL (signal 9)")
    # member 1 never checks in (its node went with its launcher)
    res, errs = _reform_all([ms[0]], {0: 3})
    assert "only 1 rank(s) left after losing rank 1 (did not check in " \
        "within 0 s), rank 2 (was killed" in errs[0]
    assert "below the minimum 2 of --elastic 2:3" in errs[0]


def test_a_member_whose_connection_closed_is_lost_at_once(store):
    """A whole node gone (its launcher too: nobody reports it): the
    store saw its connection close, which is enough, well before
    DTORCH_ELASTIC_TIMEOUT."""
    host_init(store, 3, 2, 3)
    ms = _members(store, range(3), timeout=30)
    ms[2].store._close_client()
    t0 = time.monotonic()
    res, errs = _reform_all(ms[:2], {0: 1, 1: 1})
    assert time.monotonic() - t0 < 5
    assert res[0]["members"] == [0, 1]
    assert res[0]["lost"][0]["why"].startswith(
        "its connection to the store closed")


def test_joiners_admitted_up_to_max(store):
    host_init(store, 2, 1, 3)
    ms = _members(store, range(2))
    joiners = []
    for _ in range(2):
        u = store.add(key("uid_next"), 1) - 1
        joiners.append(Membership(store.clone(), u))
    got = {}

    def join(j):
        try:
            got[j.uid] = j.join()["members"]
        except ElasticStop as e:
            got[j.uid] = str(e)
    ts = [threading.Thread(target=join, args=(j,)) for j in joiners]
    for t in ts:
        t.start()
    while ms[0].joins_waiting() < 2:
        time.sleep(0.01)
    res, errs = _reform_all(ms, {0: 4, 1: 4})
    for t in ts:
        t.join(10)
    assert res[0]["members"] == [0, 1, 2] and res[0]["joined"] == [2]
    assert got[2] == [0, 1, 2]
    assert got[3] == ("join refused: the job already has 3 ranks, the "
                      "maximum of --elastic 1:3")


# --------------------------------------------------------- the launcher

def test_elastic_refused_with_mpi_and_bad_ranges(capsys):
    for argv, text in (
            (["--elastic", "2:4", "--runner", "mpi", SCRIPT],
             "MPI communicator cannot shrink portably"),
            (["--elastic", "2:4", "--backend", "nccl", SCRIPT],
             "--elastic needs the tcp backend"),
            (["--elastic", "4:2", SCRIPT], "need 1 <= MIN <= MAX"),
            (["--elastic", "two", SCRIPT], "expected MIN:MAX"),
            (["--elastic", "2:4", "--nproc-per-node", "5", SCRIPT],
             "starts with 5 ranks"),
            (["--elastic", "2:4", "--max-restarts", "1", SCRIPT],
             "use one")):
        with pytest.raises(SystemExit) as e:
            cli.main(argv)
        assert text in str(e.value), (argv, e.value)


class _R:
    def __init__(self, rank, last):
        import collections
        self.rank, self._threads = rank, []
        self._lock = threading.Lock()
        self.tail = collections.deque([last])


def test_first_cause_names_the_rank_that_failed_on_its_own():
    """Ranks 2 and 3 end in one poll; rank 2's collective failed because
    rank 3 exited: rank 3 is named (the flaky two-node restart test)."""
    peer = _R(2, "collectives.errors.RankFailureError: connection with "
                 "rank 1 (global 3) of group 'world' closed\n")
    own = _R(3, "rank 3: failing on purpose\n")
    assert _caused_by_peer(peer) and not _caused_by_peer(own)
    assert [r.rank for r in first_cause([peer, own])] == [3, 2]
    assert [r.rank for r in first_cause([own, peer])] == [3, 2]
    a, b = _R(0, "x\n"), _R(1, "y\n")
    assert [r.rank for r in first_cause([a, b])] == [0, 1]   # order kept


# ------------------------------------------- ElasticJob outside --elastic

def test_elastic_job_on_a_fixed_group_and_refusals():
    """The same loop on a fixed (thread) group: each sample once per epoch,
    an uneven last step, identical replicas; FSDP and a DDP-wrapped model
    are refused with the reason."""
    import dtorch as torch
    import dtorch.distributed as dist
    from dtorch.distributed import elastic
    from dtorch.distributed.fsdp import fully_shard
    from dtorch.nn.parallel import DistributedDataParallel as DDP
    from dtorch.utils.data import TensorDataset

    def body(rank, world):
        torch.manual_seed(0)
        n = 9                 # 4 + 5: the last sample joins a step
        ds = TensorDataset(torch.arange(n * 2.0).reshape(n, 2),
                           torch.arange(n))
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        job = elastic.ElasticJob(model, opt, ds, batch_size=4, seed=3)
        seen, sizes = [], []
        for epoch in job.epochs(2):
            for step in job.steps():
                with step:
                    x, y = step.batch
                    opt.zero_grad()
                    (job.model(x).sum() * step.scale).backward()
                    opt.step()
                seen.append((epoch, [int(i) for i in y]))
                sizes.append(step.total)
        errs = []
        for bad in (
                lambda: elastic.ElasticJob(DDP(model), opt, ds, 4),
                lambda: elastic.ElasticJob(fully_shard(torch.nn.Sequential(
                    torch.nn.Linear(2, 2))), opt, ds, 4),
                lambda: elastic.ElasticJob(model, opt, ds, 4, fsdp={})):
            try:
                bad()
            except (TypeError, NotImplementedError) as e:
                errs.append(str(e))
        return seen, sizes, model.weight.detach().numpy().copy(), errs

    res = dist.spawn_threads(body, 2)
    for ep in (0, 1):
        ids = sorted(i for r in res for e, b in r[0] if e == ep for i in b)
        assert ids == list(range(9))
    assert res[0][1] == [4, 5, 4, 5]            # the tail joins a step
    assert res[0][2].tobytes() == res[1][2].tobytes()
    errs = res[0][3]
    assert "takes the plain module" in errs[0]
    assert "not one wrapped in FSDP" in errs[1] and "fsdp={" in errs[1]
    assert "optimizer as a function of the parameters" in errs[2]


@pytest.mark.parametrize("sharded", [["--zero"], ["--fsdp", "--fsdp-units"]],
                         ids=["zero1", "fsdp"])
def test_sharded_shrink_twice_and_grow_bitwise(tmp_path, sharded):
    """ZeRO-1 (ZeroRedundancyOptimizer over Adam) and FSDP (each Linear a
    unit, Adam over the flat parameters), deterministic: 4 -> SIGKILL
    member 1 at a step's start -> 3 -> SIGKILL member 3 inside a step,
    after its optimizer step, before the buddy swap (the others' shards
    already updated: they must go back to the buddy copies) -> 2 -> a
    joiner gets its shard -> 3. The survivors keep their pids; every sample
    once per epoch; the final parameters are bitwise those of one
    uninterrupted process."""
    log, out = tmp_path / "steps.jsonl", tmp_path / "elastic.npz"
    port, env = _port(), _env("t-" + sharded[0][2:])
    common = [SCRIPT, "--deterministic", *sharded, "--samples", "96",
              "--epochs", "2", "--log", str(log), "--kill", "1:1",
              "--kill-in-buddy", "3:3", "--hold", "5:join"]
    code, err, jcode, jerr = _four_and_a_joiner("2:4", port, env, common,
                                                out, "elastic round 2:")
    assert code == 0 and jcode == 0, err + jerr
    assert "lost rank 1 (member 1: was killed by SIGKILL" in err, err
    assert "new world size 2 (was 3)" in err and "member 3:" in err, err
    assert "1 joined (member(s) 4); new world size 3" in err, err
    ev = _events(log)
    pids = _one_start_per_member(ev)
    assert sorted(pids) == [0, 1, 2, 3, 4]
    assert sorted(e["uid"] for e in ev if e["event"] == "end") == [0, 2, 4]
    _check_exactly_once(ev, 96, 2)
    _assert_bitwise_uninterrupted(out, tmp_path, env, sharded)


def test_fsdp_shard_snapshots_merge_to_the_flat_parameter():
    """The FSDP layout of the buddy mechanism on 2 thread ranks: each
    rank's snapshot is its range of the unit's 9 flat elements (5 + 4: the
    padding left out) with its Adam state; merged they are the full flat
    parameter and state, and a missing range is named."""
    import dtorch as torch
    import dtorch.distributed as dist
    from collectives.elastic_store import ElasticStop
    from dtorch.distributed.elastic._buddy import _FSDPLayout, _merge
    from dtorch.distributed.fsdp import FullyShardedDataParallel as FSDP

    def body(rank, world):
        torch.manual_seed(0)
        model = FSDP(torch.nn.Linear(2, 3))       # 9 elements
        opt = torch.optim.Adam(model.parameters(), lr=0.1)
        model(torch.ones(2, 2)).sum().backward()
        opt.step()
        lay = _FSDPLayout(model, opt)
        got = dist.group.WORLD.all_gather_object(lay.snapshot())
        return [x for g in got for x in g], \
            model._flat_param.detach().numpy().copy(), \
            opt.state[model._flat_param]["exp_avg"].numpy().copy()

    res = dist.spawn_threads(body, 2)
    pieces = res[0][0]
    assert [(i, lo, hi) for i, lo, hi, _, _ in pieces] == [(0, 0, 5),
                                                           (0, 5, 9)]
    flat, state = _merge([((9,), np.float32)], pieces, 1, "FSDP's")
    assert flat[0].tobytes() == np.concatenate(
        [res[0][1], res[1][1][:4]]).tobytes()
    assert res[1][1][4] == 0 and res[1][2][4] == 0          # the padding
    assert state[0]["exp_avg"].tobytes() == np.concatenate(
        [res[0][2], res[1][2][:4]]).tobytes()
    assert float(state[0]["step"]) == 1
    with pytest.raises(ElasticStop, match="FSDP's at step 1 is lost: 4 "):
        _merge([((9,), np.float32)], pieces[:1], 1, "FSDP's")


def test_fsdp_shards_reinstalled_on_device(device):
    """The FSDP layout's rebuild on ``device`` (cuda: CuPy shards, host
    snapshots): 2 thread ranks snapshot, merge and install their shards and
    Adam state again over the group; the bits stay, the arrays stay on the
    device, and the optimizer keeps stepping the same flat parameter."""
    import dtorch as torch
    import dtorch.distributed as dist
    from dtorch.distributed.elastic._buddy import _FSDPLayout, _merge
    from dtorch.distributed.fsdp import FullyShardedDataParallel as FSDP

    def body(rank, world):
        torch.manual_seed(0)
        model = FSDP(torch.nn.Linear(2, 3).to(device),
                     device_id=None if device == "cpu" else device)
        opt = torch.optim.Adam(model.parameters(), lr=0.1)
        x = torch.ones(2, 2, device=device)
        model(x).sum().backward()
        opt.step()
        lay, fp = _FSDPLayout(model, opt), model._flat_param
        before = [fp.detach().cpu().numpy().copy(),
                  opt.state[fp]["exp_avg"].cpu().numpy().copy()]
        got = dist.group.WORLD.all_gather_object(lay.snapshot())
        flat, state = _merge(lay.specs(), [x for g in got for x in g], 1)
        lay.install(dist.group.WORLD, flat, state, True)
        assert fp is model._flat_param and fp.device.type == device
        assert opt.state[fp]["exp_avg"].device.type == device
        after = [fp.detach().cpu().numpy().copy(),
                 opt.state[fp]["exp_avg"].cpu().numpy().copy()]
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
        return [a.tobytes() == b.tobytes() for a, b in zip(before, after)]

    assert dist.spawn_threads(body, 2) == [[True, True]] * 2


def test_elastic_job_with_zero1_on_a_fixed_group():
    """Outside --elastic, ElasticJob with ZeroRedundancyOptimizer runs on
    the fixed (thread) group, no buddy replica: the same parameters as
    with the plain optimizer, on every rank."""
    import dtorch as torch
    import dtorch.distributed as dist
    from dtorch.distributed import elastic
    from dtorch.distributed.optim import ZeroRedundancyOptimizer
    from dtorch.utils.data import TensorDataset

    def body(rank, world):
        out = []
        for zero in (False, True):
            torch.manual_seed(0)
            ds = TensorDataset(torch.randn(12, 3), torch.randn(12, 1))
            model = torch.nn.Sequential(torch.nn.Linear(3, 5),
                                        torch.nn.Tanh(),
                                        torch.nn.Linear(5, 1))
            opt = ZeroRedundancyOptimizer(
                model.parameters(), torch.optim.Adam, lr=0.05) if zero \
                else torch.optim.Adam(model.parameters(), lr=0.05)
            job = elastic.ElasticJob(model, opt, ds, batch_size=4)
            assert job._buddy is None
            for _ in job.epochs(2):
                for step in job.steps():
                    with step:
                        x, y = step.batch
                        opt.zero_grad()
                        ((job.model(x) - y) ** 2).mean().backward()
                        opt.step()
            out.append(np.concatenate([p.detach().numpy().ravel()
                                       for p in model.parameters()]))
            if zero:
                assert opt.local_state_bytes() < 2 * 4 * out[0].size
        return out

    (plain0, zero0), (plain1, zero1) = dist.spawn_threads(body, 2)
    assert plain0.tobytes() == plain1.tobytes() == zero1.tobytes()
    np.testing.assert_array_equal(zero0, plain0)


def test_elastic_job_with_fsdp_on_a_fixed_group():
    """Outside --elastic, ElasticJob(fsdp=...) wraps the module in FSDP on
    the fixed (thread) group and builds the optimizer over its flat
    parameters and the LR scheduler (``state``: a function of the
    optimizer, with DDP too) over it, no buddy replica: the parameters of
    the same loop with DDP, on every rank."""
    import dtorch as torch
    import dtorch.distributed as dist
    from dtorch.distributed import elastic
    from dtorch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from dtorch.utils.data import TensorDataset

    def body(rank, world):
        out = []
        for fsdp in (None, {}):
            torch.manual_seed(0)
            ds = TensorDataset(torch.randn(12, 3), torch.randn(12, 1))
            model = torch.nn.Sequential(torch.nn.Linear(3, 5),
                                        torch.nn.Tanh(),
                                        torch.nn.Linear(5, 1))
            make = (lambda ps: torch.optim.Adam(ps, lr=0.05))
            sched = (lambda o: torch.optim.lr_scheduler.StepLR(o, 1, 0.5))
            opt = None if fsdp is not None else make(model.parameters())
            job = elastic.ElasticJob(
                model, make if fsdp is not None else opt, ds, batch_size=4,
                fsdp=fsdp, state={"sched": sched})
            assert job._buddy is None
            assert isinstance(job.model, FSDP) == (fsdp is not None)
            assert job.extra["sched"].optimizer is job.optimizer
            for _ in job.epochs(2):
                for step in job.steps():
                    with step:
                        x, y = step.batch
                        job.optimizer.zero_grad()
                        ((job.model(x) - y) ** 2).mean().backward()
                        job.optimizer.step()
                job.extra["sched"].step()
            assert job.optimizer.param_groups[0]["lr"] == 0.05 / 4
            sd = job.model.state_dict()
            out.append(np.concatenate([v.numpy().ravel() for k, v in
                                       sorted(sd.items())]))
        return out

    res = dist.spawn_threads(body, 2)
    for ddp, fsdp in res:
        np.testing.assert_allclose(fsdp, ddp, rtol=1e-5, atol=1e-6)
    assert res[0][1].tobytes() == res[1][1].tobytes()


def test_zero_shards_rebuilt_from_pieces_or_named_lost():
    """The rebuild of the full parameters and state from the pieces the
    members hold (own and buddy copies, in any layout, overlapping), and
    the stop that names what no survivor holds."""
    from dtorch.distributed.elastic._buddy import _merge
    full_w = np.arange(6, dtype=np.float32)
    specs = [((2, 3), np.float32), ((4,), np.float32)]
    step = np.array(3.0, np.float32)

    def piece(idx, lo, hi, arr):
        return (idx, lo, hi, arr[lo:hi].copy(),
                {"exp_avg": arr[lo:hi] * 2, "step": step})
    pieces = [piece(0, 0, 4, full_w), piece(0, 2, 6, full_w),   # overlap
              piece(1, 0, 1, np.ones(4, np.float32)),
              piece(1, 1, 4, np.ones(4, np.float32))]
    flat, state = _merge(specs, pieces, 7)
    assert flat[0].tolist() == full_w.tolist() and flat[1].tolist() == [1] * 4
    assert state[0]["exp_avg"].tolist() == (2 * full_w).tolist()
    assert float(state[1]["step"]) == 3.0
    with pytest.raises(ElasticStop, match=r"state at step 7 is lost: 2 "
                       r"elements of parameter\(s\) \[0\]"):
        _merge(specs, pieces[:1] + pieces[2:], 7)


def test_buddy_ring_alternates_hosts(monkeypatch):
    """A rank's buddy (the next in the ring) is on another host wherever
    the counts allow: losing a whole host takes no shard with its copy."""
    from dtorch.distributed.elastic import _buddy

    class G:
        def __init__(self, hosts):
            self.hosts, self.size = hosts, len(hosts)

        def all_gather_object(self, mine):
            return list(self.hosts)

    hosts = ["a", "b", "b", "a", "a"]          # ranks 1, 2 on host b
    ring = _buddy._ring(G(hosts))
    assert sorted(ring) == list(range(5))
    for host in ("a", "b"):
        gone = {r for r, h in enumerate(hosts) if h == host}
        pairs = [(ring[p], ring[(p + 1) % 5]) for p in range(5)]
        both = [p for p in pairs if set(p) <= gone]
        # b (2 of 5) loses no rank together with its buddy; a (3 of 5)
        # cannot avoid one such pair
        assert len(both) == (0 if host == "b" else 1), (host, ring)
    assert _buddy._ring(G(["x"] * 3)) == [0, 1, 2]   # one host: in order

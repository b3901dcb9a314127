"""The Ray runner: one actor per rank in a placement group.

    from launch.ray import run
    results = run(train_fn, world_size=4)              # a function
    run(["train.py", "--epochs", "3"], world_size=4)  # a script

Each actor gets the dtorch environment contract (RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, DTORCH_RDZV_TOKEN,
DTORCH_RESTART_COUNT, DTORCH_BACKEND, thread counts).  Rendezvous goes
through Ray: rank 0's actor reports its node address and picks a free
port there, and every actor is told them before it starts; the tcp or
nccl backend then connects the ranks itself.  The placement group holds
one bundle per rank ({CPU: c, GPU: g}, GPUs reserved when the cluster has
enough), so all ranks start together or not at all.  With nnodes > 1
(dtorch-launch --nnodes N --runner ray) it holds one bundle per node, each
with that node's ranks, on N distinct Ray nodes (STRICT_SPREAD).

When one rank fails (an exception, a non-zero exit, a dead actor) the
other actors are stopped and RankFailedError names the rank; with
max_restarts the whole job is started again with a new rendezvous.

Ray is imported only when run() is called: `pip install -e '.[ray]'` in
the dtorch clone.
"""

import os
import sys
import threading
import time

from launch import env as renv
from launch import procs


class RankFailedError(RuntimeError):
    """A rank of a Ray job failed; `.rank` and `.detail` say which and
    how."""

    def __init__(self, rank, detail):
        super().__init__(f"rank {rank} failed: {detail}")
        self.rank, self.detail = rank, detail


class _Rank:
    """Body of the per-rank actor (wrapped by ray.remote in _actor_cls).

    Methods run in a thread pool of two, so stop() can run while run()
    is busy."""

    def __init__(self):
        self._proc = None
        self._lock = threading.Lock()

    def node(self):
        import ray
        return ray.util.get_node_ip_address()

    def free_port(self, addr):
        return renv.free_port(addr)

    def run(self, env, target, args, rank, echo, log_path):
        os.environ.update(env)
        if callable(target):
            return target(*args)
        cmd = [sys.executable] + list(target)
        with self._lock:
            self._proc = procs.spawn(cmd, dict(os.environ))
        self._pump(rank, echo, log_path)
        return self._proc.wait()

    def _pump(self, rank, echo, log_path):
        # Merge the script's stdout/stderr into ours, line-prefixed;
        # Ray forwards an actor's output to the driver.
        log = open(log_path, "a", encoding="utf-8") if log_path else None
        threads = []
        for pipe, stream in ((self._proc.stdout, sys.stdout),
                             (self._proc.stderr, sys.stderr)):
            t = threading.Thread(target=_copy_lines, daemon=True,
                                 args=(pipe, stream, rank, echo, log))
            t.start()
            threads.append(t)
        for t in threads:
            t.join()
        if log:
            log.close()

    def stop(self, grace):
        with self._lock:
            proc = self._proc
        if proc is not None:
            procs.stop_groups([proc.pid], grace=grace)
        return True


_log_lock = threading.Lock()


def _copy_lines(pipe, stream, rank, echo, log):
    for raw in iter(pipe.readline, b""):
        line = raw.decode("utf-8", "replace").rstrip("\n") + "\n"
        if log:
            with _log_lock:
                log.write(line)
                log.flush()
        if echo:
            stream.write(f"[rank {rank}] {line}")
            stream.flush()
    pipe.close()


_ACTOR = None


def _actor_cls():
    global _ACTOR
    if _ACTOR is None:
        import ray
        _ACTOR = ray.remote(max_concurrency=2)(_Rank)
    return _ACTOR


def _gpus_per_rank(ray, world_size, requested):
    if requested is not None:
        return requested
    # Reserve one GPU per rank when the cluster can give every rank one.
    return 1 if ray.cluster_resources().get("GPU", 0) >= world_size else 0


def run(fn_or_script, world_size, args=(), *, num_cpus_per_rank=1,
        num_gpus_per_rank=None, backend=None, env=None, max_restarts=0,
        strategy="PACK", log_dir=None, only_rank0=False, grace=5.0,
        timeout=None, nnodes=1):
    """Run `fn_or_script` as `world_size` ranks on the Ray cluster.

    fn_or_script: a function (called as fn(*args) in each rank's actor;
    results are returned as a list in rank order) or a script, given as
    a path or an argv list (`["train.py", "--lr", "0.1"]`, `["-m", "pkg"]`;
    the list of exit codes is returned).  Connects to RAY_ADDRESS or
    starts a local Ray when ray is not initialised yet.  nnodes > 1 puts
    world_size / nnodes ranks on each of nnodes distinct Ray nodes
    (`strategy` then does not apply).  Raises RankFailedError naming the
    rank when a rank fails on the last try, TimeoutError after `timeout`
    seconds."""
    try:
        import ray
    except ImportError as err:
        raise ImportError(
            "the ray runner needs Ray: in the dtorch clone, "
            "pip install -e '.[ray]'") from err
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if nnodes < 1 or world_size % nnodes:
        raise ValueError(f"world_size {world_size} cannot be split evenly "
                         f"over nnodes={nnodes}")
    if isinstance(fn_or_script, str):
        fn_or_script = [fn_or_script]
    if not renv.is_terminal(sys.stdout):
        # Ray colours the "(_Rank pid=...)" prefix of every forwarded
        # line; in a log file that is escape codes.  Read at print time.
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")
    if not ray.is_initialized():
        ray.init(address=os.environ.get("RAY_ADDRESS"))
    if nnodes > 1:
        # else the placement group would wait for nodes that never come
        alive = sum(1 for n in ray.nodes() if n.get("Alive"))
        if alive < nnodes:
            raise ValueError(f"nnodes={nnodes} but the Ray cluster has "
                             f"{alive} node(s) alive")
    gpus = _gpus_per_rank(ray, world_size, num_gpus_per_rank)
    if log_dir:
        os.makedirs(log_dir, exist_ok=True)
    token_base = (env or {}).get("DTORCH_RDZV_TOKEN")
    for attempt in range(max_restarts + 1):
        token = (renv.derive_token(token_base, attempt) if token_base
                 else renv.new_token())
        try:
            return _attempt(ray, fn_or_script, world_size, args,
                            num_cpus_per_rank, gpus, backend, env or {},
                            attempt, token, strategy, log_dir, only_rank0,
                            grace, timeout, nnodes)
        except RankFailedError as err:
            if attempt == max_restarts:
                raise
            print(f"dtorch-launch: {err}; restarting the job "
                  f"({attempt + 1} of {max_restarts} restarts)",
                  file=sys.stderr, flush=True)


def _attempt(ray, target, world_size, args, cpus, gpus, backend, extra,
             attempt, token, strategy, log_dir, only_rank0, grace,
             timeout, nnodes=1):
    from ray.util.placement_group import (placement_group,
                                          remove_placement_group)
    from ray.util.scheduling_strategies import (
        PlacementGroupSchedulingStrategy)

    bundle = {"CPU": cpus}
    if gpus:
        bundle["GPU"] = gpus
    if nnodes > 1:
        # a node's ranks share its bundle; bundles on distinct nodes
        per_node = world_size // nnodes
        pg = placement_group(
            [{k: v * per_node for k, v in bundle.items()}] * nnodes,
            strategy="STRICT_SPREAD")
    else:
        per_node = 1     # one bundle per rank, placed by `strategy`
        pg = placement_group([dict(bundle)] * world_size, strategy=strategy)
    actors = []
    try:
        ray.get(pg.ready(), timeout=timeout or 120)
        cls = _actor_cls()
        for i in range(world_size):
            actors.append(cls.options(
                num_cpus=cpus, num_gpus=gpus,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=pg,
                    placement_group_bundle_index=i // per_node),
            ).remote())
        nodes = ray.get([a.node.remote() for a in actors])
        master = nodes[0]
        port = ray.get(actors[0].free_port.remote(master))
        refs = {}
        for rank, actor in enumerate(actors):
            same = [r for r in range(world_size) if nodes[r] == nodes[rank]]
            env = renv.rank_env(
                rank, world_size, same.index(rank), len(same), master,
                port, token=token, restart_count=attempt, backend=backend,
                cores=max(1, int(cpus)) * len(same), base=extra)
            env.setdefault("PYTHONUNBUFFERED", "1")
            log_path = (os.path.join(log_dir, f"rank{rank}.log")
                        if log_dir else None)
            echo = not only_rank0 or rank == 0
            refs[actor.run.remote(env, target, tuple(args), rank, echo,
                                  log_path)] = rank
        return _wait(ray, refs, callable(target), world_size, timeout)
    except BaseException:
        # Let running scripts end their own process trees first.
        stops = [a.stop.remote(grace) for a in actors]
        try:
            ray.get(stops, timeout=grace + 5)
        except Exception:
            pass
        raise
    finally:
        for a in actors:
            ray.kill(a)
        remove_placement_group(pg)


def _wait(ray, refs, is_fn, world_size, timeout):
    results = [None] * world_size
    pending = list(refs)
    deadline = None if timeout is None else time.monotonic() + timeout
    while pending:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise TimeoutError(
                f"Ray job not done after {timeout} s; ranks still running: "
                f"{sorted(refs[r] for r in pending)}")
        ready, pending = ray.wait(pending, num_returns=1, timeout=left)
        for ref in ready:
            rank = refs[ref]
            try:
                value = ray.get(ref)
            except ray.exceptions.RayActorError as err:
                raise RankFailedError(
                    rank, f"its actor died ({type(err).__name__})") from err
            except ray.exceptions.RayTaskError as err:
                cause = err.cause if hasattr(err, "cause") else err
                raise RankFailedError(
                    rank, f"raised {type(cause).__name__}: {cause}") from err
            if not is_fn and value != 0:
                how = (f"exited with code {value}" if value > 0 else
                       f"was killed by {procs.signal_name(-value)}")
                raise RankFailedError(rank, how)
            results[rank] = value
    return results

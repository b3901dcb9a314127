"""dtorch-launch: the command line.

    dtorch-launch --nproc-per-node 4 train.py --epochs 3
    dtorch-launch --nnodes 2 --node-rank 0 --master-port 29500 ... train.py
    dtorch-launch --runner mpi --nproc-per-node 2 train.py
    dtorch-launch --runner slurm train.py          # inside sbatch/salloc
    dtorch-launch --runner ray --nproc-per-node 2 -m mypkg.train
    dtorch-launch --dry-run --nproc-per-node 4 train.py   # one process
    dtorch-launch --elastic 2:4 --nproc-per-node 3 train.py
    dtorch-launch --join --master-port P train.py  # into a running job

Everything after the script (or `-m module`) goes to the script.
"""

import argparse
import sys

from launch import env as renv

RUNNERS = ("local", "mpi", "ray", "slurm")
BACKENDS = ("auto", "mpi", "tcp", "nccl")


RAY_ELASTIC = (
    "--elastic does not run with --runner ray yet: the Ray runner starts "
    "every rank in one placement group and ends the job when any actor "
    "dies, so survivors cannot go on; run one local elastic launcher per "
    "Ray node instead (--runner local, see slurm/README.md)")

EXAMPLE = "dtorch-launch --nproc-per-node 2 examples/ddp_digits.py"


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        # argparse says "required: script, args" for a bare dtorch-launch;
        # show what a command line looks like instead.
        if "required: script" in message:
            message = "no training script given"
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n"
                     f"example: {EXAMPLE}\n")


def build_parser():
    p = _Parser(
        prog="dtorch-launch",
        description="Start the ranks of a dtorch job.",
        epilog="Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, "
               "LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, "
               "DTORCH_RDZV_TOKEN, DTORCH_RESTART_COUNT, DTORCH_BACKEND "
               "and OMP/OPENBLAS/MKL_NUM_THREADS.")
    p.add_argument("--nnodes", type=int, default=1,
                   help="number of nodes (default 1)")
    p.add_argument("--node-rank", type=int, default=0,
                   help="this node's index in [0, nnodes) (default 0)")
    p.add_argument("--master-addr", default=renv.DEFAULT_ADDR,
                   help="address of the node running rank 0 "
                        "(default 127.0.0.1)")
    p.add_argument("--master-port", type=int, default=None,
                   help="rendezvous port (default: a free port; required "
                        "with --nnodes > 1; restart n uses PORT + n)")
    p.add_argument("--nproc-per-node", type=int, default=None,
                   help="ranks per node (default 1; slurm: what the "
                        "allocation says)")
    p.add_argument("--runner", choices=RUNNERS, default="local",
                   help="how the ranks start: local processes (default), "
                        "mpiexec, srun inside a SLURM allocation, or one "
                        "Ray actor per rank")
    p.add_argument("--backend", choices=BACKENDS, default="auto",
                   help="passed to the ranks as DTORCH_BACKEND")
    p.add_argument("--max-restarts", type=int, default=0,
                   help="restart the whole job up to M times after a "
                        "failure (default 0)")
    p.add_argument("--elastic", default=None, metavar="MIN:MAX",
                   help="elastic job on the tcp backend (torchrun's "
                        "--nnodes MIN:MAX, counted in ranks): a rank that "
                        "dies is dropped and the others go on, ranks "
                        "started with --join are added, between MIN and "
                        "MAX ranks (the script uses dtorch.distributed."
                        "elastic)")
    p.add_argument("--join", action="store_true",
                   help="start --nproc-per-node ranks that join the "
                        "running elastic job at --master-addr/--master-port "
                        "(same DTORCH_RDZV_TOKEN)")
    p.add_argument("--log-dir", default=None,
                   help="write each rank's output to DIR/rankN.log")
    p.add_argument("--only-rank0-output", "--quiet-ranks",
                   dest="only_rank0", action="store_true",
                   help="show only rank 0's output on the console "
                        "(all ranks still go to --log-dir)")
    p.add_argument("--grace-period", type=float, default=5.0,
                   help="seconds between SIGTERM and SIGKILL when "
                        "stopping ranks (default 5)")
    p.add_argument("--dry-run", action="store_true",
                   help="instead of starting the job, run its first "
                        "optimizer steps in one process with nnodes x "
                        "nproc-per-node simulated ranks (threads): the "
                        "script's layout errors show here, named by rank, "
                        "and a table gives each rank's parameter, "
                        "gradient, optimizer-state and activation bytes "
                        "and bytes per collective. The steps really run "
                        "in the current directory: checkpoints and files "
                        "the script writes are written")
    p.add_argument("--dry-run-steps", type=int, default=2, metavar="K",
                   help="optimizer steps of the dry run (default 2)")
    p.add_argument("--dry-run-json", default=None, metavar="FILE",
                   help="also write the dry run's figures as JSON")
    p.add_argument("-m", "--module", action="store_true",
                   help="the target is a module, run as python -m")
    p.add_argument("script", help="training script (or module with -m)")
    p.add_argument("args", nargs=argparse.REMAINDER,
                   help="arguments for the script")
    return p


def _target(args):
    return (["-m", args.script] if args.module else [args.script]) \
        + list(args.args)


def _check_script(args):
    """A missing script is one line, before any rank starts (python in
    each rank would print it once per rank, mpi4py with a traceback)."""
    import os
    if not args.module and not os.path.isfile(args.script):
        what = "is a directory" if os.path.isdir(args.script) \
            else "does not exist"
        raise FileNotFoundError(
            f"training script {args.script!r} {what} "
            f"(looked in {os.getcwd()})")


def _script_index(parser, argv):
    """Index of the script in ``argv``: the first word that is neither one
    of the launcher's options nor an option's value (None if there is
    none). Words after it belong to the script and are never read as the
    launcher's (argparse would take a script's ``--n 5`` for an ambiguous
    abbreviation of ``--nnodes``/``--nproc-per-node``)."""
    actions = parser._option_string_actions
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return i + 1 if i + 1 < len(argv) else None
        if not word.startswith("-") or word == "-":
            return i
        name = word.partition("=")[0]
        found = [a for s, a in actions.items()
                 if s == name or (name.startswith("--") and len(name) > 2
                                  and s.startswith(name))]
        if name in actions:
            found = [actions[name]]
        if len({id(a) for a in found}) == 1 and "=" not in word \
                and found[0].nargs != 0:
            i += 1                  # the option's value
        i += 1
    return None


def parse_args(parser, argv=None):
    """The launcher's options up to the script; the rest is the script's,
    untouched."""
    argv = list(sys.argv[1:] if argv is None else argv)
    at = _script_index(parser, argv)
    if at is None:
        return parser.parse_args(argv)
    args = parser.parse_args(argv[:at + 1])
    args.args = argv[at + 1:]
    return args


def main(argv=None):
    parser = build_parser()
    args = parse_args(parser, argv)
    for flag, value, low in (("--nproc-per-node", args.nproc_per_node, 1),
                             ("--nnodes", args.nnodes, 1),
                             ("--max-restarts", args.max_restarts, 0),
                             ("--grace-period", args.grace_period, 0),
                             ("--dry-run-steps", args.dry_run_steps, 1)):
        if value is not None and value < low:
            parser.error(f"{flag} must be >= {low} (got {value})")
    try:
        _check_script(args)
        code = run(args)
    except (ValueError, FileNotFoundError, ImportError) as err:
        sys.exit(f"dtorch-launch: {err}")
    sys.exit(code)


def _check_elastic(args):
    """--elastic/--join: only where ranks can leave and join a group."""
    if args.join and args.elastic is None:
        args.elastic = "1:1"      # the job's own MIN:MAX are used
    if args.elastic is None:
        return None
    lo, _, hi = args.elastic.partition(":")
    try:
        lo, hi = int(lo), int(hi or lo)
    except ValueError:
        raise ValueError(f"--elastic {args.elastic!r}: expected MIN:MAX, "
                         f"two whole numbers such as 2:4") from None
    if lo < 1 or hi < lo:
        raise ValueError(f"--elastic {args.elastic!r}: need 1 <= MIN <= MAX")
    if args.runner == "mpi" or args.backend == "mpi":
        raise ValueError(
            "--elastic cannot run on MPI: an MPI communicator cannot shrink "
            "portably when a process dies (ULFM is not standard MPI), so "
            "the job would end with the rank; use the tcp backend "
            "(--runner local, the default)")
    if args.runner == "ray":
        raise ValueError(RAY_ELASTIC)
    if args.backend not in ("auto", "tcp"):
        raise ValueError(f"--elastic needs the tcp backend, not "
                         f"--backend {args.backend}")
    if args.dry_run:
        raise ValueError("--dry-run and --elastic do not combine")
    if args.max_restarts:
        raise ValueError(
            "--max-restarts restarts the whole job after a failure; "
            "--elastic keeps the survivors going instead: use one")
    return lo, hi


def run(args):
    elastic = _check_elastic(args)
    if args.dry_run:
        return _run_dry(args)
    backend = None if args.backend == "auto" else args.backend
    if elastic is not None and args.runner == "slurm":
        from launch.elastic import SlurmElastic
        return SlurmElastic(
            _target(args), elastic, nproc=args.nproc_per_node,
            nnodes=args.nnodes, master_addr=args.master_addr,
            master_port=args.master_port, join=args.join,
            grace=args.grace_period, log_dir=args.log_dir,
            only_rank0=args.only_rank0).run()
    if elastic is not None:
        return _run_local(args, "tcp", elastic)
    if args.runner == "local":
        return _run_local(args, backend)
    if args.runner == "ray":
        return _run_ray(args, backend)
    return _run_external(args, backend)


def _run_dry(args):
    """One child, ``python -m dtorch.distributed.dry_run`` (this package
    does not import dtorch); its exit status is the launcher's."""
    import os
    import subprocess
    cmd = [sys.executable, "-m", "dtorch.distributed.dry_run",
           "--nproc-per-node", str(args.nproc_per_node or 1),
           "--nnodes", str(args.nnodes), "--steps", str(args.dry_run_steps)]
    if args.dry_run_json:
        cmd += ["--json", args.dry_run_json]
    env = dict(os.environ)
    # the simulated ranks share one process and its BLAS
    for var in renv.THREAD_VARS:
        env.setdefault(var, "1")
    return subprocess.run(cmd + (["-m"] if args.module else [])
                          + [args.script] + list(args.args),
                          env=env).returncode


def _run_local(args, backend, elastic=None):
    from launch.local import LocalRunner
    cmd = [sys.executable] + _target(args)
    kw = dict(nproc=args.nproc_per_node or 1, nnodes=args.nnodes,
              node_rank=args.node_rank, master_addr=args.master_addr,
              master_port=args.master_port, backend=backend,
              log_dir=args.log_dir, only_rank0=args.only_rank0,
              grace=args.grace_period, max_restarts=args.max_restarts)
    if elastic is not None:
        import os
        from launch.elastic import NODE_AGENT_VAR, ElasticRunner
        if args.join:
            kw.pop("nnodes")
        return ElasticRunner(
            cmd, elastic=elastic, join=args.join,
            node_agent=os.environ.pop(NODE_AGENT_VAR, "") == "1",
            **kw).run()
    return LocalRunner(cmd, **kw).run()


def _run_ray(args, backend):
    from launch import ray as rray
    world = args.nnodes * (args.nproc_per_node or 1)
    try:
        rray.run(_target(args), world, backend=backend, nnodes=args.nnodes,
                 max_restarts=args.max_restarts, log_dir=args.log_dir,
                 only_rank0=args.only_rank0, grace=args.grace_period)
    except rray.RankFailedError as err:
        print(f"dtorch-launch: {err}", file=sys.stderr, flush=True)
        return 1
    return 0


def _run_external(args, backend):
    import os
    from launch import external as ext
    base = dict(os.environ)
    if backend:
        base["DTORCH_BACKEND"] = backend
    token_base = base.get("DTORCH_RDZV_TOKEN")
    k = args.nproc_per_node
    slurm = ext.in_slurm_allocation(base) or args.runner == "slurm"
    world = args.nnodes * (k or 1)

    def build(attempt, env):
        env["DTORCH_RDZV_TOKEN"] = (renv.derive_token(token_base, attempt)
                                    if token_base else renv.new_token())
        if args.master_port is not None:
            env["MASTER_PORT"] = str(args.master_port + attempt)
        if not slurm or args.master_addr != renv.DEFAULT_ADDR:
            env["MASTER_ADDR"] = args.master_addr
        if slurm:
            # Without --master-addr/--master-port each rank derives them
            # from SLURM_NODELIST and the job/step id (launch.env).
            nnodes = args.nnodes if args.nnodes > 1 else None
            return ext.srun_command(
                _target(args), nprocs=k and world, nnodes=nnodes,
                ntasks_per_node=k,
                mpi="pmix" if args.runner == "mpi" else None,
                mpi4py=args.runner == "mpi")
        if args.master_port is None:
            env["MASTER_PORT"] = str(renv.free_port(args.master_addr))
        ext.allow_root(env)
        renv.no_color(env, sys.stdout)
        export = ["MASTER_ADDR", "MASTER_PORT", "DTORCH_RDZV_TOKEN",
                  "DTORCH_RESTART_COUNT", "PYTHONUNBUFFERED",
                  ext.STARTED_VAR]
        export += [v for v in ("DTORCH_BACKEND", "NO_COLOR")
                   + renv.THREAD_VARS if v in env]
        return ext.mpiexec_command(_target(args), world, export=export)

    name = "srun" if slurm else "mpiexec"
    return ext.ExternalRunner(name, build, base_env=base,
                              grace=args.grace_period,
                              max_restarts=args.max_restarts).run()


if __name__ == "__main__":
    main()

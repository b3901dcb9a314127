"""dtorch-launch hands everything after the script path to the script,
untouched: a script's option that abbreviates one of the launcher's (a
script's ``--n 5`` vs ``--nnodes``/``--nproc-per-node``) is the script's."""
import json

import pytest

from launch.cli import build_parser, parse_args
from launch_scripts.harness import UNDER_MPI, launch

if UNDER_MPI:
    pytest.skip("launcher tests start their own jobs", allow_module_level=True)

SCRIPT_ARGS = ["--n", "5", "--nproc", "2", "--master-port=7", "-m", "x",
               "--", "--help", "--node-rank", "3"]


@pytest.mark.parametrize("head, script", [
    (["--nproc-per-node", "2"], "train.py"),
    (["--nproc-per", "2", "--master-port=29999"], "train.py"),   # abbrev.
    (["--only-rank0-output", "-m"], "pkg.train"),
    (["--nnodes", "1", "--"], "-weird.py"),
])
def test_words_after_the_script_are_the_scripts(head, script):
    args = parse_args(build_parser(), head + [script] + SCRIPT_ARGS)
    assert args.script == script
    assert args.args == SCRIPT_ARGS
    assert args.nnodes == 1 and args.node_rank == 0


def test_launcher_options_before_the_script_still_parse():
    args = parse_args(build_parser(), ["--nproc-per-node", "3",
                                       "--master-port", "1234", "t.py"])
    assert (args.nproc_per_node, args.master_port, args.args) == \
        (3, 1234, [])
    with pytest.raises(SystemExit):           # still ambiguous *here*
        parse_args(build_parser(), ["--n", "2", "t.py"])
    with pytest.raises(SystemExit):           # no script at all
        parse_args(build_parser(), ["--nproc-per-node", "2"])


def test_the_dry_run_parser_keeps_the_scripts_words():
    from dtorch.distributed.dry_run import build_parser as dry_parser
    a = dry_parser().parse_args(["--nproc-per-node", "2", "t.py", "--n",
                                 "5", "--steps", "9"])
    assert (a.nproc_per_node, a.steps, a.args) == \
        (2, 2, ["--n", "5", "--steps", "9"])


def test_a_rank_receives_the_words(tmp_path):
    s = tmp_path / "show_argv.py"
    s.write_text("import sys, json\nprint('ARGV ' + json.dumps(sys.argv[1:]))"
                 "\n")
    code, out, err, _ = launch(["--nproc-per-node", "1", str(s)]
                               + SCRIPT_ARGS, timeout=60)
    assert code == 0, err
    line = next(x for x in out.splitlines() if "ARGV " in x)
    assert json.loads(line.split("ARGV ", 1)[1]) == SCRIPT_ARGS

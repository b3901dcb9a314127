"""The newcomer's path through README: the two Quick start commands are the
ones CI runs, the main job needs nothing beyond the light install, a missing
optional package names its extra, and no install line anywhere sends a user
to the unrelated `dtorch` on the public package index."""
import os
import re
import subprocess
import sys
import tomllib

import pytest

from helpers import one_thread_env, run_python

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))

pytestmark = pytest.mark.skipif(
    "OMPI_COMM_WORLD_SIZE" in os.environ,
    reason="starts its own processes; runs in the single-process phase")


def _read(rel):
    with open(os.path.join(ROOT, rel)) as f:
        return f.read()


def _quick_start_commands():
    sec = _read("README.md").split("## Quick start", 1)[1]
    block = re.search(r"```bash\n(.*?)```", sec, re.S).group(1)
    return [re.sub(r"\s+# \d\. .*$", "", line).rstrip()
            for line in block.splitlines() if line.strip()]


def test_ci_runs_readme_commands_in_order():
    cmds = _quick_start_commands()
    assert len(cmds) == 2 and cmds[0].endswith("python examples/digits.py")
    assert cmds[1].endswith("bash tests/run.sh")
    ci = _read(".ci/run").splitlines()
    for n, cmd in enumerate(cmds, 1):
        i = ci.index(f"# README set-up command {n}:")
        assert ci[i + 1] == cmd
    assert ci.index("# README set-up command 1:") < ci.index(
        "# README set-up command 2:")


def _texts():
    for d, _, files in os.walk(ROOT):
        if any(p in d for p in ("/.git", "/.venv", "__pycache__", "/runs")):
            continue
        for f in files:
            if f.endswith((".py", ".sh", ".md", ".sbatch", ".toml")) or \
                    f == "run":
                path = os.path.join(d, f)
                with open(path, errors="replace") as fh:
                    yield os.path.relpath(path, ROOT), fh.read()


def test_every_install_line_installs_from_the_clone():
    extras = set(tomllib.loads(_read("pyproject.toml"))["project"]
                 ["optional-dependencies"])
    bad, seen = [], 0
    for rel, text in _texts():
        if rel == "tests/project/test_newcomer_path.py":
            continue
        # "pip install dtorch", "pip install 'dtorch[onnx]'", ...
        bad += [f"{rel}: {m.group(0)}" for m in re.finditer(
            r"pip3? install(?: +-[-\w]+)* +['\"]?dtorch\b(?![-/.])", text)]
        for m in re.finditer(r"\.\[([\w,]+)\]", text):
            line = text[text.rfind("\n", 0, m.start()) + 1:m.end()]
            if "pip install" in line:
                seen += 1
                bad += [f"{rel}: unknown extra {e!r}" for e in
                        m.group(1).split(",") if e not in extras]
    assert bad == []
    assert seen >= 5


def _run_example(missing, *args):
    """digits.py in a fresh interpreter where the ``missing`` top-level
    packages are not installed (as after a light install)."""
    code = ("import runpy, sys\n"
            "class NotInstalled:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            f"        if name.split('.')[0] in {missing!r}:\n"
            "            raise ModuleNotFoundError(\n"
            "                f'No module named {name!r}', name=name)\n"
            "sys.meta_path.insert(0, NotInstalled())\n"
            f"sys.argv = ['examples/digits.py'] + {list(args)!r}\n"
            "runpy.run_path('examples/digits.py', run_name='__main__')\n")
    return run_python(code, cwd=ROOT, timeout=240, env=one_thread_env(),
                      check=False)


def test_main_job_without_scikit_learn_names_the_extra():
    r = _run_example(["sklearn"], "--epochs", "1")
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    assert r.stderr.strip().endswith(
        f'pip install -e "{ROOT}[examples]"   '
        "(the 'examples' extra of this dtorch clone)"), r.stderr
    assert "needs scikit-learn (module 'sklearn' is not installed)" in r.stderr


def test_main_job_needs_only_the_light_install(tmp_path):
    # everything only the dev/test extras bring is made unimportable
    heavy = ["torch", "mpi4py", "numba", "ray", "onnx", "onnxruntime",
             "tensorboard", "pytest", "hypothesis"]
    ck = str(tmp_path / "d.safetensors")
    r = _run_example(heavy,
                     "--epochs", "1", "--quiet", "--checkpoint", ck)
    assert r.returncode == 0, r.stderr[-2000:]
    assert re.search(r"final test accuracy [\d.]+%", r.stdout), r.stdout


def _help_entries(text):
    """{option: its help text} from argparse's --help output."""
    body = text.split("options:", 1)[1]
    entries, cur = {}, None
    for line in body.splitlines():
        m = re.match(r"  (-[-\w]+)(?:[ ,][^ ].*?)?(?:  +(.*))?$", line)
        if m:
            cur = m.group(1)
            entries[cur] = m.group(2) or ""
        elif cur and line.startswith("    "):
            entries[cur] += " " + line.strip()
    return entries


@pytest.mark.parametrize("example", ["digits", "ddp_digits", "tp_digits",
                                     "gpt"])
def test_example_options_have_help_and_one_default(example):
    r = subprocess.run([sys.executable, f"examples/{example}.py", "--help"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    entries = _help_entries(r.stdout)
    assert len(entries) > 5
    for opt, text in entries.items():
        assert text.strip(), f"{example}.py {opt} has no help"
        assert text.count("(default") <= 1, f"{example}.py {opt}: {text}"


def test_every_picture_has_the_command_that_writes_it():
    sec = _read("README.md").split("## Pictures", 1)[1].split("\n## ", 1)[0]
    cmds = re.search(r"```bash\n(.*?)```", sec, re.S).group(1).splitlines()
    images = re.findall(r"\]\((benchmarks/plots/[\w.]+\.png)\)", sec)
    assert len(images) == 5
    for img in images:
        stem = os.path.basename(img)[:-4]
        writers = [c for c in cmds if f"--plot {img}" in c
                   or f"--out {img[:-4]}.json" in c
                   or (f"/{stem}.py " in c and "--out benchmarks/plots " in c)]
        assert len(writers) == 1, (img, writers)
        script = re.search(r"(\S+\.py) ", writers[0]).group(1)
        assert os.path.exists(os.path.join(ROOT, script)), script
        assert os.path.exists(os.path.join(ROOT, img)), img

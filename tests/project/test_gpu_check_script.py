"""benchmarks/gpu_check.sh on a machine without a GPU stops at once with
"no GPU" and changes nothing: no pip, no python, no OUTDIR."""
import glob
import os
import stat
import subprocess
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.sh"

pytestmark = pytest.mark.skipif(
    bool(glob.glob("/dev/nvidia[0-9]*")),
    reason="this machine has an NVIDIA device: the script would run the check")


def _tool(bindir, name, body):
    p = bindir / name
    p.write_text("#!/bin/sh\n" + body)
    p.chmod(p.stat().st_mode | stat.S_IEXEC)


@pytest.mark.parametrize("smi", [None, "driver"])
def test_no_gpu_stops_before_installing(tmp_path, smi):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    calls = tmp_path / "calls"
    # every python/pip the script could reach records its call and fails
    for name in ("python3", "python", "pip", "pip3"):
        _tool(bindir, name, f'echo "{name} $*" >> {calls}\nexit 1\n')
    if smi == "driver":     # installed, but no driver to talk to
        _tool(bindir, "nvidia-smi",
              "echo 'NVIDIA-SMI has failed because it couldn'\\''t "
              "communicate with the NVIDIA driver.'\nexit 9\n")
    path = f"{bindir}:/usr/bin:/bin"
    if smi is None:
        assert subprocess.run(["sh", "-c", "command -v nvidia-smi"],
                              env={"PATH": path}).returncode != 0
    out = tmp_path / "out"
    t0 = time.monotonic()
    r = subprocess.run(["bash", str(SCRIPT), str(out)], capture_output=True,
                       text=True, timeout=60,
                       env={"PATH": path, "HOME": str(tmp_path),
                            "PYTHON": str(bindir / "python3")})
    assert time.monotonic() - t0 < 10
    assert r.returncode == 2, r.stderr
    assert "no GPU on this machine" in r.stderr
    assert ("communicate with the NVIDIA driver" in r.stderr) == (smi is not None)
    assert not calls.exists(), calls.read_text()
    assert not out.exists()

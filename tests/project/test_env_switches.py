"""DTORCH_* switches: one parser (collectives/env.py) and one README
table listing every variable the code reads."""
import os
import re

import pytest

from collectives import env_choice, env_flag, env_number, env_str

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


@pytest.mark.parametrize("value, want", [
    ("1", True), ("yes", True), ("TRUE", True), ("on", True), (" 1 ", True),
    ("0", False), ("no", False), ("False", False), ("OFF", False),
    ("", "dflt"), (None, "dflt")])
def test_env_flag(value, want):
    env = {} if value is None else {"DTORCH_X": value}
    assert env_flag("DTORCH_X", "dflt", env=env) == want


@pytest.mark.parametrize("value", ["2", "maybe", "nein", "-"])
def test_env_flag_rejects_other_values_naming_the_variable(value):
    with pytest.raises(ValueError, match=rf"DTORCH_X={value!r}: expected"):
        env_flag("DTORCH_X", True, env={"DTORCH_X": value})


def test_env_flag_unset_can_mean_unknown():
    assert env_flag("DTORCH_X", None, env={}) is None


def test_env_number():
    assert env_number("N", 5.0, env={}) == 5.0
    assert env_number("N", 5.0, env={"N": ""}) == 5.0
    assert env_number("N", 5.0, env={"N": "2.5"}) == 2.5
    assert env_number("N", 64, int, env={"N": "8"}) == 8
    for bad in ("0", "-1", "x", "nan", "1.5e"):
        with pytest.raises(ValueError, match=r"N=.* must be a positive"):
            env_number("N", 1.0, env={"N": bad})
    with pytest.raises(ValueError, match="must be a positive"):
        env_number("N", 1, int, env={"N": "2.5"})


def test_env_choice():
    ch = ("OFF", "INFO", "DETAIL")
    assert env_choice("D", "OFF", ch, env={}) == "OFF"
    assert env_choice("D", "OFF", ch, env={"D": "detail"}) == "DETAIL"
    with pytest.raises(ValueError, match=r"D='loud': expected one of OFF, "
                       r"INFO, DETAIL"):
        env_choice("D", "OFF", ch, env={"D": "loud"})


def test_env_str():
    assert env_str("B", "auto", env={}) == "auto"
    assert env_str("B", "auto", env={"B": "  "}) == "auto"
    assert env_str("B", "auto", env={"B": " mpi "}) == "mpi"


def test_switches_reach_their_readers(monkeypatch):
    from collectives import group, mpi
    monkeypatch.setenv("DTORCH_DISTRIBUTED_DEBUG", "info")
    assert group.debug_level() == "INFO"
    monkeypatch.setenv("DTORCH_COLLECTIVE_TIMEOUT", "7")
    assert group.as_seconds(None) == 7.0
    monkeypatch.setenv("DTORCH_ABORT_ON_ERROR", "off")
    assert mpi.abort_on_error_enabled() is False
    monkeypatch.setenv("DTORCH_MPI_CUDA_AWARE", "yes")
    assert mpi._cuda_aware(None) is True
    monkeypatch.setenv("DTORCH_BACKEND", "carrier-pigeon")
    import dtorch.distributed as dist
    with pytest.raises(ValueError, match="Invalid backend: 'carrier-pigeon'"):
        dist.init_process_group()
    assert not dist.is_initialized()


def _sources():
    for top in ("dtorch", "collectives", "launch"):
        for d, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if f.endswith(".py"):
                    p = os.path.join(d, f)
                    with open(p) as fh:
                        yield os.path.relpath(p, ROOT), fh.read()


def test_readme_lists_every_variable_the_code_reads():
    names = set()
    for _, src in _sources():
        names |= set(re.findall(r"\bDTORCH_[A-Z0-9_]*[A-Z0-9]\b", src))
    names.discard("DTORCH_META")      # a constant's name, not a variable
    with open(os.path.join(ROOT, "README.md")) as fh:
        readme = fh.read()
    table = readme[readme.index("## Environment variables"):]
    table = table[:table.index("\n## ")]
    missing = sorted(n for n in names if f"`{n}" not in table)
    assert not missing, f"README's table lacks {missing}"


def test_switches_are_parsed_by_the_helper_only():
    """No os.environ.get('DTORCH_...') of a switch outside the helper.
    Exceptions: the launcher builds the rank environment (values, not
    switches), and dtorch/__init__ reads DTORCH_MALLOC_TUNING before
    collectives may be imported."""
    pat = re.compile(r"environ(?:\.get)?\(\s*['\"]DTORCH_([A-Z_]+)")
    found = []
    for path, src in _sources():
        if path.startswith("launch") or path == os.path.join(
                "collectives", "env.py"):
            continue
        found += [f"{path}: DTORCH_{m}" for m in pat.findall(src)
                  if m != "MALLOC_TUNING"]
    assert not found

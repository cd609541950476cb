"""The first hour with cxlmpi, as a new user meets it (issue 41, item 4):
`--version` says which cxlmpi, MPI library and mpi4py run; `--info` fits
on a screen and shows what is not a default, with the selection cache's
entries for this job behind `--info --cache`.  Each test compares with what
the package itself says (its metadata, mpi4py, the cache file written)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import mpi4py
from harness import ROOT, mpi_env
from mpi4py import MPI

import cxlmpi
from cxlmpi import config
from cxlmpi.select import cache


def _cxlmpi(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`python -m cxlmpi ARGS` as one process, without the suite's settings."""
    clean = {var: value for var, value in mpi_env().items() if not var.startswith("CXLMPI_")}
    clean.update(env or {})
    proc = subprocess.run([sys.executable, "-m", "cxlmpi", *args], cwd=ROOT, env=clean,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc


def _library() -> str:
    return " ".join(MPI.Get_library_version().splitlines()[0].split())


def test_version_names_cxlmpi_the_mpi_library_and_mpi4py() -> None:
    """One line each, the version the package was installed as."""
    version = importlib.metadata.version("cxlmpi")
    declared = re.search(r'^version = "(.*)"$', (ROOT / "pyproject.toml").read_text(), re.M)
    assert declared and declared.group(1) == version == cxlmpi.__version__
    out = _cxlmpi(["--version"]).stdout
    assert out.splitlines() == [f"cxlmpi {version}", f"MPI library: {_library()}",
                                f"mpi4py {mpi4py.__version__}"]


def _entry(fp: dict) -> dict:
    decision = {"best": "pool", "runner_up": "mpi", "seconds": {"pool": 1e-5, "mpi": 2e-5}}
    return {"machine": fp, "decisions": {"bcast": {"65536": {"private": decision}},
                                         "allreduce": {"4096": {"private": decision}}}}


def _write_cache(path: Path, env: dict[str, str]) -> None:
    """A cache with an entry of this machine at 2 ranks and at 3, and two of
    others (another CPU, another MPI library), as cxlmpi writes them."""
    cfg = config.Config(env)
    mine = [cache.fingerprint(n, MPI.Get_library_version(), cfg) for n in (2, 3)]
    other_cpu = dict(mine[0], cpu="Some Other CPU 9000")
    other_mpi = dict(mine[0], mpi="Open MPI v5.0.0")
    machines = {json.dumps(fp, sort_keys=True): _entry(fp)
                for fp in (*mine, other_cpu, other_mpi)}
    path.write_text(json.dumps({"machines": machines}))
    os.chmod(path, 0o600)


def test_info_fits_a_screen_and_shows_what_differs(tmp_path: Path) -> None:
    """--info: version, MPI, the pool, the settings set away from their
    defaults (and no others), one line on the cache with its counts;
    --info --all lists every setting."""
    env = {"CXLMPI_CACHE": str(tmp_path / "cache.json"), "CXLMPI_POOL_SIZE": "1M",
           "CXLMPI_TIMEOUT": "300"}     # (set, but to its default)
    _write_cache(tmp_path / "cache.json", env)
    out = _cxlmpi(["--info"], env).stdout
    lines = out.splitlines()
    assert len(lines) <= 30, out
    assert lines[0] == f"cxlmpi {cxlmpi.__version__}"
    assert f"MPI library: {_library()}" in lines[1]
    assert "pool size: 1048576 B" in out
    changed = [line.split()[0] for line in lines if line.startswith("  CXLMPI_")]
    assert changed == ["CXLMPI_POOL_SIZE=1M", f"CXLMPI_CACHE={env['CXLMPI_CACHE']}"], out
    assert f"settings that differ from their defaults (2 of {len(config.VARIABLES)})" in out
    # one process alone: the entries of this machine at any number of ranks
    assert f"selection cache: {tmp_path / 'cache.json'}: 2 entries for this machine, " \
        "MPI and cxlmpi, 2 for others" in out, out
    assert "Some Other CPU" not in out and "bcast" not in out
    full = _cxlmpi(["--info", "--all"], env).stdout
    assert all(f"\n{var.name} " in full for var in config.VARIABLES)


def test_info_cache_shows_this_jobs_entries(tmp_path: Path) -> None:
    """--info --cache: the entries of this machine and MPI (alone: at any
    number of ranks), what they chose, and a count of the others."""
    env = {"CXLMPI_CACHE": str(tmp_path / "cache.json")}
    _write_cache(tmp_path / "cache.json", env)
    out = _cxlmpi(["--info", "--cache"], env).stdout
    assert "Some Other CPU" not in out and "Open MPI v5.0.0" not in out
    assert out.count(f", {_library()}, cxlmpi {cxlmpi.__version__}, pool shm:") == 2, out
    assert "2 ranks per pool" in out and "3 ranks per pool" in out
    assert [line.split() for line in out.splitlines() if line.startswith("    ")] == [
        ["bcast", "private", "pool", "from", "64", "KiB"],
        ["allreduce", "private", "pool", "from", "4", "KiB"]] * 2
    assert out.splitlines()[-1] == ("entries for other machines, MPI libraries, versions "
                                    "or ranks: 2 (not shown)")
    assert len(out.splitlines()) < 15

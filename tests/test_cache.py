"""The selection cache (cxlmpi.select.cache) is trusted only as far as it is
checked: it is read only when it is the user's own regular file, every
value in it is one cxlmpi writes, and everything else is ignored with one
warning; the compiled route table its size classes index refuses indices
outside it."""

from __future__ import annotations

import copy
import json
import math
import os
import random
import stat
import subprocess
import sys

import numpy as np
import pytest
from harness import ROOT, run_mpi
from select_sim import ALLREDUCE, Job, fixed
from test_reliability import tagged_json

from cxlmpi import _shim, config, select
from cxlmpi.errors import CXLMPIError
from cxlmpi.select import Selector, cache, interface

FP = cache.fingerprint(2, "MPICH Version: 9.9", config.Config({}))
ENTRY = {"best": "pool", "runner_up": "mpi", "seconds": {"pool": 1e-4, "mpi": 2e-4}}
CACHE_JOB = str(ROOT / "tests" / "scripts" / "cache_job.py")


def valid_cache(fp: dict = FP) -> dict:
    """A cache as cxlmpi writes it: two classes of one machine."""
    return {"machines": {cache._key(fp): {"machine": fp, "decisions": {
        "allreduce": {"1048576": {"private": dict(ENTRY)}},
        "bcast": {"4096": {"pool": dict(ENTRY, best="mpi", runner_up="pool")}}}}}}


def write(path, data, mode: int = 0o600) -> str:
    with open(path, "w") as f:
        f.write(data if isinstance(data, str) else json.dumps(data))
    os.chmod(path, mode)
    return str(path)


# --------------------------------------------------------------- values


def _garbage(rng: random.Random, depth: int = 0):
    """A random JSON value: the kinds a hand-made or planted cache holds."""
    kinds = ["int", "huge", "float", "nan", "str", "name", "none", "bool", "list", "dict"]
    kind = rng.choice(kinds if depth < 3 else kinds[:8])
    return {"int": lambda: rng.randint(-2**70, 2**70),
            "huge": lambda: 2 ** rng.choice([63, 64, 65, 100, 14000]),
            "float": lambda: rng.choice([0.0, -1e-3, 1e-300, 5e-324, 1e300, 1e-4]),
            "nan": lambda: rng.choice([math.nan, math.inf, -math.inf]),
            "str": lambda: rng.choice(["", "x", "1e3", "-4", "0x10", "١٢", "pool+warp"]),
            "name": lambda: rng.choice(["mpi", "pool", "pool+stream", "allreduce",
                                        "private", "pool", "1048576", str(2 ** 64)]),
            "none": lambda: None,
            "bool": lambda: rng.choice([True, False]),
            "list": lambda: [_garbage(rng, depth + 1) for _ in range(rng.randint(0, 3))],
            "dict": lambda: {str(_garbage(rng, depth + 1))[:30]: _garbage(rng, depth + 1)
                             for _ in range(rng.randint(0, 3))}}[kind]()


def _mutate(rng: random.Random, data: dict) -> dict:
    """`data` with one value, key or table anywhere replaced by garbage."""
    data = copy.deepcopy(data)
    node = data
    while True:
        if not isinstance(node, dict) or not node:
            break
        key = rng.choice(sorted(node))
        if rng.random() < 0.3 or not isinstance(node[key], dict):
            if rng.random() < 0.5:
                node[key] = _garbage(rng)
            else:   # the key itself: an out-of-range size, an unknown name
                value = node.pop(key)
                node[str(_garbage(rng))[:5000]] = value
            break
        node = node[key]
    return data


def _check_loaded(prior: dict) -> None:
    """What a reader hands on: classes of the route table, entries that a
    learner takes as they are, or refuses."""
    for (which, sc, pl), entry in prior.items():
        assert 0 <= which < len(config.COLLECTIVES) and 0 <= sc < select.NCLASSES
        assert pl in (0, 1)
        assert select.code_of(entry["best"]) is not None
        for seconds in entry["seconds"].values():
            assert math.isfinite(seconds) and cache.MIN_SECONDS <= seconds
        cands = select.candidates(config.COLLECTIVES[which], select.class_floor(sc), 2,
                                  pl == 1, 256 << 10)
        learner = select.Learner.from_cache(cands, entry)
        assert learner is None or all(math.isfinite(s) and s > 0
                                      for v in learner.samples.values() for s in v)


def test_fuzz_the_cache_reader(tmp_path, capsys) -> None:
    """A seeded random walk of mangled caches (one value, key or table
    replaced anywhere by garbage: sizes of 2**64 and 2**14000, NaN, wrong
    types, unknown names): the reader never raises, hands on only classes
    inside the route table with finite positive timings, warns once when
    it dropped something, and
    --info and writing the cache back (what Comm.Free does) never raise
    either; the file written back reads without a warning."""
    rng = random.Random(20240538)
    path = str(tmp_path / "selection.json")
    intact = cache.load_cache(write(path, valid_cache()), FP)
    assert len(intact) == 2
    learned = {(ALLREDUCE, 20, 0): select.Learner.from_cache(
        [select.MPI_PATH, 1], ENTRY)}
    for trial in range(400):
        data = valid_cache()
        for _ in range(rng.randint(1, 3)):
            data = _mutate(rng, data)
        truncated = rng.random() < 0.1
        write(path, json.dumps(data)[:-7] if truncated else json.dumps(data))
        cache._warned.clear()
        capsys.readouterr()
        prior = cache.load_cache(path, FP)
        _check_loaded(prior)
        err = capsys.readouterr().err
        assert err.count("cxlmpi: warning") <= 1, err
        machines = data.get("machines") if isinstance(data, dict) else None
        ours = isinstance(machines, dict) and cache._key(FP) in machines
        if truncated or (ours and not set(intact) <= set(prior)):
            assert err, (trial, data)   # something was dropped: it says so
        assert all(line for line in cache.describe_cache(path))
        assert cache.save_cache(path, FP, learned), trial
        cache._warned.clear()
        capsys.readouterr()
        _check_loaded(cache.load_cache(path, FP))
        assert capsys.readouterr().err == "", trial


def test_size_keys_outside_the_route_table_are_ignored(tmp_path, capsys) -> None:
    """A size key of 2**64 or more (size class 64+: past the compiled
    table's end, a heap write; 2**14000 crashed jobs) is dropped with one
    warning; the valid classes beside it are kept."""
    data = valid_cache()
    table = data["machines"][cache._key(FP)]["decisions"]["allreduce"]
    for size in (2 ** 64, 2 ** 100, 2 ** 14000, 1048577, -4):
        table[str(size)] = {"private": dict(ENTRY)}
    prior = cache.load_cache(write(tmp_path / "c.json", data), FP)
    assert set(prior) == set(cache.load_cache(write(tmp_path / "v.json", valid_cache()), FP))
    assert capsys.readouterr().err.count("cxlmpi: warning") == 1


def test_bad_timings_are_refused_and_wrong_ones_do_not_pin(tmp_path) -> None:
    """NaN, infinite, zero and negative timings are refused (by the reader
    and by Learner.from_cache); a finite but wrong cached figure -- the
    pool at 10 us where it takes 2 ms, MPI 1 ms -- makes a job take the
    same paths as the cache that told the truth (before: 1996 pool calls
    against 1817 of 20000; 1e-300 held the pool for 4312, NaN for 12424,
    each call 2x stock's)."""
    cands = select.candidates("allreduce", 1 << 20, 2, False, 256 << 10)
    for bad in (math.nan, math.inf, 0.0, -1e-3):
        entry = dict(ENTRY, best="pool+flat", seconds={"pool+flat": bad, "mpi": 1e-3})
        assert select.Learner.from_cache(cands, entry) is None
        data = valid_cache()
        data["machines"][cache._key(FP)]["decisions"]["allreduce"]["1048576"]["private"] \
            = entry
        path = write(tmp_path / "c.json", json.dumps(data, allow_nan=True))
        assert (ALLREDUCE, 20, 0) not in cache.load_cache(path, FP)
    cost = fixed({"mpi": 1e-3, "pool+flat": 2e-3, "pool+flat+stream": 3e-3,
                  "pool+rsag": 3e-3, "pool+rsag+stream": 3e-3})

    def paths(pool_s: float) -> list[int]:
        prior = {(ALLREDUCE, 20, 0): {"best": "pool+flat", "runner_up": "mpi",
                                      "seconds": {"pool+flat": pool_s, "mpi": 1e-3}}}
        job = Job(2, prior=prior)
        return [job.call(ALLREDUCE, 1 << 20, cost, call) for call in range(6000)]

    truth = paths(2e-3)
    assert truth[-1] == select.MPI_PATH
    assert paths(1e-5) == truth
    assert paths(2e-9) == truth


# ------------------------------------------------------------ the file


def _load_in_child(path: str) -> subprocess.CompletedProcess:
    """load_cache(path) in a child process (a FIFO must not hang the test)."""
    code = ("import json, sys; from cxlmpi import config; from cxlmpi.select import cache; "
            "fp = cache.fingerprint(2, 'MPICH Version: 9.9', config.Config({})); "
            "print(len(cache.load_cache(sys.argv[1], fp)))")
    return subprocess.run([sys.executable, "-c", code, path], capture_output=True,
                          text=True, timeout=120)


def test_the_cache_is_read_only_when_it_is_the_users_own_file(tmp_path) -> None:
    """The same valid cache is read from the user's own file of mode 0600
    or 0644, and ignored with a warning behind a symbolic link, as a file
    of another user, as a file others may write, as a FIFO (which hung
    every job at set-up) or as a directory."""
    text = json.dumps(valid_cache())
    own = write(tmp_path / "own.json", text)
    assert _load_in_child(own).stdout.split() == ["2"]
    assert _load_in_child(write(tmp_path / "readable.json", text, 0o644)).stdout.split() \
        == ["2"]
    link = tmp_path / "link.json"
    link.symlink_to(own)
    foreign = write(tmp_path / "foreign.json", text)
    if os.geteuid() == 0:
        os.chown(foreign, 65534, 65534)
    shared = write(tmp_path / "shared.json", text, 0o666)
    group = write(tmp_path / "group.json", text, 0o620)
    fifo = str(tmp_path / "fifo.json")
    os.mkfifo(fifo, 0o600)
    folder = tmp_path / "folder.json"
    folder.mkdir()
    refused = [str(link), shared, group, fifo, str(folder)]
    if os.geteuid() == 0:
        refused.append(foreign)
    for path in refused:
        proc = _load_in_child(path)
        assert proc.stdout.split() == ["0"], (path, proc.stdout, proc.stderr)
        assert proc.stderr.count("cxlmpi: warning: the selection cache") == 1, \
            (path, proc.stderr)
    assert _load_in_child(str(tmp_path / "missing.json")).stderr == ""


def test_the_cache_is_written_private(tmp_path) -> None:
    """Under umask 000 the folders cxlmpi makes for the cache are 0700 and
    the file 0600 (they were 0777 and 0600): another user can neither
    read what was learned nor swap the file."""
    path = tmp_path / "a" / "b" / "selection.json"
    learned = {(ALLREDUCE, 20, 0): select.Learner.from_cache([select.MPI_PATH, 1], ENTRY)}
    old = os.umask(0)
    try:
        assert cache.save_cache(str(path), FP, learned)
    finally:
        os.umask(old)
    for folder in (tmp_path / "a", tmp_path / "a" / "b"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, oct(folder.stat().st_mode)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert set(cache.load_cache(str(path), FP)) == set(learned)


# ----------------------------------------------------- the compiled table


class _FakePool:
    """What Routes reads of a pool: the call counter's address, the arenas."""

    zerocopy_min_nbytes = 0

    def __init__(self) -> None:
        self.ops = np.zeros(1, np.uint64)

    def ops_address(self) -> int:
        return self.ops.ctypes.data

    def arena_span(self) -> tuple[int, int]:
        return (0, 0)


def test_the_route_table_refuses_indices_outside_it() -> None:
    """Routes.set and placement raise for a class or path code outside the
    table (before: written past its end, no check), and keep every class
    inside it."""
    routes = _shim.Routes(_FakePool())
    ncoll = len(config.COLLECTIVES)
    routes.set(ncoll - 1, select.NCLASSES - 1, 1, select.MPI_PATH + 16, 7)
    assert routes.placement(ncoll - 1, select.NCLASSES - 1) == 0
    for which, sc, pl, code in ((0, select.NCLASSES, 0, 0), (0, 1000, 0, 0),
                                (ncoll, 0, 0, 0), (-1, 0, 0, 0), (0, 0, 2, 0),
                                (0, 0, -1, 0), (0, 0, 0, 17), (0, 0, 0, -3)):
        with pytest.raises(CXLMPIError):
            routes.set(which, sc, pl, code, 0)
    with pytest.raises(CXLMPIError):
        routes.placement(0, select.NCLASSES)
    with pytest.raises(CXLMPIError):
        routes.first_runs([1] * 65, [0] * 65)


def test_a_job_with_a_planted_cache_matches_stock(tmp_path) -> None:
    """Two ranks whose cache holds, beside a valid class, classes of size
    2**64 and 2**14000 and a NaN timing: the job's Allreduce results equal
    stock MPI's, the valid class is taken as cached, and rank 0 warns once.
    Once rank 0 has changed the class's entry, every rank's next
    communicators take the new one (the others keep what rank 0 sent last,
    and get it again only where it changed)."""
    path = str(tmp_path / "selection.json")
    proc = run_mpi(2, [CACHE_JOB, path], env={"CXLMPI_TUNING": "adaptive",
                                              "CXLMPI_CACHE": path})
    result = tagged_json(proc.stdout, "RESULT")
    assert result["wrong"] == 0 and result["decision"] == "pool+flat", result
    assert result["later"] == [["mpi", "mpi"]] * 2, result
    assert proc.stderr.count("cxlmpi: warning: the selection cache") == 1, proc.stderr


def test_both_halves_keep_the_declared_interface() -> None:
    """cxlmpi.select.interface names what each half of path selection calls
    of the other: the compiled route table offers every method of
    RouteTable and holds its policy (`selector`), the Selector answers
    every method of Policy -- a rename on either side fails here, not in
    the middle of a job's first header step."""
    for protocol, kind in ((interface.RouteTable, _shim.Routes),
                           (interface.Policy, Selector)):
        wanted = [name for name, value in vars(protocol).items()
                  if callable(value) and not name.startswith("_")]
        assert wanted, protocol
        missing = [name for name in wanted if not callable(getattr(kind, name, None))]
        assert missing == [], f"{kind.__name__} lacks {missing} of {protocol.__name__}"
    assert hasattr(_shim.Routes, "selector")

"""`python -m cxlmpi.bench`, the stock-vs-cxlmpi compare tool, end to end.

Each test launches a short MPI job (tiny sizes, a few iterations, one round)
and checks what the tool reports -- the records, the validation, the exit
status -- never how fast anything was.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import math
from pathlib import Path

import pytest
from harness import SMALL_POOL_ENV, run_mpi

FAST = ["--iterations", "5", "--warmup", "2", "--rounds", "1", "--quiet"]
TIMEOUT = 60


def _bench(nranks: int, args: list[str], **kwargs):
    return run_mpi(nranks, ["-m", "cxlmpi.bench", *args], env=SMALL_POOL_ENV,
                   timeout=TIMEOUT, **kwargs)


def _check_timings(record: dict) -> None:
    for label in ("stock", "cxlmpi"):
        low, avg, high = (record[f"{label}_{s}_us"] for s in ("min", "avg", "max"))
        assert 0 < low <= avg <= high, record
    assert math.isfinite(record["speedup"]) and record["speedup"] > 0, record


def test_json_csv_and_validation(tmp_path: Path) -> None:
    """Two ranks, two collectives, two sizes: one record each, validated,
    with the metadata; the CSV has the same rows."""
    out, table = tmp_path / "out.json", tmp_path / "out.csv"
    proc = _bench(2, ["--ops", "Allreduce,Bcast", "--sizes", "8,64K", *FAST, "--validate",
                      "--data-varying", "--json", str(out), "--csv", str(table)])
    data = json.loads(out.read_text())
    records = data["records"]
    assert [(r["op"], r["size"]) for r in records] == [
        ("Allreduce", 8), ("Allreduce", 65536), ("Bcast", 8), ("Bcast", 65536)]
    for r in records:
        assert r["valid"] is True and r["validation_errors"] == [], r
        assert r["ranks"] == 2 and r["iterations"] == 5 and r["warmup"] == 2
        assert r["data_varying"] is True and r["buffers"] == "private"
        _check_timings(r)
        assert r["memcpy_avg_us"] > 0 and r["cxlmpi_per_memcpy"] > 0
    # The test pool's threshold is 64 B: 8 B passes through, 64 KiB does not.
    assert [r["path"] for r in records] == ["mpi", "pool", "mpi", "pool"]
    assert records[0]["dtype"] == "float64" and records[2]["dtype"] == "uint8"

    meta = data["metadata"]
    assert meta["ranks"] == 2
    assert meta["mpi_library"] and meta["cxlmpi_version"]
    assert meta["settings"]["CXLMPI_THRESHOLD"] == 64
    assert meta["bench"]["validate"] is True

    with open(table, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["op"], int(r["size"])) for r in rows] == [
        (r["op"], r["size"]) for r in records]

    assert "64 KiB" in proc.stdout and "speedup" in proc.stdout
    assert "# 2 ranks," in proc.stdout
    assert "FAIL" not in proc.stdout


def test_every_collective_three_ranks(tmp_path: Path) -> None:
    """All collectives at three ranks agree with stock MPI; sizes are rounded
    to whole elements (and to whole blocks for Reduce_scatter_block), and
    Barrier is measured once."""
    out = tmp_path / "all.json"
    _bench(3, ["--ops", "all", "--sizes", "8,100,4K", "--iterations", "2", "--warmup", "1",
               "--rounds", "1", "--quiet", "--validate", "--json", str(out)])
    records = json.loads(out.read_text())["records"]
    sizes: dict[str, list[int]] = {}
    for r in records:
        assert r["valid"] is True, r
        _check_timings(r)
        sizes.setdefault(r["op"], []).append(r["size"])
    assert sizes["Allreduce"] == [8, 96, 4096]
    assert sizes["Bcast"] == [8, 100, 4096]
    assert sizes["Reduce_scatter_block"] == [24, 96, 4080]
    assert sizes["Barrier"] == [0]
    assert set(sizes) == {"Allreduce", "Reduce", "Bcast", "Allgather", "Gather", "Scatter",
                          "Alltoall", "Reduce_scatter_block", "Scan", "Exscan", "Barrier"}
    alltoall = next(r for r in records if r["op"] == "Alltoall" and r["size"] == 100)
    assert alltoall["total_bytes"] == 300


# A job that breaks cxlmpi's Allreduce on purpose: the last element of the
# result is off by one on the wrapped communicator only.
CORRUPT = """
import dataclasses, sys
import cxlmpi
from cxlmpi.tools import bench

real_bind = bench.BENCHMARKS["Allreduce"].bind

def broken(comm, bufs):
    fn, args = real_bind(comm, bufs)
    if not isinstance(comm, cxlmpi.CXLComm):
        return fn, args
    def call(*a):
        fn(*a)
        bufs.recv[-1] += 1
    return call, args

bench.BENCHMARKS["Allreduce"] = dataclasses.replace(bench.BENCHMARKS["Allreduce"],
                                                     bind=broken)
sys.exit(bench.main(sys.argv[1:]))
"""


def test_validation_failure_is_loud(tmp_path: Path) -> None:
    """A wrong cxlmpi result fails --validate: the record says so, stderr
    says where, and the exit status is non-zero; other collectives pass."""
    out = tmp_path / "bad.json"
    proc = run_mpi(2, ["-c", CORRUPT, "--ops", "Allreduce,Bcast", "--sizes", "64K", *FAST,
                       "--validate", "--json", str(out)],
                   env=SMALL_POOL_ENV, timeout=TIMEOUT, check=False)
    assert proc.returncode == 1, proc.stderr
    assert "VALIDATION FAILED: Allreduce 64 KiB: rank 0: 1 of 8192 elements differ" \
        in proc.stderr
    assert "rank 1: 1 of 8192" in proc.stderr
    records = {r["op"]: r for r in json.loads(out.read_text())["records"]}
    assert records["Allreduce"]["valid"] is False
    assert len(records["Allreduce"]["validation_errors"]) == 2
    assert records["Bcast"]["valid"] is True
    assert "FAIL" in proc.stdout


def test_pool_buffers(tmp_path: Path) -> None:
    """--buffers pool: pool-resident arrays on both communicators, results
    validated against stock; Bcast_view only with pool buffers."""
    out = tmp_path / "pool.json"
    run_mpi(2, ["-m", "cxlmpi.bench", "--buffers", "pool", "--ops",
                "Allreduce,Bcast,Allgather,Bcast_view", "--sizes", "8K", *FAST,
                "--validate", "--json", str(out)], env=SMALL_POOL_ENV, timeout=TIMEOUT)
    records = json.loads(out.read_text())["records"]
    assert [(r["op"], r["buffers"], r["valid"]) for r in records] == [
        ("Allreduce", "pool", True), ("Bcast", "pool", True), ("Allgather", "pool", True),
        ("Bcast_view", "pool", True)]
    assert records[-1]["path"] == "view"
    proc = _bench(1, ["--ops", "Bcast_view", "--sizes", "8", *FAST], check=False)
    assert proc.returncode == 2 and "use --buffers pool" in proc.stderr


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is not None,
                    reason="matplotlib is installed")
def test_plot_without_matplotlib(tmp_path: Path) -> None:
    """--plot fails at once, with a clear message, when matplotlib is missing."""
    proc = _bench(1, ["--plot", str(tmp_path / "x.png"), "--sizes", "8", *FAST], check=False)
    assert proc.returncode == 2
    assert "--plot needs matplotlib" in proc.stderr
    assert not (tmp_path / "x.png").exists()


def _record(op: str, size: int, path: str, stock: list[float], shim: list[float]) -> dict:
    """A record as measure() makes it, with the per-round figures given."""
    med_stock, med_shim = sorted(stock)[len(stock) // 2], sorted(shim)[len(shim) // 2]
    return {"op": op, "size": size, "path": path,
            "stock_avg_us": med_stock, "cxlmpi_avg_us": med_shim,
            "memcpy_avg_us": size / 1e4, "speedup": med_stock / med_shim,
            "rounds_stock_avg_us": stock, "rounds_cxlmpi_avg_us": shim,
            "rounds_memcpy_avg_us": [size / 1e4] * len(stock)}


def test_plot_panels_sizes_paths_and_spread() -> None:
    """plot_figure: one latency and one speedup axes per collective, Barrier
    too (one point over "no message"); points only at the measured sizes,
    x ticks at exactly those; cxlmpi's points marked by path (pool and
    passed to MPI differ); one speedup scale for every panel, set by the
    medians and 1.0 (drawn), never by a wild round, whose whisker is
    clipped to it; whiskers span the rounds' min to max."""
    pytest.importorskip("matplotlib")
    from cxlmpi.tools.bench import PATH_MARKERS, plot_figure
    from cxlmpi.tools.report import PATH_LABELS

    records = [
        _record("Allreduce", 8, "mpi", [10, 11, 300], [10.5, 11, 12]),   # a wild round
        _record("Allreduce", 65536, "pool", [40, 41, 42], [20, 21, 25]),
        _record("Allreduce", 1 << 24, "pool", [3000, 3100, 3200], [2000, 2100, 2300]),
        _record("Bcast", 8, "mpi", [5, 6, 7], [5, 6, 7]),
        _record("Bcast", 1 << 24, "pool", [900, 1000, 1100], [800, 820, 840]),
        _record("Reduce_scatter_block", 24, "mpi", [9, 9, 9], [9, 9, 9]),
        _record("Barrier", 0, "pool", [4, 4, 4], [1, 1, 1]),
    ]
    measured = {"Allreduce": [8, 65536, 1 << 24], "Bcast": [8, 1 << 24],
                "Reduce_scatter_block": [24], "Barrier": [0]}
    fig = plot_figure(records)
    assert sorted(ax.get_label() for ax in fig.axes) == sorted(
        f"{op} {kind}" for op in measured for kind in ("latency", "speedup"))
    assert PATH_MARKERS["pool"] != PATH_MARKERS["mpi"]
    gains = [ax for ax in fig.axes if ax.get_label().endswith(" speedup")]
    [scale] = {ax.get_ylim() for ax in gains}          # one scale for every panel
    medians = [r["speedup"] for r in records]
    assert scale[0] < min(medians) and max(medians) < scale[1] < 25 / 1.1
    assert scale[0] < 1.0 < scale[1]
    for ax in fig.axes:
        op, kind = ax.get_label().rsplit(" ", 1)
        lines = {line.get_label(): line for line in ax.get_lines()}
        spreads = {c.get_label(): c for c in ax.collections if c.get_label().endswith("spread")}
        rows = {r["size"]: r for r in records if r["op"] == op}
        points = {label: line for label, line in lines.items() if label != "1.0x"}
        drawn = sorted({float(x) for line in points.values() for x in line.get_xdata()})
        assert drawn == measured[op], (ax.get_label(), drawn)
        assert all(line.get_linestyle() == "None" for line in points.values()), \
            "points only: no lines between sizes"
        assert list(ax.get_xticks()) == measured[op]
        if op == "Barrier" and kind == "speedup":
            assert [t.get_text() for t in ax.get_xticklabels()] == ["no message"]
        for path in ("pool", "mpi"):
            want = [s for s in measured[op] if rows[s]["path"] == path]
            line = lines.get(PATH_LABELS[path])
            if line is None:
                assert want == [], (ax.get_label(), path)
                continue
            assert line.get_marker() == PATH_MARKERS[path]
            assert list(line.get_xdata()) == want
        if kind == "latency":
            # The whisker of each size: from the fastest to the slowest round.
            spans = [(seg[0][1], seg[1][1]) for seg in spreads["stock spread"].get_segments()]
            assert spans == [(min(rows[s]["rounds_stock_avg_us"]),
                              max(rows[s]["rounds_stock_avg_us"])) for s in measured[op]]
        else:
            assert list(lines["1.0x"].get_ydata()) == [1.0, 1.0]
            for collection in spreads.values():
                for seg in collection.get_segments():
                    assert scale[0] <= seg[0][1] <= seg[1][1] <= scale[1], ax.get_label()
    wild = next(c for ax in gains if ax.get_label() == "Allreduce speedup"
                for c in ax.collections if c.get_label() == f"{PATH_LABELS['mpi']} spread")
    assert wild.get_segments()[0][1][1] == scale[1]      # 300/12 = 25x, clipped


def test_plot_written_and_one_rank_is_singular(tmp_path: Path) -> None:
    """A run on one process says '1 rank'; with matplotlib, --plot writes a
    PNG of the run."""
    has_plot = importlib.util.find_spec("matplotlib") is not None
    png = tmp_path / "bench.png"
    proc = _bench(1, ["--ops", "Allreduce,Bcast", "--sizes", "8,64K", *FAST]
                  + (["--plot", str(png)] if has_plot else []))
    assert "# 1 rank," in proc.stdout, proc.stdout
    if has_plot:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_learning_starts_afresh_every_round(tmp_path: Path) -> None:
    """--learning: every round's learning communicator learns from nothing,
    though the communicators before it were pinned to a path and freed
    (their pool state passes to the next Dup of the same ranks) and had
    settled classes (which the selection cache would hand the next): each
    round has learning calls (a pin carried over had none), and no cache
    is written."""
    cache = tmp_path / "selection.json"
    # (4 MiB: a class that settles within 40 calls, as smaller ones may not)
    proc = run_mpi(2, ["-m", "cxlmpi.bench", "--ops", "Allreduce,Bcast", "--sizes", "4M",
                       "--learning", "40", "--rounds", "3", "--quiet"],
                   env={**SMALL_POOL_ENV, "CXLMPI_TUNING": "adaptive",
                        "CXLMPI_CACHE": str(cache)}, timeout=TIMEOUT)
    rows = [line.split() for line in proc.stdout.splitlines()
            if line.startswith(("Allreduce ", "Bcast "))]
    assert len(rows) == 2, proc.stdout
    for row in rows:
        counts = [int(n) for n in row[-2].split("/")]
        assert len(counts) == 3 and min(counts) > 0, proc.stdout
    assert not cache.exists(), cache.read_text()
    pinned = _bench(2, ["--ops", "Bcast", "--sizes", "64K", "--learning", "5"], check=False)
    assert pinned.returncode != 0 and "--learning measures adaptive selection" in \
        pinned.stderr, pinned.stderr


POSTED_ENV = {**SMALL_POOL_ENV, "CXLMPI_NONBLOCKING_THRESHOLD": "0", "CXLMPI_CACHE": "off"}


def test_overlap_records_paths_and_validation(tmp_path: Path) -> None:
    """--overlap --validate: one record per nonblocking collective, each
    result equal to stock's on the same data, the path each form took (the
    pool, posted, persistent and blocking alike, at 64 KiB under
    CXLMPI_TUNING=pool), and the ratios derived from the timings it
    reports."""
    out = tmp_path / "overlap.json"
    run_mpi(2, ["-m", "cxlmpi.bench", "--overlap", "--overlap-ops", "all", "--sizes", "64K",
                "--overlap-compute", "wait", *FAST, "--validate", "--json", str(out)],
            env=POSTED_ENV, timeout=TIMEOUT)
    data = json.loads(out.read_text())
    records = data["records"]
    assert data["metadata"]["bench"]["compute"] == "wait"
    assert [r["op"] for r in records] == [
        "Iallreduce", "Ibcast", "Iallgather", "Igather", "Iscatter", "Ialltoall",
        "Igatherv", "Iscatterv", "Ialltoallv"]
    assert data["metadata"]["mode"] == "overlap"
    assert data["metadata"]["bench"]["validate"] is True
    for r in records:
        assert r["valid"] is True and r["validation_errors"] == [], r
        assert (r["posted_path"], r["persistent_path"], r["blocking_path"]) == \
            ("pool", "pool", "pool"), r
        for who in ("stock", "cxlmpi"):
            for key in ("blocking_us", "persistent_us", "pure_us", "compute_us", "total_us"):
                assert math.isfinite(r[f"{who}_{key}"]) and r[f"{who}_{key}"] > 0, r
            assert 0 <= r[f"{who}_overlap_pct"] <= 100, r
        assert r["speedup"] == pytest.approx(r["stock_total_us"] / r["cxlmpi_total_us"])
        assert r["posted_over_blocking"] == pytest.approx(
            r["cxlmpi_pure_us"] / r["cxlmpi_blocking_us"])
        assert r["persistent_over_blocking"] == pytest.approx(
            r["cxlmpi_persistent_us"] / r["cxlmpi_blocking_us"])


COMPUTE_KINDS = """
import time
import numpy as np
from cxlmpi.tools.overlap import _compute
for work in (None, np.ones(64)):
    cpu, wall = time.process_time(), time.perf_counter()
    _compute(0.05, work)
    print("CPU", time.process_time() - cpu, time.perf_counter() - wall)
"""


def test_overlap_compute_wait_leaves_the_core() -> None:
    """--overlap-compute wait: the compute between post and wait leaves the
    thread's core free (a thread that waits for a GPU kernel), where
    OSU's compute keeps it busy."""
    proc = run_mpi(1, ["-c", COMPUTE_KINDS], timeout=TIMEOUT)
    (waits, busy) = [[float(x) for x in line.split()[1:]] for line in
                     proc.stdout.splitlines() if line.startswith("CPU")]
    assert waits[1] >= 0.05 and busy[1] >= 0.05, (waits, busy)
    assert waits[0] < 0.025 < busy[0], (waits, busy)


CORRUPT_POSTED = """
import sys
import cxlmpi
from cxlmpi.tools import bench, overlap

arguments, counts = overlap.OVERLAP_OPS["Iallreduce"]

def broken(comm, send, recv):
    if isinstance(comm, cxlmpi.CXLComm):
        send = send + 1            # cxlmpi's call reduces other data
    return arguments(comm, send, recv)

overlap.OVERLAP_OPS["Iallreduce"] = (broken, counts)
sys.exit(bench.main(sys.argv[1:]))
"""


def test_overlap_validation_failure_is_loud(tmp_path: Path) -> None:
    """A wrong posted result fails --overlap --validate: the record and
    stderr say which, the exit status is 1; the other collective passes."""
    out = tmp_path / "bad.json"
    proc = run_mpi(2, ["-c", CORRUPT_POSTED, "--overlap", "--overlap-ops", "Iallreduce,Ibcast",
                       "--sizes", "64K", *FAST, "--validate", "--json", str(out)],
                   env=POSTED_ENV, timeout=TIMEOUT, check=False)
    assert proc.returncode == 1, proc.stderr
    assert "VALIDATION FAILED: Iallreduce 64 KiB: rank 0: 8192 of 8192 elements differ" \
        in proc.stderr
    records = {r["op"]: r for r in json.loads(out.read_text())["records"]}
    assert records["Iallreduce"]["valid"] is False
    assert len(records["Iallreduce"]["validation_errors"]) == 2
    assert records["Ibcast"]["valid"] is True

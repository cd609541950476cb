"""`python -m cxlmpi.tune`: the window rule (a pure function, no MPI) and one
short tuning job end to end (the file it writes, never how fast anything was)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from harness import SMALL_POOL_ENV, run_mpi

from cxlmpi import config
from cxlmpi.tools.tune import DERIVED, build_table, choose_window

K = 1 << 10
SIZES = [4 * K << i for i in range(8)]  # 4 KiB .. 512 KiB


# ------------------------------------------------------------ choose_window


def test_win_in_the_middle() -> None:
    """lo = the first winning size, hi = the first size after the run."""
    speedups = [0.5, 0.9, 1.2, 1.5, 1.4, 0.8, 0.6, 0.5]
    assert choose_window(SIZES, speedups) == [16 * K, 128 * K]


def test_win_from_the_start() -> None:
    """A run from the smallest size: lo null (from CXLMPI_THRESHOLD)."""
    assert choose_window(SIZES, [2.0, 1.8, 1.5, 1.1, 0.9, 0.7, 0.6, 0.5]) == [None, 64 * K]


def test_win_to_the_end() -> None:
    """A run to the largest size: hi null (no upper bound); both: every size."""
    assert choose_window(SIZES, [0.5, 0.6, 0.8, 0.97, 1.1, 1.3, 1.6, 2.0]) == [64 * K, None]
    assert choose_window(SIZES, [1.5] * 8) == [None, None]


def test_no_win() -> None:
    """Nothing wins by the margin: null, MPI at every size."""
    assert choose_window(SIZES, [0.5, 0.8, 1.0, 1.02, 1.029, 0.99, 0.7, 0.4]) is None
    assert choose_window(SIZES, [None] * 8) is None
    assert choose_window([], []) is None


def test_margin() -> None:
    """A size wins when speedup >= 1 + margin, exactly at the boundary too."""
    speedups = [0.5, 1.05, 1.05, 0.5, 0.5, 0.5, 0.5, 0.5]
    assert choose_window(SIZES, speedups, margin=0.05) == [8 * K, 32 * K]
    assert choose_window(SIZES, speedups, margin=0.06) is None
    assert choose_window(SIZES, speedups, margin=0.0) == [8 * K, 32 * K]


def test_single_noisy_tie_inside_a_run_is_bridged() -> None:
    """One size within the margin either way (1/1.03 <= s < 1.03), between two
    wins, stays in the run: one noisy point does not split the window."""
    speedups = [0.5, 1.3, 1.4, 0.99, 1.5, 1.3, 0.7, 0.6]
    assert choose_window(SIZES, speedups) == [8 * K, 256 * K]


def test_real_loss_or_two_ties_split_a_run() -> None:
    """A clear loss (below 1 / (1 + margin)) or two ties in a row end a run;
    the longest part is chosen."""
    loss = [0.5, 1.3, 1.4, 0.9, 1.5, 1.3, 1.2, 0.6]
    assert choose_window(SIZES, loss) == [64 * K, 512 * K]
    ties = [1.5, 1.4, 1.0, 1.0, 1.3, 1.2, 0.5, 0.5]
    assert choose_window(SIZES, ties) == [None, 16 * K]  # equal length: larger product wins
    # A tie at either end of a run is not bridged (it has one winning neighbour).
    assert choose_window(SIZES, [1.0, 1.5, 1.5, 1.0, 0.5, 0.5, 0.5, 0.5]) == [8 * K, 32 * K]


def test_longest_run_and_ties() -> None:
    """The longest run wins; equal lengths go to the larger product of
    speedups, then to the smaller sizes."""
    speedups = [1.2, 1.2, 0.5, 1.9, 0.5, 1.1, 1.1, 1.1]
    assert choose_window(SIZES, speedups) == [128 * K, None]
    assert choose_window(SIZES, [1.5, 0.5, 2.0, 0.5, 0.5, 0.5, 0.5, 0.5]) == [16 * K, 32 * K]
    assert choose_window(SIZES, [1.5, 0.5, 1.5, 0.5, 0.5, 0.5, 0.5, 0.5]) == [None, 8 * K]


def test_unmeasured_sizes_lose() -> None:
    """None (the size passed through to MPI) and NaN never win."""
    speedups = [None, 1.5, 1.5, math.nan, 1.5, 0.5, 0.5, 0.5]
    assert choose_window(SIZES, speedups) == [8 * K, 32 * K]


def test_bad_input() -> None:
    with pytest.raises(ValueError):
        choose_window([1, 2], [1.0])
    with pytest.raises(ValueError):
        choose_window([2, 1], [1.0, 1.0])
    with pytest.raises(ValueError):
        choose_window([1, 2], [1.0, 1.0], margin=-0.1)


# ------------------------------------------------------------ the file


def test_build_table(tmp_path: Path) -> None:
    """Measured windows and their vector variants; every other collective
    with a builtin window keeps it; collectives without one are left out
    (missing = every size, as builtin); cxlmpi accepts the result."""
    table = build_table({"bcast": [1 << 20, None], "allgather": None,
                         "alltoall": [None, 64 * K]})
    assert table["bcast"] == [1 << 20, None]
    assert table["allgather"] is None and table["allgatherv"] is None
    assert table["alltoall"] == table["alltoallv"] == [None, 64 * K]
    for name in ("gather", "gatherv", "scatter", "scatterv"):
        assert table[name] == config.BUILTIN_WINDOWS[name]
    assert set(table) == set(config.BUILTIN_WINDOWS)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(table))
    windows = config.Config({"CXLMPI_TUNING": str(path)}).windows()
    assert windows["bcast"] == (1 << 20, None)
    assert windows["allgatherv"] is None and windows["gather"] is None
    assert windows["alltoallv"] == (4 * K, 64 * K)  # lo null: CXLMPI_THRESHOLD
    assert windows["allreduce"] == (4 * K, None)
    reductions = build_table({"reduce_scatter_block": [None, 1 << 20]})
    assert reductions["reduce_scatter"] == [None, 1 << 20]
    assert set(DERIVED.values()) <= set(config.COLLECTIVES)


# ------------------------------------------------------------ end to end


def test_tune_end_to_end(tmp_path: Path) -> None:
    """Two ranks, two collectives, tiny sizes and iterations: the file is
    accepted by cxlmpi.config, holds the measured collectives, their vector
    variants and the builtin windows of the others; the report holds every
    measurement.  CXLMPI_TUNING points to a missing file: the tool must not
    read it (it forces the pool path itself)."""
    out, report = tmp_path / "tuned.json", tmp_path / "report.json"
    env = dict(SMALL_POOL_ENV, CXLMPI_TUNING=str(tmp_path / "missing.json"))
    proc = run_mpi(2, ["-m", "cxlmpi.tune", "--ops", "Bcast,Allgather", "--min-size", "4K",
                       "--max-size", "64K", "--rounds", "1", "--iterations", "3",
                       "--warmup", "1", "--output", str(out), "--report", str(report)],
                   env=env, timeout=60)
    table = json.loads(out.read_text())
    assert set(table) == {"bcast", "allgather", "allgatherv", "gather", "gatherv",
                          "scatter", "scatterv", "alltoall", "alltoallv"}
    assert table["allgatherv"] == table["allgather"]
    assert table["alltoall"] == table["alltoallv"] == config.BUILTIN_WINDOWS["alltoall"]
    assert table["gather"] is None and table["scatter"] is None
    windows = config.Config({"CXLMPI_TUNING": str(out)}).windows()
    assert set(windows) == set(config.COLLECTIVES)
    assert f"export CXLMPI_TUNING={out}" in proc.stdout
    assert "Allgather" in proc.stdout and "allgatherv" in proc.stdout
    assert "[2/10] Bcast 8 KiB" in proc.stderr

    data = json.loads(report.read_text())
    assert data["windows"] == table
    assert data["metadata"]["tool"] == "cxlmpi.tune" and data["metadata"]["ranks"] == 2
    for key, op in (("bcast", "Bcast"), ("allgather", "Allgather")):
        measured = data["measured"][key]
        assert measured["window"] == table[key]
        records = measured["records"]
        assert [r["size"] for r in records] == [4 * K << i for i in range(5)]
        assert all(r["op"] == op and r["path"] == "pool" and r["speedup"] > 0
                   for r in records)
    # Windows are bytes of all blocks together: block x 2 ranks for Allgather.
    assert [r["total_bytes"] for r in data["measured"]["allgather"]["records"]] == \
        [8 * K << i for i in range(5)]


def test_bad_request(tmp_path: Path) -> None:
    """An op without a window to tune is refused before measuring (status 2)."""
    out = tmp_path / "x.json"
    proc = run_mpi(2, ["-m", "cxlmpi.tune", "--ops", "Barrier", "--output", str(out)],
                   env=SMALL_POOL_ENV, timeout=60, check=False)
    assert proc.returncode == 2
    assert "'Barrier' cannot be tuned" in proc.stderr
    assert not out.exists()

"""What the runner tests share (tests/test_runner.py,
tests/test_runner_info.py): the helper programs in tests/scripts/, the
settings their jobs run with, and readers of what the jobs print (tagged
lines, the stats tables)."""

from __future__ import annotations

import json
import os
import re

from harness import (
    ROOT,
    SCRIPTS,
)

NRANKS = 2
PROBE = "tests/scripts/probe.py"
FAILING = "tests/scripts/failing.py"
PATCHING = "tests/scripts/patching.py"
STATS_CALLS = "tests/scripts/stats_calls.py"
OBJECT_STATS = "tests/scripts/object_stats.py"
ZOMBIE_PEER = "tests/scripts/zombie_peer.py"

# tests/scripts on the path too, for `-m probe` and `-c "from probe import ..."`.
SCRIPTS_PATH = {"PYTHONPATH": os.pathsep.join([str(ROOT), str(SCRIPTS)])}
# The scripts count the pool calls they expect from the sizes they use, as
# if every collective went through the pool from CXLMPI_THRESHOLD up.
# (CXLMPI_ORDERING=0: these jobs count their Barriers as pool calls, which
# ordering sends to MPI; tests/test_progress.py covers ordering)
ALL_POOL = {"CXLMPI_TUNING": "pool", "CXLMPI_ORDERING": "0"}
# Jobs that must fail: a pool wait must not be what ends them.
NO_POOL_TIMEOUT = {"CXLMPI_TIMEOUT": "300"}
FAIL_TIMEOUT = 60  # s: kill a job still running after this
PROMPT = 30  # s: a failing job must have ended well before FAIL_TIMEOUT

ARGS = ["a1", "--flag", "two words", "-c"]  # program arguments, passed through


def tagged(stdout: str, tag: str) -> str:
    """The rest of the one line of `stdout` that starts with `tag`."""
    found = [line[len(tag) + 1:] for line in stdout.splitlines()
             if line.startswith(tag + " ")]
    assert len(found) == 1, f"expected one {tag} line in:\n{stdout}"
    return found[0]


def tagged_json(stdout: str, tag: str):
    return json.loads(tagged(stdout, tag))


def stats_tables(stderr: str) -> dict[int, dict[str, list[float]]]:
    """The tables printed at exit by CXLMPI_STATS=1, by rank:
    {rank: {collective: [pool, passthru, learning, zerocopy, pool MiB, seconds]}}."""
    tables: dict[int, dict[str, list[float]]] = {}
    current = None
    for line in stderr.splitlines():
        head = re.fullmatch(r"cxlmpi stats, rank (\d+):", line.strip())
        if head:
            rank = int(head.group(1))
            assert rank not in tables, f"two tables for rank {rank}:\n{stderr}"
            current = tables[rank] = {}
            continue
        fields = line.split()
        if current is not None and len(fields) == 7 \
                and re.fullmatch(r"[a-z_]+(\(obj\))?", fields[0]) \
                and fields[0] != "collective":
            current[fields[0]] = [float(f) for f in fields[1:]]
        elif current is not None and fields[:1] != ["collective"]:
            current = None
    return tables

"""The heartbeat thread never touches memory that is gone: a partition
table whose claims still beat when the table is dropped without `close`
(collected) and a pool segment unmapped while its line beats.  Before, the
beat thread's next beat faulted on the unmapped page (SIGSEGV, seen at the
end of test runs that drop such tables)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from harness import ROOT

DROPPED_TABLE = """
import gc, os, sys
from cxlmpi import _pool
from cxlmpi.memory import backends
with open(sys.argv[1], "wb") as f:
    f.truncate(64 << 20)
os.chmod(sys.argv[1], 0o600)
_pool.set_heartbeat(0.01, 30)
dev = backends._open(backends.parse_spec("file:" + sys.argv[1]), create=True)
dev.check_header(format_if_empty=True)
claims = [dev.claim(4 << 20, 2) for _ in range(3)]   # each beats from now on
del dev
gc.collect()                   # the table is unmapped here
start = _pool.heartbeat()[2]
while _pool.heartbeat()[2] < start + 5:    # five more beats
    pass
print("survived", flush=True)
"""


def test_a_dropped_partition_table_stops_beating(tmp_path: Path) -> None:
    """A Device dropped with live claims: the process outlives five more
    beats and exits cleanly (the beats on its table were removed when it
    was collected)."""
    proc = subprocess.run([sys.executable, "-c", DROPPED_TABLE, str(tmp_path / "pool")],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == "survived\n", (proc.returncode,
                                                                 proc.stderr[-2000:])

"""`import cxlmpi.auto`, cxlmpi.patch() and cxlmpi.unpatch() in one job
(tests/test_runner.py); rank 0 prints ``CHECKS <json>``: per rank, every
check by name (true: passed)."""

from __future__ import annotations

import importlib
import json
import sys

import numpy as np
from mpi4py import MPI

STOCK_WORLD = MPI.COMM_WORLD
STOCK_SELF = MPI.COMM_SELF
N = 1 << 17


def say(line: str) -> None:
    """Print `line` in one write: ranks' lines never interleave."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main() -> None:
    import cxlmpi

    checks: dict[str, bool] = {}
    rank = STOCK_WORLD.Get_rank()
    data = np.random.default_rng([3, rank]).integers(0, 1 << 20, N, dtype=np.int64)
    want = np.empty_like(data)
    STOCK_WORLD.Allreduce(data, want)

    def allreduce_ok() -> bool:
        got = np.empty_like(data)
        MPI.COMM_WORLD.Allreduce(data, got)
        return bool(np.array_equal(got, want))

    def pool_calls() -> int:
        return int(cxlmpi.stats()["allreduce"]["pool_calls"])

    checks["import_does_not_patch"] = (not cxlmpi.is_patched()
                                       and MPI.COMM_WORLD is STOCK_WORLD)

    importlib.import_module("cxlmpi.auto")
    from mpi4py.MPI import COMM_SELF, COMM_WORLD

    wrapped = MPI.COMM_WORLD
    checks["auto_patches"] = cxlmpi.is_patched()
    checks["world_wrapped"] = isinstance(MPI.COMM_WORLD, cxlmpi.CXLComm)
    checks["self_wrapped"] = isinstance(MPI.COMM_SELF, cxlmpi.CXLComm)
    checks["from_import_wrapped"] = COMM_WORLD is wrapped and COMM_SELF is MPI.COMM_SELF
    checks["same_handles"] = (wrapped.handle == STOCK_WORLD.handle
                              and MPI.COMM_SELF.handle == STOCK_SELF.handle
                              and wrapped == STOCK_WORLD)
    before = pool_calls()
    checks["patched_allreduce_equal"] = allreduce_ok()
    checks["patched_allreduce_in_pool"] = pool_calls() == before + 1

    cxlmpi.unpatch()
    checks["unpatch_restores"] = (not cxlmpi.is_patched()
                                  and MPI.COMM_WORLD is STOCK_WORLD
                                  and MPI.COMM_SELF is STOCK_SELF
                                  and type(MPI.COMM_WORLD) is MPI.Intracomm)
    before = pool_calls()
    checks["unpatched_allreduce_equal"] = allreduce_ok()
    checks["unpatched_allreduce_stock"] = pool_calls() == before

    cxlmpi.patch()
    cxlmpi.patch()
    checks["patch_again_same_object"] = cxlmpi.is_patched() and MPI.COMM_WORLD is wrapped
    before = pool_calls()
    checks["repatched_allreduce_equal"] = allreduce_ok()
    checks["repatched_allreduce_in_pool"] = pool_calls() == before + 1

    everyone = STOCK_WORLD.gather(checks, root=0)
    if rank == 0:
        say("CHECKS " + json.dumps(everyone))


if __name__ == "__main__":
    main()

"""`import cxlmpi.auto`, cxlmpi.patch() and cxlmpi.unpatch() in one job
(tests/test_runner.py); rank 0 prints ``CHECKS <json>``: per rank, every
check by name (true: passed).  The predefined communicators and their
copies (free, Free, pickle, copy, fromhandle, comparisons, Dup & co.) are
observed unpatched and patched in the same job and must look the same."""

from __future__ import annotations

import copy
import importlib
import json
import pickle
import sys
from typing import Any

import numpy as np
from mpi4py import MPI

STOCK_WORLD = MPI.COMM_WORLD
STOCK_SELF = MPI.COMM_SELF
N = 1 << 17


def say(line: str) -> None:
    """Print `line` in one write: ranks' lines never interleave."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _outcome(call, *args) -> Any:
    """What `call(*args)` returns, or the name of the exception it raises."""
    try:
        return call(*args)
    except Exception as exc:  # noqa: BLE001 - the exception is the outcome
        return f"raises {type(exc).__name__}"


def _seen(comm: MPI.Comm, source: MPI.Comm) -> tuple:
    """How a communicator made from `source` looks: truthiness, equality,
    identity, null-ness, handle, and whether the constants are intact."""
    return (bool(comm), comm == source, comm is source, comm is MPI.COMM_WORLD,
            comm == MPI.COMM_NULL, comm.handle == source.handle,
            comm.handle == MPI.COMM_NULL.handle, bool(MPI.COMM_WORLD),
            bool(MPI.COMM_SELF))


def _seen_made(make, comm: MPI.Comm, source: MPI.Comm) -> tuple:
    return _seen(make(comm), source)


def behaviours() -> dict[str, Any]:
    """Everything about the predefined communicators (whichever objects
    MPI.COMM_WORLD / COMM_SELF are now) and their copies that a program can
    observe; the same function runs unpatched (stock) and patched."""
    world, self_ = MPI.COMM_WORLD, MPI.COMM_SELF
    out: dict[str, Any] = {}
    for name, const in (("world", world), ("self", self_)):
        clone = type(const)(const)
        out[f"{name} copy"] = _seen(clone, const)
        out[f"{name} copy free()"] = (_outcome(clone.free), _seen(clone, const))
        clone = type(const)(const)
        out[f"{name} copy Free()"] = (_outcome(clone.Free), _seen(clone, const))
        plain = MPI.Intracomm(const)
        out[f"{name} plain copy free()"] = (_outcome(plain.free), _seen(plain, const))
        out[f"{name} free()"] = (_outcome(const.free), _seen(const, const))
        out[f"{name} Free()"] = (_outcome(const.Free), _seen(const, const))
        for how, make in (("pickle", lambda c: pickle.loads(pickle.dumps(c))),
                          ("copy", copy.copy), ("deepcopy", copy.deepcopy)):
            out[f"{name} {how}"] = _outcome(_seen_made, make, const, const)
            out[f"{name} {how} of a copy"] = _outcome(
                _seen_made, make, type(const)(const), const)
            out[f"{name} {how} of a plain copy"] = _outcome(
                _seen_made, make, MPI.Intracomm(const), const)
        out[f"{name} == plain"] = (const == MPI.Intracomm(const),
                                   MPI.Intracomm(const) == const,
                                   const != MPI.Intracomm(const))
        out[f"{name} Compare plain"] = MPI.Comm.Compare(const, MPI.Intracomm(const))
        out[f"{name} f2py"] = _seen(MPI.Comm.f2py(const.py2f()), const)
        out[f"{name} fromhandle"] = _seen(MPI.Comm.fromhandle(const.handle), const)
        out[f"{name} type(...).fromhandle"] = _seen(type(const).fromhandle(const.handle), const)
    for make in ("Dup", "Clone", "Split", "Create"):
        if make == "Create":
            group = world.Get_group()
            dup = world.Create(group)
            group.Free()
        else:
            dup = getattr(world, make)()
        out[f"{make} equal, Compare"] = (dup == world, MPI.Comm.Compare(dup, world))
        for how, fn in (("pickle", lambda c: pickle.loads(pickle.dumps(c))),
                        ("copy", copy.copy), ("deepcopy", copy.deepcopy)):
            out[f"{make} {how}"] = _outcome(_seen_made, fn, dup, dup)
        clone = type(dup)(dup)
        out[f"{make} copy"] = _seen(clone, dup)
        clone.free()  # frees the communicator (stock: a copy's free() frees it)
        out[f"{make} copy free()"] = (_seen(clone, dup), _outcome(dup.Free))
    return out


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

    # Every observable behaviour of the constants and their copies, stock
    # and then patched, in the same job.
    stock = behaviours()
    cxlmpi.patch()
    patched = behaviours()
    cxlmpi.unpatch()
    for name, seen in stock.items():
        ok = patched.get(name) == seen
        checks[f"like stock: {name}"] = ok
        if not ok:
            say(f"rank {rank}: {name}: stock {seen}, patched {patched.get(name)}")

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

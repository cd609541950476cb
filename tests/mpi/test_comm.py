"""The wrapped communicator behaves like the Intracomm it wraps."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
from common import CFG, PLAIN, RANK, SIZE, agree, expect_flush, make_data, pool_calls, pool_groups
from cxlmpi._pool import Pool
from mpi4py import MPI

import cxlmpi


def test_wrap_is_intracomm(comm):
    agree(isinstance(comm, MPI.Intracomm) and isinstance(comm, cxlmpi.CXLComm), "type")
    agree(comm.Get_size() == SIZE and comm.Get_rank() == RANK, "size/rank")
    agree(cxlmpi.wrap(comm) is comm, "wrapping twice is a no-op")
    world = cxlmpi.wrap(MPI.COMM_WORLD)
    agree(world == MPI.COMM_WORLD and world.handle == MPI.COMM_WORLD.handle, "same handle")
    agree(MPI.Comm.Compare(world, PLAIN) == MPI.IDENT, "IDENT")


def test_derived_communicators_are_wrapped(comm):
    group = comm.Get_group()
    made = {
        "Dup": comm.Dup(),
        "Clone": comm.Clone(),
        "Split": comm.Split(RANK % 2, RANK),
        "Split_type": comm.Split_type(MPI.COMM_TYPE_SHARED),
        "Create": comm.Create(group),
        "Create_group": comm.Create_group(group),
    }
    group.Free()
    try:
        for name, new in made.items():
            agree(isinstance(new, cxlmpi.CXLComm), f"{name} wrapped")
            data = make_data(np.float64, 2000, 20)
            want = np.zeros_like(data)
            plain = MPI.Intracomm(new)
            plain.Allreduce(data, want)
            got = np.zeros_like(data)
            new.Allreduce(data, got)
            agree(np.allclose(got, want), f"{name} Allreduce")
    finally:
        for new in made.values():
            new.Free()
    agree(all(new == MPI.COMM_NULL for new in made.values()), "Free nulls them")


def test_split_undefined_gives_null(comm):
    new = comm.Split(MPI.UNDEFINED if RANK == 0 else 1, RANK)
    agree((new == MPI.COMM_NULL) == (RANK == 0), "UNDEFINED color")
    if new != MPI.COMM_NULL:
        new.Free()


def test_free_releases_pool(comm):
    from cxlmpi._shim import states

    dup = comm.Dup()
    data = make_data(np.float64, 5000, 21)
    out = np.zeros_like(data)
    dup.Allreduce(data, out)
    handle = dup.handle
    had_state = handle in states
    dup.Free()
    agree(handle not in states and (had_state or SIZE == 1), "state released on Free")


def _checked(new, seed: int) -> None:
    """Allreduce, Bcast and Allgather on `new` against stock on the same
    data (integers: the sums are exact in any order)."""
    plain = MPI.Intracomm(new)
    data = make_data(np.int64, 40000, seed)
    want, got = np.zeros_like(data), np.zeros_like(data)
    plain.Allreduce(data, want)
    new.Allreduce(data, got)
    agree(np.array_equal(got, want), "Allreduce on a new communicator")
    want = data.copy() if RANK == 0 else np.zeros_like(data)
    got = want.copy()
    plain.Bcast(want)
    new.Bcast(got)
    agree(np.array_equal(got, want), "Bcast on a new communicator")
    want, got = np.zeros(data.size * SIZE, np.int64), np.zeros(data.size * SIZE, np.int64)
    plain.Allgather(data, want)
    new.Allgather(data, got)
    agree(np.array_equal(got, want), "Allgather on a new communicator")


def test_a_freed_communicators_pool_passes_to_the_next(comm):
    """A communicator duplicated and freed per solve: the next one of the
    same ranks takes a freed one's pool over (no new pool set up), whatever
    order the ranks freed them in, never one that a rank still uses; every
    result matches stock MPI on the same data."""
    from cxlmpi._shim import states

    from cxlmpi.pools import state as states_module

    def identity(c):
        state = states.get(c.handle)
        return state.pool.identity if state is not None and isinstance(state.pool, Pool) \
            else None

    def spare_ids():
        return {s.pool.identity for s in getattr(states_module, "_spares", [])}

    a, b = comm.Dup(), comm.Dup()
    _checked(a, 31)
    _checked(b, 32)
    flat = identity(a) is not None   # (pools of several groups are not passed on)
    agree(flat == (SIZE > 1 and pool_groups() == (1, SIZE)), "a flat pool")
    first, second = (a, b) if RANK % 2 == 0 else (b, a)
    first.Free()
    second.Free()
    kept = spare_ids()
    # the settings read again, alike: a kept pool still serves (it is kept
    # for the settings' values, not for one Config object)
    states_module.config.reload()
    c = comm.Dup()
    _checked(c, 33)
    agree(not flat or identity(c) in kept, "the next Dup took over a freed pool")
    # rank 0 frees d while the others still use it: e must get another pool
    d = comm.Dup()
    _checked(d, 34)
    used = identity(d)
    if RANK == 0:
        d.Free()
    e = comm.Dup()
    _checked(e, 35)
    agree(not flat or identity(e) != used, "a pool still in use is not taken over")
    if RANK != 0:
        d.Free()
    c.Free()
    e.Free()


def test_free_by_plain_object_releases_pool(comm):
    """Freed through an unwrapped object: the MPI attribute cleans up."""
    from cxlmpi._shim import states

    dup = comm.Dup()
    data = make_data(np.float64, 5000, 22)
    dup.Allreduce(data, np.zeros_like(data))
    handle = dup.handle
    MPI.Intracomm(dup).Free()
    agree(handle not in states, "state released")


def test_constants_behave_like_stock():
    cxlmpi.patch()
    try:
        world, self_ = MPI.COMM_WORLD, MPI.COMM_SELF
        agree(isinstance(world, cxlmpi.CXLComm) and cxlmpi.is_patched(), "patched")
        agree(world == PLAIN and self_.Get_size() == 1, "compare equal")
        agree(pickle.loads(pickle.dumps(world)) is world, "pickle world")
        agree(pickle.loads(pickle.dumps(self_)) is self_, "pickle self")
        world.free()  # a no-op on the predefined world, as in stock
        agree(world.handle == PLAIN.handle, "free() keeps the world")
        try:
            world.Free()
            raised = False
        except MPI.Exception:
            raised = True
        agree(raised and world == PLAIN, "Free() on the world raises as stock")
        again = cxlmpi.CXLComm.fromhandle(world.handle)
        agree(isinstance(again, cxlmpi.CXLComm) and again == world, "fromhandle")
        from mpi4py.MPI import COMM_WORLD as imported
        agree(imported is world, "from-import sees the wrapped world")
    finally:
        cxlmpi.unpatch()
    agree(not cxlmpi.is_patched() and type(MPI.COMM_WORLD) is MPI.Intracomm, "unpatched")


def test_intercomm_unwrapped():
    if SIZE < 2:
        return
    half = PLAIN.Split(RANK % 2, RANK)
    inter = half.Create_intercomm(0, PLAIN, 1 - RANK % 2 if SIZE > 1 else 0)
    try:
        agree(cxlmpi.wrap(inter) is inter, "intercomm passes through wrap")
    finally:
        inter.Free()
        half.Free()


def test_stats_and_flush_counter(comm):
    s = cxlmpi.stats()
    for name in ("allreduce", "bcast", "reduce"):
        row = s.get(name, {})
        agree(set(row) >= {"pool_calls", "passthrough_calls", "nbytes", "seconds"}, name)
    if expect_flush() and SIZE > 1:
        agree(s["coherence"]["flushed_lines"] > 0, "sw coherence flushed lines")
    if CFG.coherence == "emulate" and pool_groups()[1] > 1:
        emulated = s["coherence"].get("emulated", {})
        agree(emulated.get("writebacks", 0) > 0 and emulated.get("invalidates", 0) > 0,
              f"the emulator wrote lines back and reloaded them: {emulated}")


def test_flush_counter_counts_software_coherence_only():
    """stats()["coherence"]["flushed_lines"] counts the lines software
    coherence flushes: in hw mode nothing -- not a pool's set-up, its
    calls, its detach, nor a partition table -- and in sw mode more with
    every pool collective."""
    from cxlmpi._pool import flushed_lines

    calls = 3
    n = max(CFG.threshold, 1 << 12) // 8
    send, recv = np.arange(n, dtype=np.float64), np.empty(n)
    before, pooled = flushed_lines(), pool_calls("allreduce")
    comm = cxlmpi.wrap(PLAIN.Dup())  # a fresh pool: its set-up counts too
    after = []
    try:
        for _ in range(calls):
            comm.Allreduce(send, recv)
            after.append(flushed_lines())
    finally:
        comm.Free()
    freed = flushed_lines()
    went_to_pool = pool_calls("allreduce") - pooled == calls
    if pool_groups()[0] == 1 and not CFG.adaptive:  # one pool of every rank: all went there
        agree(went_to_pool == (SIZE > 1 and not CFG.disable), "allreduce through the pool")
    grew = [b - a for a, b in zip([before, *after], after)]
    if CFG.coherence in ("hw", "auto"):   # auto: hw, the suite's ranks share a host
        ok = freed == before
    else:
        ok = not went_to_pool or all(d > 0 for d in grew)
    agree(ok, f"{CFG.coherence} mode: lines counted per call {grew}, "
              f"{freed - before} in all")


def test_timeout_names_missing_ranks(comm):
    """A rank that never arrives: the others raise CXLMPITimeoutError naming
    the collective and that rank, instead of hanging."""
    from cxlmpi._shim import states

    if SIZE < 2:
        return
    dup = comm.Dup()
    data = make_data(np.float64, 4096, 40)
    dup.Allreduce(MPI.IN_PLACE, data)  # sets the pool up
    pool = states[dup.handle].pool
    if not isinstance(pool, Pool):
        # Pool groups: the phase among group leaders is MPI's, and MPI
        # collectives have no timeout (docs: Pools that span hosts).
        dup.Free()
        pytest.skip("the inter-pool phase is MPI's (no timeout)")
    pool.timeout_s = 0.5
    routes = states[dup.handle].routes
    if routes is not None:
        # adaptive selection: this class's next calls take the pool (alike
        # on every rank), not the MPI run a class of its size opens with
        from cxlmpi import select

        which = cxlmpi.config.COLLECTIVES.index("allreduce")
        routes.set(which, select.size_class(data.nbytes), 0, 1 + select.FLAT, 1 << 62)
    err = None
    if RANK != SIZE - 1:
        try:
            dup.Allreduce(MPI.IN_PLACE, data)
        except cxlmpi.CXLMPITimeoutError as exc:
            err = exc
    ok = RANK == SIZE - 1 or (err is not None and f"[{SIZE - 1}]" in str(err)
                              and "Allreduce" in str(err))
    agree(ok, f"timeout error: {err}")
    if RANK != SIZE - 1:  # the communicator's pool stays unusable, clearly
        try:
            dup.Allreduce(MPI.IN_PLACE, data)
            again = None
        except cxlmpi.CXLMPITimeoutError as exc:
            again = exc
        agree(again is err, "later pool calls re-raise")
    else:
        agree(True)  # the partner of the check above: agree() is collective
    dup.Free()


def test_pool_lives_where_configured(comm):
    """numa:N: the pool's pages are bound to node N (numa_maps shows the
    shared policy in every rank); file:/dax: the pool is a claimed
    partition of the table."""
    from cxlmpi._shim import states

    from cxlmpi.memory import backends

    data = make_data(np.float64, 4096, 41)
    comm.Allreduce(MPI.IN_PLACE, data)  # the pool exists after a pool call
    pool = states[comm.handle].pool
    pool = getattr(pool, "pool", pool)  # a Hierarchy's own pool group
    spec = backends.parse_spec(CFG.pool)
    ok = True
    if isinstance(pool, Pool) and spec.kind == "numa":
        # (the segment's file: unnamed, /dev/shm/#INODE)
        path = f"file=/dev/shm/#{os.fstat(pool.fd).st_ino}\\040"
        with open("/proc/self/numa_maps") as f:
            lines = [line for line in f if path in line]
        ok = bool(lines) and all(f" bind:{spec.node} " in line for line in lines)
    elif isinstance(pool, Pool) and spec.shared_file:
        claimed = [e for e in backends.open_device(spec).entries() if e["state"] == "claimed"]
        ok = any(e["nranks"] == pool.size and e["nbytes"] >= pool.total_nbytes
                 for e in claimed)
    agree(ok, f"pool of {spec} not where configured")

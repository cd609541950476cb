"""Object (pickle) collectives -- bcast, gather, scatter, allgather, alltoall,
reduce, allreduce -- against stock mpi4py on the same data: small objects
(passed through), large ones (through the pool: dicts of numpy arrays of
several dtypes and layouts, nested lists, bytes, text), every root, per-rank
different sizes, reductions with predefined ops and a lambda, unpicklable
objects."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest
from common import CFG, PLAIN, RANK, SIZE, agree
from common import pool_expected as _pool_expected
from mpi4py import MPI

from cxlmpi.communicator import objects


def pool_expected() -> bool:
    """Large objects go through the pool (CXLMPI_OBJECTS=1 switches it on)."""
    return _pool_expected("objects") and CFG.objects

# Size classes of the test objects.  "tiny" pickles below the test pool's
# threshold (64 bytes); "medium" is a few KiB (above both the test and the
# default threshold, arrays in-band); "large" holds an array above mpi4py's
# out-of-band threshold (256 KiB) and spans several chunks.
CLASSES = ["tiny", "medium", "large", "none"]


def make_obj(kind: str, seed: int, rank: int = RANK):
    """A rank-dependent object of size class `kind`."""
    rng = np.random.default_rng([seed, rank, CLASSES.index(kind)])
    if kind == "none":
        return None
    if kind == "tiny":
        return (rank, f"r{rank}")
    n = 300 if kind == "medium" else 40_000
    ro = rng.integers(0, 1 << 40, n // 4, dtype=np.int64)
    ro.flags.writeable = False
    return {
        "f64": rng.standard_normal(n),
        "i32": rng.integers(-1000, 1000, n // 2).astype(np.int32),
        "u8": rng.integers(0, 255, 3 * n + 1).astype(np.uint8),
        "c64": (rng.standard_normal(n // 8) + 1j * rng.standard_normal(n // 8)).astype(
            np.complex64),
        "bool": rng.integers(0, 2, n // 3).astype(np.bool_),
        "fortran": np.asfortranarray(rng.standard_normal((7, n // 7)).astype(np.float32)),
        "strided": rng.standard_normal(n // 2)[::3],
        "readonly": ro,
        "empty": np.zeros((0, 3), np.int16),
        "scalar": np.float64(rank + 0.5),
        "nested": [[rank, "x" * (n // 50)], (1.5, None, b"\x00\xff" * (n // 20)),
                   {"deep": [list(range(n // 100)), {"k": rank}]}],
        "bytes": bytes(rng.integers(0, 256, n // 2, dtype=np.uint8)),
        "bytearray": bytearray(rng.integers(0, 256, n // 4, dtype=np.uint8)),
        "text": "π≈3.14159 " * (n // 40) + str(rank),
        "nan": float("nan"),
    }


def same(a, b, rtol: float = 0.0) -> bool:
    """Deep equality of test objects: types, array dtypes/shapes/layouts/
    writability and values (NaN equal to NaN; floats within `rtol`)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        if (a.dtype != b.dtype or a.shape != b.shape
                or a.flags.writeable != b.flags.writeable
                or a.flags.f_contiguous != b.flags.f_contiguous
                or a.flags.c_contiguous != b.flags.c_contiguous):
            return False
        if rtol and np.issubdtype(a.dtype, np.inexact):
            return bool(np.allclose(a, b, rtol=rtol, atol=rtol, equal_nan=True))
        return bool(np.array_equal(a, b, equal_nan=np.issubdtype(a.dtype, np.inexact)))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k], rtol) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y, rtol) for x, y in zip(a, b))
    if isinstance(a, (float, np.floating)):
        return (math.isnan(a) and math.isnan(b)) or (a == b if not rtol
                                                     else math.isclose(a, b, rel_tol=rtol))
    return a == b


def counts() -> dict[str, int]:
    return dict(objects.POOL_CALLS)


def took_pool(before: dict[str, int], name: str, expected: bool) -> bool:
    """The pool counter of `name` moved exactly when the pool was expected."""
    return (objects.POOL_CALLS[name] > before[name]) == (expected and pool_expected())


def test_bcast(comm):
    bad = []
    for kind in CLASSES:
        for root in range(SIZE):
            obj = make_obj(kind, 1, rank=root)
            want = PLAIN.bcast(obj if RANK == root else None, root)
            before = counts()
            got = comm.bcast(obj if RANK == root else None, root=root)
            if not same(got, want):
                bad.append(f"bcast {kind} root={root}")
            if not took_pool(before, "bcast", kind in ("medium", "large")):
                bad.append(f"bcast {kind} root={root}: pool use")
            if kind == "large" and RANK == root and np.shares_memory(got["f64"], obj["f64"]):
                bad.append("bcast: the root got its own array back, not a copy")
    agree(not bad, "; ".join(bad))


@pytest.mark.parametrize("mix", ["uniform", "mixed"])
def test_gather_and_allgather(comm, mix):
    bad = []
    for kind in CLASSES:
        mine = CLASSES[(RANK + CLASSES.index(kind)) % 4] if mix == "mixed" else kind
        obj = make_obj(mine, 2)
        want = PLAIN.allgather(obj)
        got = comm.allgather(obj)
        if not same(got, want):
            bad.append(f"allgather {mix} {kind}")
        for root in range(SIZE):
            want = PLAIN.gather(obj, root)
            got = comm.gather(obj, root=root)
            if not same(got, want):
                bad.append(f"gather {mix} {kind} root={root}")
    agree(not bad, "; ".join(bad))


def test_scatter(comm):
    bad = []
    for shift in range(4):
        for root in range(SIZE):
            items = [make_obj(CLASSES[(d + shift) % 4], 3, rank=d) for d in range(SIZE)]
            send = items if RANK == root else None
            want = PLAIN.scatter(send, root)
            got = comm.scatter(send, root=root)
            if not same(got, want):
                bad.append(f"scatter shift={shift} root={root}")
            # any iterable is taken, as in stock (an iterator is read once)
            got = comm.scatter(tuple(items) if RANK == root else None, root)
            if not same(got, want):
                bad.append(f"scatter tuple shift={shift} root={root}")
            got = comm.scatter(iter(items) if RANK == root else None, root)
            if not same(got, want):
                bad.append(f"scatter iterator shift={shift} root={root}")
    for root in range(SIZE):  # None on the root: p Nones
        got = comm.scatter(None, root)
        if got is not None:
            bad.append(f"scatter None root={root}")
    agree(not bad, "; ".join(bad))


def test_alltoall(comm):
    bad = []
    for shift in range(4):
        send = [make_obj(CLASSES[(RANK + d + shift) % 4], 4) for d in range(SIZE)]
        want = PLAIN.alltoall(send)
        before = counts()
        got = comm.alltoall(send)
        if not same(got, want):
            bad.append(f"alltoall shift={shift}")
        large = any(CLASSES[(q + d + shift) % 4] in ("medium", "large")
                    for q in range(SIZE) for d in range(SIZE))
        if not took_pool(before, "alltoall", large):
            bad.append(f"alltoall shift={shift}: pool use")
        if not same(comm.alltoall(x for x in send), want):
            bad.append(f"alltoall generator shift={shift}")
    if not same(comm.alltoall(None), PLAIN.alltoall(None)):
        bad.append("alltoall None")
    small = [(RANK, d) for d in range(SIZE)]  # passed through: read once all the same
    if not same(comm.alltoall(iter(small)), PLAIN.alltoall(small)):
        bad.append("alltoall small iterator")
    for root in range(SIZE):
        got = comm.scatter(iter(small) if RANK == root else None, root)
        if not same(got, PLAIN.scatter(small if RANK == root else None, root)):
            bad.append(f"scatter small iterator root={root}")
    agree(not bad, "; ".join(bad))


def _big_ints(rank: int) -> np.ndarray:
    rng = np.random.default_rng([5, rank])
    return rng.integers(-(1 << 40), 1 << 40, 30_000)


def test_reduce_and_allreduce(comm):
    bad = []
    rng = np.random.default_rng([6, RANK])
    floats = rng.standard_normal(30_000)
    cases = [
        ("SUM float64 array", floats, MPI.SUM, 1e-12),
        ("SUM int64 array", _big_ints(RANK), MPI.SUM, 0),
        ("SUM int", RANK + 1, MPI.SUM, 0),
        ("SUM lists (concatenation, rank order)", [RANK] * 3000, MPI.SUM, 0),
        ("MAX tuples", ((RANK * 7) % SIZE, RANK, "t" * 5000), MPI.MAX, 0),
        ("MIN tuples", ((RANK * 7) % SIZE, RANK, "t" * 5000), MPI.MIN, 0),
        ("PROD small", 2.0 + RANK, MPI.PROD, 1e-15),
        ("lambda on dicts", {"a": _big_ints(RANK), "n": RANK},
         lambda x, y: {k: x[k] + y[k] for k in x}, 0),
    ]
    for what, obj, op, rtol in cases:
        for root in range(SIZE):
            want = PLAIN.reduce(obj, op=op, root=root)
            got = comm.reduce(obj, op=op, root=root)
            if not same(got, want, rtol):
                bad.append(f"reduce {what} root={root}")
        want = PLAIN.allreduce(obj, op)
        got = comm.allreduce(obj, op=op)
        if not same(got, want, rtol):
            bad.append(f"allreduce {what}")
        # every rank holds the same result
        digests = PLAIN.allgather(MPI.pickle.dumps(got))
        if any(d != digests[0] for d in digests):
            bad.append(f"allreduce {what}: ranks differ")
    # the default op is SUM
    if not same(comm.allreduce(floats), PLAIN.allreduce(floats), 1e-12):
        bad.append("allreduce default op")
    agree(not bad, "; ".join(bad))


def test_reduce_does_not_touch_the_input(comm):
    """A folding op that updates its left operand in place works on copies
    (as in stock, the root's own contribution is unpickled, not used as is)."""
    def iadd(x, y):
        x += y
        return x

    data = np.arange(40_000, dtype=np.int64) + RANK
    keep = data.copy()
    got = comm.reduce(data, op=iadd, root=0)
    want = PLAIN.reduce(keep, op=MPI.SUM, root=0)
    ok = np.array_equal(data, keep) and (RANK != 0 or np.array_equal(got, want))
    got = comm.allreduce(data, op=iadd)
    ok = ok and np.array_equal(data, keep) and np.array_equal(got, PLAIN.allreduce(keep))
    agree(ok, "in-place op")


def _unpicklable(kind: str):
    if kind == "lambda":
        return {"a": np.zeros(50_000), "f": lambda: 0}
    if kind == "lock":
        return [np.ones(50_000), threading.Lock()]
    return (i for i in range(3))


def _raised(fn, *args):
    try:
        fn(*args)
    except Exception as exc:  # noqa: BLE001 -- the type is what we compare
        return type(exc), str(exc)
    return None


@pytest.mark.parametrize("kind", ["lambda", "lock", "generator"])
def test_unpicklable_raises_like_stock(comm, kind):
    """Every rank sends an unpicklable object: every rank raises stock's
    exception type before any pool step, and the pool stays usable."""
    bad = []
    obj = _unpicklable(kind)
    for name, call in [
        ("allgather", lambda c: c.allgather(obj)),
        ("gather", lambda c: c.gather(obj, root=SIZE - 1)),
        ("alltoall", lambda c: c.alltoall([obj] * SIZE)),
        ("reduce", lambda c: c.reduce(obj, op=MPI.SUM, root=0)),
        ("allreduce", lambda c: c.allreduce(obj)),
    ]:
        want = _raised(call, PLAIN)
        got = _raised(call, comm)
        if want is None or got is None or got[0] is not want[0]:
            bad.append(f"{name}: stock raised {want}, wrapped {got}")
    # wrong number of items (all ranks)
    want = _raised(PLAIN.alltoall, [1] * (SIZE + 1))
    got = _raised(comm.alltoall, [1] * (SIZE + 1))
    if got != want:
        bad.append(f"alltoall length: stock {want}, wrapped {got}")
    # still in step afterwards
    big = make_obj("large", 7)
    if not same(comm.allgather(big), PLAIN.allgather(big)):
        bad.append("allgather after the errors")
    agree(not bad, "; ".join(bad))


def test_invalid_root_passes_through(comm):
    bad = []
    for name, call in [
        ("bcast", lambda c: c.bcast(make_obj("large", 8), root=SIZE)),
        ("reduce", lambda c: c.reduce(make_obj("large", 8)["f64"], root=-1)),
    ]:
        want = _raised(call, PLAIN)
        got = _raised(call, comm)
        if want is None or got is None or got[0] is not want[0]:
            bad.append(f"{name}: stock raised {want}, wrapped {got}")
    agree(not bad, "; ".join(bad))


def test_many_out_of_band_buffers(comm):
    """With a low out-of-band threshold every array travels as its own raw
    buffer in the frame: alignment and the length table at work."""
    keep = MPI.pickle.THRESHOLD
    MPI.pickle.THRESHOLD = 256
    try:
        obj = make_obj("medium", 9)
        got = comm.allgather(obj)
        want = PLAIN.allgather(obj)
        ok = same(got, want)
        for item in got:
            ok = ok and all(a.flags.aligned for a in item.values() if isinstance(a, np.ndarray))
        items = [make_obj("medium", 10, rank=d) for d in range(SIZE)]
        ok = ok and same(comm.alltoall(items), PLAIN.alltoall(items))
        got = comm.bcast(obj if RANK == 0 else None, 0)
        ok = ok and same(got, PLAIN.bcast(obj if RANK == 0 else None, 0))
        # received arrays are writable where the sender's were
        ok = ok and got["f64"].flags.writeable and not got["readonly"].flags.writeable
    finally:
        MPI.pickle.THRESHOLD = keep
    agree(ok, "many out-of-band buffers")


def test_pool_path_taken(comm):
    """Large payloads went through the pool (when this job has one); small
    ones passed through."""
    big = make_obj("large", 11)
    before = counts()
    comm.bcast(big, 0)
    comm.gather(big, 0)
    comm.allgather(big)
    comm.scatter([big] * SIZE if RANK == 0 else None, 0)
    comm.alltoall([big] * SIZE)
    comm.reduce(big["f64"], MPI.SUM, 0)
    comm.allreduce(big["f64"], MPI.SUM)
    expected = pool_expected()
    moved = [name for name in objects.POOL_CALLS if objects.POOL_CALLS[name] > before[name]]
    ok = moved == (list(objects.POOL_CALLS) if expected else [])
    before = counts()
    comm.bcast(1, 0)
    comm.gather("x", 0)
    comm.allgather(None)
    comm.scatter(list(range(SIZE)) if RANK == 0 else None, 0)
    comm.alltoall([None] * SIZE)
    comm.reduce(RANK, MPI.SUM, 0)
    comm.allreduce(RANK)
    ok = ok and counts() == before
    agree(ok, f"pool use: moved {moved}, expected {expected} (threshold {CFG.threshold})")

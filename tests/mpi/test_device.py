"""Some ranks pass device arrays (GPU buffers, as mpi4py reads them: through
__cuda_array_interface__ or DLPack, without the buffer protocol), the others
plain NumPy arrays -- as a job whose hosts differ may.  Stock MPI's result
is the reference.

Here the device arrays are views of host memory that offer only those
interfaces: mpi4py hands their pointer to MPI as it would a GPU's (a
CUDA-aware library copies device memory; these need no GPU).  The pool
cannot read device memory: a __cuda_array_interface__ message is staged
(MPI copies it to and from a host buffer on a self communicator), so that
the rank decides as its peers do; a DLPack array that says it lives in host
memory (a PyTorch CPU tensor, say) is read in place.

Each collective runs on a communicator of its own, so its first call is the
one that sets the pool up -- a collective step every rank must take alike
(before, a rank with a device array went to MPI alone and the others waited
in the set-up for ever).  Further calls follow it: across pool groups a
settled call has no header step in which a rank could tell the others that
it went to MPI (the other groups' leaders waited in the leaders' MPI step).
The device ranks are SIZE // 2 and SIZE - 1 (a group leader at
CXLMPI_POOL_GROUPS=2, 4 ranks)."""

from __future__ import annotations

import ctypes
import sys

import numpy as np
import pytest
from common import CFG, RANK, SIZE, agree, fresh_against_stock, make_data
from mpi4py import MPI

DEVICE = RANK in {SIZE - 1, SIZE // 2}
CALLS = 4
# doubles per rank: above the pool's window, several chunks
N = max(2 * CFG.threshold, 3 * CFG.chunk_size + 24) // 8
ROOTS = sorted({0, SIZE - 1})
INTERFACES = ["cuda", "dlpack"]


class Cuda:
    """A host array seen only through __cuda_array_interface__."""

    def __init__(self, arr: np.ndarray) -> None:
        self.arr = arr

    @property
    def __cuda_array_interface__(self) -> dict:
        a = self.arr
        return {"shape": a.shape, "typestr": a.dtype.str, "strides": None,
                "data": (a.ctypes.data, not a.flags.writeable), "version": 3}


class DLPack:
    """A host array seen only through DLPack."""

    def __init__(self, arr: np.ndarray) -> None:
        self.arr = arr

    def __dlpack__(self, *args, **kwargs):
        return self.arr.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self.arr.__dlpack_device__()


def dev(arr: np.ndarray, interface: str) -> object:
    """`arr` as this rank passes it: a device array on the device ranks."""
    if not DEVICE:
        return arr
    return Cuda(arr) if interface == "cuda" else DLPack(arr)


def run(name: str, call, pool_name: str | None = None) -> None:
    """`call(comm, seed)` -> result on fresh communicators, against the
    plain one (see fresh_against_stock): equal bits."""
    def differs(got, want):
        return "" if got.shape == want.shape and np.array_equal(got, want) else "differs"
    fresh_against_stock(f"{name} with device arrays on ranks {sorted({SIZE - 1, SIZE // 2})}",
                        call, differs, CALLS, pool_name or name.lower())


@pytest.fixture(params=INTERFACES)
def interface(request) -> str:
    return request.param


# -------------------------------------------------------------- moves

@pytest.mark.parametrize("root", ROOTS)
def test_bcast(interface: str, root: int) -> None:
    def call(c, seed):
        b = make_data(np.float64, N, seed) if RANK == root else np.zeros(N)
        c.Bcast(dev(b, interface), root)
        return b
    run("Bcast", call)


def test_allgather(interface: str) -> None:
    def call(c, seed):
        r = np.zeros(N * SIZE)
        c.Allgather(dev(make_data(np.float64, N, seed), interface), dev(r, interface))
        return r
    run("Allgather", call)


def test_allgatherv(interface: str) -> None:
    counts = [N + 3 * q for q in range(SIZE)]

    def call(c, seed):
        r = np.zeros(sum(counts) + SIZE)
        displs = [sum(counts[:i]) + i for i in range(SIZE)]
        c.Allgatherv(dev(make_data(np.float64, counts[RANK], seed), interface),
                     [dev(r, interface), counts, displs, MPI.DOUBLE])
        return r
    run("Allgatherv", call)


@pytest.mark.parametrize("root", ROOTS)
def test_gather(interface: str, root: int) -> None:
    def call(c, seed):
        r = np.zeros(N * SIZE)
        c.Gather(dev(make_data(np.float64, N, seed), interface), dev(r, interface), root)
        return r
    run("Gather", call)


@pytest.mark.parametrize("root", ROOTS)
def test_scatter(interface: str, root: int) -> None:
    def call(c, seed):
        r = np.zeros(N)
        c.Scatter(dev(make_data(np.float64, N * SIZE, seed), interface),
                  dev(r, interface), root)
        return r
    run("Scatter", call)


def test_alltoall(interface: str) -> None:
    def call(c, seed):
        r = np.zeros(N * SIZE)
        c.Alltoall(dev(make_data(np.float64, N * SIZE, seed), interface), dev(r, interface))
        return r
    run("Alltoall", call)


# --------------------------------------------------------- reductions

@pytest.mark.parametrize("how", ["Allreduce", "Allreduce in place", "Reduce", "Scan",
                                 "Exscan"])
def test_reductions(interface: str, how: str) -> None:
    """Integers: every order of the sums gives the same bits.  Exscan's
    rank 0 keeps what its receive buffer held."""
    root = SIZE - 1

    def call(c, seed):
        s = make_data(np.int64, N, seed)
        r = np.full(N, -5, np.int64)
        if how == "Allreduce":
            c.Allreduce(dev(s, interface), dev(r, interface))
        elif how == "Allreduce in place":
            r[:] = s
            c.Allreduce(MPI.IN_PLACE, dev(r, interface))
        elif how == "Reduce":
            c.Reduce(dev(s, interface), dev(r, interface), op=MPI.MAX, root=root)
        elif how == "Scan":
            c.Scan(dev(s, interface), dev(r, interface))
        else:
            c.Exscan(dev(s, interface), dev(r, interface))
        return r
    run(how, call, how.split()[0].lower())


@pytest.mark.parametrize("vector", [False, True])
def test_reduce_scatter(interface: str, vector: bool) -> None:
    counts = [N + 5 * q for q in range(SIZE)]

    def call(c, seed):
        if vector:
            s = make_data(np.int64, sum(counts), seed)
            r = np.zeros(counts[RANK], np.int64)
            c.Reduce_scatter(dev(s, interface), dev(r, interface), counts)
        else:
            s = make_data(np.int64, N * SIZE, seed)
            r = np.zeros(N, np.int64)
            c.Reduce_scatter_block(dev(s, interface), dev(r, interface))
        return r
    run("Reduce_scatter" if vector else "Reduce_scatter_block", call)


@pytest.mark.parametrize("kind", ["read-only send", "uint8", "typecode"])
def test_element_types_read_as_numpy_arrays_are(interface: str, kind: str) -> None:
    """A bare device array's element type is read as the NumPy array's on
    the other ranks: uint8 (before, MPI_UNSIGNED_CHAR against what the
    NumPy ranks read then, MPI_BYTE: a mismatch error), a read-only array (NumPy exports
    one only through versioned DLPack: before, no type was read and the
    rank went to MPI alone -- a hang), a typecode string as mpi4py reads
    it."""
    def call(c, seed):
        if kind == "uint8":
            s = make_data(np.uint8, N, seed)
            r = np.zeros(N, np.uint8)
            c.Allreduce(dev(s, interface), dev(r, interface), op=MPI.BXOR)
            return r
        s = make_data(np.int64, N, seed)   # (integers: any order sums alike)
        r = np.zeros(N, np.int64)
        if kind == "typecode":
            c.Allreduce([dev(s, interface), "q"], [dev(r, interface), "q"])
        else:
            s.flags.writeable = False
            c.Allreduce(dev(s, interface), r)
        return r
    run(f"Allreduce ({kind})", call, "allreduce")


# A DLPack producer as mpi4py's own test suite writes one: its capsule's
# destructor is Python (ctypes), and a complex number is two float lanes.
# The destructor reads the dying capsule by its address (a reference to it
# would revive it); each ctypes call there fails where an error is set.
_API = ctypes.PyDLL(None)
for _name, _res, _args in [
        ("PyCapsule_New", ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]),
        ("PyCapsule_GetPointer", ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p]),
        ("PyCapsule_IsValid", ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p]),
        ("PyCapsule_SetName", ctypes.c_int, [ctypes.py_object, ctypes.c_char_p])]:
    getattr(_API, _name).restype, getattr(_API, _name).argtypes = _res, _args
_HELD: dict[int, tuple[object, object]] = {}   # pointer -> (NumPy's capsule, its array)


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def _destructor(capsule: int) -> None:
    used = not _API.PyCapsule_IsValid(capsule, b"dltensor")
    pointer = _API.PyCapsule_GetPointer(capsule, b"used_dltensor" if used else b"dltensor")
    inner, _ = _HELD.pop(pointer)
    if used:   # (its consumer frees the tensor)
        _API.PyCapsule_SetName(inner, b"used_dltensor")


class TwoLanes:
    """A host complex128 array through DLPack, its type as two float64
    lanes, in a capsule whose destructor is Python."""

    def __init__(self, arr: np.ndarray) -> None:
        self.arr = arr

    def __dlpack__(self, stream=None):   # (DLPack 0.x: max_version is a TypeError)
        inner = self.arr.__dlpack__()
        pointer = _API.PyCapsule_GetPointer(id(inner), b"dltensor")   # (inner: alive)
        ctypes.memmove(pointer + 20, bytes([2, 64, 2, 0]), 4)  # dtype: float, 64 bits, 2 lanes
        _HELD[pointer] = (inner, self.arr)
        return _API.PyCapsule_New(pointer, b"dltensor", ctypes.cast(_destructor, ctypes.c_void_p))

    def __dlpack_device__(self):
        return self.arr.__dlpack_device__()


def test_a_producer_with_a_python_capsule_destructor_sees_no_error() -> None:
    """Complex numbers as two float lanes in capsules freed by Python, as
    mpi4py's test suite makes them: stock's results, and no error in any
    capsule's destructor.  Before, reading the element type asked NumPy
    first, which frees a capsule it cannot read with its error still set:
    the destructor's first ctypes call failed, printed as an ignored
    exception (hundreds in mpi4py's suite, none under stock)."""
    seen: list[str] = []
    hook, sys.unraisablehook = sys.unraisablehook, lambda u: seen.append(repr(u.exc_value))
    try:
        def call(c, seed):
            s = (make_data(np.float64, 2 * N, seed)).view(np.complex128)
            r = np.zeros(N, np.complex128)
            c.Allgather(TwoLanes(s[: N // SIZE]) if DEVICE else s[: N // SIZE],
                        TwoLanes(r[: N // SIZE * SIZE]) if DEVICE else r[: N // SIZE * SIZE])
            return r
        run("Allgather (two float lanes)", call, "allgather")
    finally:
        sys.unraisablehook = hook
    agree(not seen, f"errors in capsule destructors: {seen[:2]}")

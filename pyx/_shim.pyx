# cython: language_level=3
"""The compiled hot path of the wrapped communicator: message parsing, the
pool-or-pass-through decision, and the collective methods themselves.

Compiled so that a small message passing through costs a few hundred
nanoseconds over stock mpi4py; Python decides, one compiled call into
cxlmpi._pool runs the whole algorithm.

The module is one extension made of one file per concern, each a layer on
the ones before; the methods sit in one file per collective family, named
as the pool's algorithms are (pyx/pool/)::

    codes.pxi           the numbers shared with Python and cxlmpi._pool
                        (collectives, variant flags, path codes, size
                        classes; declared in pyx/cxl_codes.h)
    shim/stats.pxi      per-collective counters, the clock, what a call
                        tells the pool when it goes to MPI
    shim/settings.pxi   the settings the hot path reads (windows, tuning)
    shim/types.pxi      MPI datatypes and ops as the pool's kernels know them
    shim/messages.pxi   message parsing: one entry per kind of message
                        (plain, vector), every form mpi4py accepts
    shim/staging.pxi    messages the pool cannot read in place (derived
                        datatypes, MPI.BOTTOM, device arrays) staged through
                        a temporary buffer; DLPack arrays in host memory
    shim/state.pxi      communicator state: the pool and routes of the
                        communicator of the call
    shim/routes.pxi     the compiled half of path selection: the route
                        table (Routes) and the timing rules (skip, take,
                        took)
    shim/direct.pxi     calls that pass through, straight to the MPI library
    shim/run.pxi        what every method shares: block checksums, the
                        header step that settles a v-collective's path,
                        running a pool call (or following a peer to MPI)
    shim/bcast.pxi      Barrier and Bcast
    shim/reduce.pxi     Reduce, Allreduce, Scan and Exscan
    shim/gather.pxi     Allgather(v) and Gather(v)
    shim/exchange.pxi   Scatter(v) and Alltoall(v)
    shim/reduce_scatter.pxi  Reduce_scatter(_block)
    shim/nonblocking.pxi  the nonblocking (Iallreduce, ...) and persistent
                        (Allreduce_init, ...) forms: planned alike on every
                        rank, posted to the pool's worker thread
    shim/requests.pxi   their requests: generalized requests started with C
                        callbacks, and the compiled Wait, Test and Start

and at the end the class CommBase, which binds the methods.

Every decision uses only what MPI requires to match on all ranks: message
bytes (count x type size: type signatures must match), the reduction's
element type (ditto), the op and the root (the same everywhere), and the
communicator (its size, whether its ranks share a pool).  Local properties --
which message form a rank used, where its buffer lives -- never change it.
"""


cimport cython
from cpython.buffer cimport (PyObject_CheckBuffer, PyObject_GetBuffer,
                             PyBuffer_Release, PyBUF_ANY_CONTIGUOUS,
                             PyBUF_WRITABLE, PyBUF_FORMAT)
from libc.stdint cimport intptr_t, uintptr_t, uint64_t
from libc.stdlib cimport calloc, free
from cpython.ref cimport PyObject, Py_XDECREF, Py_XINCREF
from libc.string cimport memcmp, memcpy, memset, strcmp, strcpy, strlen
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_RawFree, PyMem_RawMalloc
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.pyport cimport PY_SSIZE_T_MAX
from cpython.pythread cimport PyThread_get_thread_ident
from cpython.long cimport PyLong_AsSsize_t
from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_IsValid

cdef extern from "<limits.h>":
    int INT_MAX

cdef extern from "<time.h>" nogil:
    ctypedef int clockid_t
    cdef struct timespec:
        long tv_sec
        long tv_nsec
    int clock_gettime(clockid_t clk, timespec *ts)
    clockid_t CLOCK_MONOTONIC

import sys
import threading
from array import array

from . import startup  # no-cython-lint  (first: this module looks MPI up as it loads)
from mpi4py import MPI

from ._pool import OP_CODES, TYPE_CODES, Pool, PoolFailure, pair_hash, reducer_defined

# numpy.ndarray once the program has imported numpy.  cxlmpi never imports
# numpy itself: a program may configure it (thread counts, say) before its
# own first import, and `python -m cxlmpi` must not take that chance away.
cdef object _ndarray = None
cdef object _Intracomm = MPI.Intracomm
cdef object _IN_PLACE = MPI.IN_PLACE


cdef inline object placed(object buf):
    """`buf`, or MPI.IN_PLACE for None: mpi4py reads None as IN_PLACE
    wherever a collective takes it (the send buffer of Allgather, Alltoall,
    Allreduce, Reduce_scatter, Scan, ...; the root's of Gather and Reduce,
    the root's receive buffer of Scatter), and so must the shim, whose
    refusal of a message it cannot read would otherwise fail a call stock
    runs."""
    return _IN_PLACE if buf is None else buf
cdef object _DATATYPE = MPI.Datatype
cdef object _OP = MPI.Op
cdef object _BYTE = MPI.BYTE
cdef object _BOTTOM = MPI.BOTTOM
cdef object _addressof = MPI._addressof
# The stock collectives, looked up once (the pass-through calls them).
cdef object _stock_barrier = MPI.Intracomm.Barrier
cdef object _stock_bcast = MPI.Intracomm.Bcast
cdef object _stock_reduce = MPI.Intracomm.Reduce
cdef object _stock_allreduce = MPI.Intracomm.Allreduce
cdef object _stock_allgather = MPI.Intracomm.Allgather
cdef object _stock_allgatherv = MPI.Intracomm.Allgatherv
cdef object _stock_gather = MPI.Intracomm.Gather
cdef object _stock_gatherv = MPI.Intracomm.Gatherv
cdef object _stock_scatter = MPI.Intracomm.Scatter
cdef object _stock_scatterv = MPI.Intracomm.Scatterv
cdef object _stock_alltoall = MPI.Intracomm.Alltoall
cdef object _stock_alltoallv = MPI.Intracomm.Alltoallv
cdef object _stock_reduce_scatter_block = MPI.Intracomm.Reduce_scatter_block
cdef object _stock_reduce_scatter = MPI.Intracomm.Reduce_scatter
cdef object _stock_scan = MPI.Intracomm.Scan
cdef object _stock_exscan = MPI.Intracomm.Exscan


include "codes.pxi"
include "shim/stats.pxi"
include "shim/settings.pxi"
include "shim/types.pxi"
include "shim/messages.pxi"
include "shim/refusals.pxi"
include "shim/staging.pxi"
include "shim/state.pxi"
include "shim/routes.pxi"
include "shim/direct.pxi"
include "shim/run.pxi"
include "shim/nonblocking.pxi"
include "shim/requests.pxi"
include "shim/bcast.pxi"
include "shim/reduce.pxi"
include "shim/gather.pxi"
include "shim/exchange.pxi"
include "shim/reduce_scatter.pxi"


class CommBase(_Intracomm):
    """The intercepted collectives of CXLComm (see cxlmpi.communicator.cxlcomm).

    Each method parses its messages; when the pool could take the call,
    `take` (or `settle`, for the v-collectives) names the path: stock MPI
    or a pool variant, alike on every rank; `took` tells the selector how
    it went."""

    __slots__ = ()  # no instance dict: one lookup fewer per method call

    # Each method is a module-level function of its family's file (a class
    # body cannot span include files); bound here, it is a method like any.
    Barrier = Barrier                             # shim/bcast.pxi
    Bcast = Bcast
    Reduce = Reduce                               # shim/reduce.pxi
    Allreduce = Allreduce
    Scan = Scan
    Exscan = Exscan
    Allgather = Allgather                         # shim/gather.pxi
    Allgatherv = Allgatherv
    Gather = Gather
    Gatherv = Gatherv
    Scatter = Scatter                             # shim/exchange.pxi
    Scatterv = Scatterv
    Alltoall = Alltoall
    Alltoallv = Alltoallv
    Reduce_scatter_block = Reduce_scatter_block   # shim/reduce_scatter.pxi
    Reduce_scatter = Reduce_scatter
    Ibarrier = Ibarrier                           # their families' files too
    Ibcast = Ibcast
    Ireduce = Ireduce
    Iallreduce = Iallreduce
    Iscan = Iscan
    Iexscan = Iexscan
    Iallgather = Iallgather
    Ialltoall = Ialltoall
    Ireduce_scatter_block = Ireduce_scatter_block
    Iallgatherv = Iallgatherv
    Igather = Igather
    Igatherv = Igatherv
    Iscatter = Iscatter
    Iscatterv = Iscatterv
    Ialltoallv = Ialltoallv
    Ireduce_scatter = Ireduce_scatter
    Barrier_init = Barrier_init
    Bcast_init = Bcast_init
    Reduce_init = Reduce_init
    Allreduce_init = Allreduce_init
    Scan_init = Scan_init
    Exscan_init = Exscan_init
    Allgather_init = Allgather_init
    Alltoall_init = Alltoall_init
    Reduce_scatter_block_init = Reduce_scatter_block_init
    Allgatherv_init = Allgatherv_init
    Gather_init = Gather_init
    Gatherv_init = Gatherv_init
    Scatter_init = Scatter_init
    Scatterv_init = Scatterv_init
    Alltoallv_init = Alltoallv_init
    Reduce_scatter_init = Reduce_scatter_init


# Named as the methods they are, in reprs, help() and tracebacks.
for _name in METHODS + NONBLOCKING_METHODS:
    getattr(CommBase, _name).__qualname__ = f"CommBase.{_name}"
del _name

# Last: `configure` (shim/settings.pxi) runs at once where the settings were
# read before this module loaded, and needs every function above.
_config.on_change(configure)

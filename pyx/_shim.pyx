# cython: language_level=3
"""The compiled hot path of the wrapped communicator: message parsing, the
pool-or-pass-through decision, and the collective methods themselves.

Compiled so that a small message passing through costs a few hundred
nanoseconds over stock mpi4py; Python decides, one compiled call into
cxlmpi._pool runs the whole algorithm.

The module is one extension made of one file per concern; the methods sit
in one file per collective family, named as the pool's algorithms are
(pyx/pool/)::

    _shim.pyx           statistics, settings, type tables, message parsing,
                        communicator state, path selection (Routes, take,
                        took); at the end the class CommBase, which binds
                        the methods
    shim/run.pxi        what every method shares: block checksums, the
                        header step that settles a v-collective's path,
                        running a pool call (or following a peer to MPI)
    shim/bcast.pxi      Barrier and Bcast
    shim/reduce.pxi     Reduce, Allreduce, Scan and Exscan
    shim/gather.pxi     Allgather(v) and Gather(v)
    shim/exchange.pxi   Scatter(v), Alltoall(v) and Reduce_scatter(_block)

Message parsing mirrors mpi4py's own rules (mpi4py/MPI.src/msgbuffer.pxi,
message_simple) so that a message means here exactly what it means to stock
mpi4py: a buffer alone; ``[buf, datatype]``; ``[buf, count]``;
``[buf, count, datatype]``; ``[buf, (count, displ), datatype]``;
``[buf, count, displ, datatype]``; a datatype may be an MPI.Datatype or a
typecode string.  Where stock mpi4py would raise on a message, `parse`
returns `None` so that the call passes through and the user sees mpi4py's own
exception.  The one case where stock would go on and corrupt memory (an
explicit count larger than the buffer) raises `ValueError` here before any
memory is touched.

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
from libc.stdint cimport uintptr_t, uint64_t
from cpython.ref cimport PyObject, Py_XDECREF, Py_XINCREF
from libc.string cimport memcmp, memset, strcmp, strcpy, strlen
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_RawFree, PyMem_RawMalloc
from cpython.pyport cimport PY_SSIZE_T_MAX
from cpython.long cimport PyLong_AsSsize_t
from cpython.pycapsule cimport PyCapsule_GetPointer

cdef extern from *:
    int __builtin_clzll(unsigned long long) nogil

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

from mpi4py import MPI

from ._pool import OP_CODES, TYPE_CODES, PoolFailure, pair_hash, reducer_defined

# numpy.ndarray once the program has imported numpy.  cxlmpi never imports
# numpy itself: a program may configure it (thread counts, say) before its
# own first import, and `python -m cxlmpi` must not take that chance away.
cdef object _ndarray = None
cdef object _Intracomm = MPI.Intracomm
cdef object _IN_PLACE = MPI.IN_PLACE
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


# ------------------------------------------------------------------ stats

# The order of cxlmpi.config.COLLECTIVES, which the constants below index.
from . import config as _config
from . import spec as _spec
from .config import COLLECTIVES

DEF NCOLL = 16
DEF BARRIER = 0
DEF BCAST = 1
DEF REDUCE = 2
DEF ALLREDUCE = 3
DEF ALLGATHER = 4
DEF ALLGATHERV = 5
DEF GATHER = 6
DEF GATHERV = 7
DEF SCATTER = 8
DEF SCATTERV = 9
DEF ALLTOALL = 10
DEF ALLTOALLV = 11
DEF REDUCE_SCATTER_BLOCK = 12
DEF REDUCE_SCATTER = 13
DEF SCAN = 14
DEF EXSCAN = 15
cdef double stat_pool[NCOLL]
cdef double stat_pass[NCOLL]
cdef double stat_bytes[NCOLL]
cdef double stat_seconds[NCOLL]
cdef double stat_learn[NCOLL]   # calls that timed a path (adaptive selection)
cdef double stat_zc[NCOLL]      # pool calls that used the ranks' buffers in place


cdef inline double now() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + 1e-9 * ts.tv_nsec


cdef inline bint within(int which, Py_ssize_t nbytes) noexcept:
    return lo[which] <= nbytes < hi[which]


cdef inline double start() noexcept:
    return now() if time_all else 0.0


cdef inline void passed(int which, double t0) noexcept:
    stat_pass[which] += 1
    if time_all:
        stat_seconds[which] += now() - t0
    if _run_routes != NULL:   # a call of a timed run that `skip` sent to MPI
        timed_pass(which)


# The pool of the communicator the last call was made on (see `sized`), and
# its pass marker: a Pool's is its C function and state (Pool.pass_marker),
# called without a Python call; a Hierarchy's, its note_pass method.
ctypedef void (*mark_fn)(void *) noexcept nogil
cdef object _marked_pool = None   # keeps the Pool (and its state) alive
cdef mark_fn _marked_fn = NULL
cdef void *_marked_state = NULL


cdef inline int to_mpi(object comm) except -1:
    """This rank is about to send a call to stock MPI: tell the pool (if
    `comm` has one), so that peers that took the call to the pool follow
    (ranks that disagree on a size may disagree on the path, too)."""
    sized(comm)
    if _marked_fn != NULL:
        _marked_fn(_marked_state)
    elif _marked_pool is not None:
        _marked_pool.note_pass()
    return 0


cdef inline void pooled(int which, double nbytes, double t0) noexcept:
    stat_pool[which] += 1
    stat_bytes[which] += nbytes
    stat_seconds[which] += now() - t0
    if nbytes > malloc_seen:
        malloc_like_mpi(nbytes)


# The largest message a pool call has moved in this process (see below).
cdef double malloc_seen = 0


cdef void malloc_like_mpi(double nbytes) noexcept:
    """Allocate and free a block of `nbytes`, as stock MPI does for its
    temporary buffers (a reduction's, a pipeline's), so that the C library
    adapts to the program's large blocks as it would under stock MPI.
    glibc's malloc serves blocks of its mmap threshold (128 KiB at first)
    and more with fresh mmaps, paid in page faults at first touch; freeing
    such a block raises the threshold to its size (up to 32 MiB).  Under
    stock MPI a program's first large collective does that, and from then
    on NumPy's large temporaries come from the heap, reused; the pool path
    allocates nothing, and a training loop kept mapping its temporaries
    afresh: 124,000 more page faults in 150 steps, that rank's gradient 30 %
    slower.  Once per new largest size: one malloc and free, untouched (no
    page is faulted in); elsewhere than glibc, a no-op in effect."""
    global malloc_seen
    malloc_seen = nbytes
    if nbytes > 32 << 20:
        return
    cdef void *block = PyMem_RawMalloc(<size_t>nbytes)
    PyMem_RawFree(block)


def stats_rows():
    """{name: (pool_calls, passthrough_calls, nbytes, seconds, learning
    calls, zero-copy calls)} of every intercepted collective, called or
    not."""
    return {COLLECTIVES[i]: (int(stat_pool[i]), int(stat_pass[i]),
                             int(stat_bytes[i]), stat_seconds[i], int(stat_learn[i]),
                             int(stat_zc[i]))
            for i in range(NCOLL)}


def stats_reset():
    """Zero every counter."""
    for i in range(NCOLL):
        stat_pool[i] = stat_pass[i] = stat_bytes[i] = stat_seconds[i] = stat_learn[i] = 0
        stat_zc[i] = 0


# --------------------------------------------------------------- settings

# Per collective, the message sizes (bytes, all blocks together) that go
# through the pool: lo <= nbytes < hi (cxlmpi.config.windows()).  Two
# tables: for a pool on one host (lo1/hi1; small messages pass through:
# MPI reaches those peers through shared memory) and for a pool whose
# ranks run on several hosts (lo2/hi2; MPI would cross the network).
# `lo`/`hi` point at the table of the communicator of the call (`sized`):
# lo1/hi1 unless `hosts_apart` (a file: or dax: pool, which may span
# hosts, and the tables differ), where a communicator without a pool yet
# reads lo2/hi2 (the lower: its first call sets the pool up) and one with
# a pool its own; `take` then checks against the table of the pool found.
#
# `lo`/`hi` are the calling thread's own (threads may each call on a
# communicator of their own at once): set by `enter` at every call where
# the tables differ, so that another thread's call never changes the table
# one call reads.
cdef extern from *:
    """
    static Py_ssize_t cxl_lo1[16], cxl_hi1[16], cxl_lo2[16], cxl_hi2[16];
    static __thread Py_ssize_t *cxl_lo = cxl_lo1, *cxl_hi = cxl_hi1;
    """
    Py_ssize_t lo1 "cxl_lo1" [NCOLL]
    Py_ssize_t hi1 "cxl_hi1" [NCOLL]
    Py_ssize_t lo2 "cxl_lo2" [NCOLL]
    Py_ssize_t hi2 "cxl_hi2" [NCOLL]
    Py_ssize_t *lo "cxl_lo"
    Py_ssize_t *hi "cxl_hi"
if sizeof(lo1) != NCOLL * sizeof(Py_ssize_t):
    raise ImportError("cxlmpi._shim: the window tables are not NCOLL long")
cdef bint hosts_apart = False
# CXLMPI_TUNING=adaptive: lo/hi are [CXLMPI_THRESHOLD, -) and each
# communicator's Routes choose (a Pool's or a Hierarchy's); where it has
# none, the builtin windows (blo/bhi) decide.
cdef bint adaptive = False
cdef Py_ssize_t blo[NCOLL]
cdef Py_ssize_t bhi[NCOLL]
cdef Py_ssize_t NEVER = PY_SSIZE_T_MAX
cdef bint disabled = False
cdef bint configured = False
# Calls that pass through go straight to the MPI library (shim/direct.pxi):
# its functions were `found`, and CXLMPI_DISABLE is off.
cdef bint found = False
cdef bint straight = False
# Time passed-through calls too (CXLMPI_STATS=1); otherwise only pool calls
# are timed, which keeps two clock reads off the small-message path.
cdef bint time_all = False
# How long the MPI barrier that ends a pool collective (CXLMPI_ORDERING)
# waits for a peer (CXLMPI_TIMEOUT; 0: for ever).
cdef double order_timeout_s = 0


cdef void set_windows(Py_ssize_t *los, Py_ssize_t *his, dict windows):
    for i, name in enumerate(COLLECTIVES):
        window = windows.get(name)
        if window is None:
            los[i] = his[i] = NEVER
        else:
            los[i] = min(window[0], NEVER)
            his[i] = NEVER if window[1] is None else min(window[1], NEVER)


def configure(cfg):
    """Take the settings the hot path needs (called by cxlmpi.config)."""
    global disabled, configured, time_all, adaptive, hosts_apart, lo, hi, _sized_comm, straight
    global order_timeout_s
    set_windows(lo1, hi1, cfg.windows())
    set_windows(lo2, hi2, cfg.windows(hosts=True))
    hosts_apart = _spec.parse_spec(cfg.pool).shared_file and (
        memcmp(lo1, lo2, sizeof(lo1)) != 0 or memcmp(hi1, hi2, sizeof(hi1)) != 0)
    lo, hi = lo1, hi1
    _sized_comm = None
    adaptive = cfg.adaptive
    set_windows(blo, bhi, _config.Config(dict(
        CXLMPI_TUNING="builtin", CXLMPI_THRESHOLD=str(cfg.threshold))).windows())
    disabled = cfg.disable
    straight = found and not disabled
    time_all = cfg.stats
    order_timeout_s = cfg.timeout
    configured = True


cdef inline int enter(object comm) except -1:
    """At the start of every intercepted call: the settings are read on the
    first one, not at import, so that a malformed variable is reported
    where it matters, once; the windows are those of `comm`'s pool."""
    if not configured:
        _config.get()
    if world_check is not None:
        check_world(comm)
    if hosts_apart:
        sized(comm)
        set_table(_sized_state)   # (this thread's: see lo1)
    return 0


_config.on_change(configure)


# cxlmpi.wrap(COMM_WORLD) leaves the settings check (a collective step) to
# the first collective on COMM_WORLD: made by every rank at the same point
# of its calls, disabled ranks included (wrap itself may be called by some
# ranks only, or before a point-to-point exchange).
cdef object world_check = None
cdef object _world_handle = MPI.COMM_WORLD.handle


def check_world_first(check):
    """Run `check()` on the next intercepted collective on COMM_WORLD."""
    global world_check
    world_check = check


cdef int check_world(object comm) except -1:
    global world_check
    if comm.handle == _world_handle:
        check, world_check = world_check, None
        check()
    return 0


# ---------------------------------------------------------- type tables

# MPI datatype handle -> (type code, size, handle); code -1: data movement only.
cdef dict TYPE_INFO = {}
# The same, keyed by the address of mpi4py's predefined datatype objects
# (MPI.DOUBLE; the typecode table's are the same objects), kept alive here:
# a message's type found without reading its .handle (a Python property).
cdef dict TYPE_OF = {}
cdef list _TYPE_OBJECTS = []
# typecode string -> MPI datatype (mpi4py's own table)
cdef dict TYPE_DICT = dict(MPI._typedict)
# MPI op handle -> op code; by the address of mpi4py's predefined op objects
# (MPI.SUM, kept alive in OP_CODES' names) -> (op code, handle).
cdef dict OPS = {getattr(MPI, name).handle: code for name, code in OP_CODES.items()}
cdef dict OPS_OF = {}


def _add_ops():
    for name, code in OP_CODES.items():
        op = getattr(MPI, name)   # (a module constant: it lives as long as mpi4py)
        OPS_OF[<Py_ssize_t><void *>op] = (code, op.handle)


_add_ops()

MOVE_ONLY = -1
_SIGNED = ("SIGNED_CHAR", "SHORT", "INT", "LONG", "LONG_LONG", "INT8_T",
           "INT16_T", "INT32_T", "INT64_T", "AINT", "OFFSET", "COUNT")
_UNSIGNED = ("UNSIGNED_CHAR", "UNSIGNED_SHORT", "UNSIGNED", "UNSIGNED_LONG",
             "UNSIGNED_LONG_LONG", "UINT8_T", "UINT16_T", "UINT32_T",
             "UINT64_T")
_FLOAT = ("FLOAT", "DOUBLE")
_COMPLEX = ("C_FLOAT_COMPLEX", "C_DOUBLE_COMPLEX")
_OPAQUE = ("CHAR", "WCHAR")  # text: no reduction is defined on it


def _add_types(names, prefix):
    for name in names:
        dtype = getattr(MPI, name, None)
        if dtype is None or dtype == MPI.DATATYPE_NULL:
            continue
        size = dtype.Get_size()
        if prefix is None:
            code = MOVE_ONLY
        else:
            code = TYPE_CODES.get(f"{prefix}{size * 8}", MOVE_ONLY)
        _add_type(dtype, code, size)


def _add_type(dtype, code, size):
    # (the handle as the C field holds it: MPICH's handles of some
    # predefined types, MPI.FLOAT_INT's, are beyond a Py_ssize_t)
    info = (code, size, <Py_ssize_t><uintptr_t>dtype.handle)
    TYPE_INFO[dtype.handle] = TYPE_OF[<Py_ssize_t><void *>dtype] = info
    _TYPE_OBJECTS.append(dtype)


_add_types(_SIGNED, "i")
_add_types(_UNSIGNED, "u")
_add_types(_FLOAT, "f")
_add_types(_COMPLEX, "c")
_add_types(_OPAQUE, None)
if MPI.C_BOOL.Get_size() == 1:
    _add_type(MPI.C_BOOL, TYPE_CODES["bool"], 1)
_add_type(MPI.BYTE, TYPE_CODES["byte"], 1)


cdef inline tuple type_info(object dtype):
    """(type code, size, handle) of an MPI datatype the pool knows, or None."""
    info = TYPE_OF.get(<Py_ssize_t><void *>dtype)
    if info is None:
        info = TYPE_INFO.get(dtype.handle)
        if info is None and dtype.handle not in NOT_MOVED:
            info = moved_as_bytes(dtype)
    return info


# Handles of datatypes `moved_as_bytes` turned down.
cdef set NOT_MOVED = set()


cdef tuple moved_as_bytes(object dtype):
    """type_info of a predefined datatype without a kernel (MPI.PACKED,
    long double, Fortran's, pairs of no padding): moved as its bytes, as
    MPI moves a contiguous run of them, where its elements are exactly
    their size apart; None for any other (remembered).  A rank that sent
    such a message to MPI alone left its peers in the pool's set-up, or
    across pool groups in the leaders' MPI step, for ever."""
    info = None
    try:
        if isinstance(dtype, _DATATYPE) and dtype.is_predefined:
            size = dtype.Get_size()
            if size > 0 and dtype.Get_extent() == (0, size) and \
                    dtype.Get_true_extent() == (0, size):
                _add_type(dtype, MOVE_ONLY, size)
                info = TYPE_INFO[dtype.handle]
    except MPI.Exception:
        pass
    if info is None:
        NOT_MOVED.add(dtype.handle)
    return info


cpdef object op_code(object op):
    """Kernel op code of a predefined MPI op, or None (user-defined ops,
    MINLOC/MAXLOC, REPLACE and NO_OP pass through)."""
    info = op_info(op)
    return None if info is None else info[0]


cdef inline tuple op_info(object op):
    """(op code, handle) of a predefined MPI op, or None."""
    info = OPS_OF.get(<Py_ssize_t><void *>op)
    if info is None and isinstance(op, _OP):
        code = OPS.get(op.handle)
        if code is not None:
            info = (code, op.handle)
    return info


# --------------------------------------------------------------- messages

@cython.no_gc   # (it refers to no object that could refer back to it)
cdef class Message:
    """A parsed message; holds the buffer while it lives."""
    cdef Py_buffer view
    cdef bint held
    cdef readonly uintptr_t address
    cdef readonly Py_ssize_t count
    cdef readonly Py_ssize_t itemsize
    cdef readonly Py_ssize_t nbytes  # count x itemsize
    cdef readonly int tcode
    cdef readonly object datatype
    cdef readonly Py_ssize_t handle   # the datatype's MPI handle
    # A staged message (see `stage`): (temporary buffer, its datatype,
    # [(the user's message, byte offset, elements), ...]); None otherwise.
    cdef object staged
    # The user's memory the message reaches, [lo, hi) (a staged message's,
    # not the temporary's; a vector's from its first block to its last):
    # a call's two messages must not share any (`aliased`).
    cdef uintptr_t lo, hi

    def __dealloc__(self):
        if self.held:
            PyBuffer_Release(&self.view)


cdef inline object lookup_type(object o_type):
    if isinstance(o_type, str):
        return TYPE_DICT.get(o_type)
    if isinstance(o_type, _DATATYPE):
        return o_type
    return None


cdef tuple unpack(object msg, bint vector, bint device=False, bint bottom=False):
    """(buf, count(s), displ(s), datatype) of a message, as mpi4py reads
    it, or None for a form it rejects or the pool cannot take (`device`:
    a device array's may be taken, see `foreign`; `bottom`: MPI.BOTTOM's
    or None's with a count, see `derived` and `nothing`)."""
    cdef object o_buf = None, o_count = None, o_displ = None, o_type = None
    cdef Py_ssize_t nargs
    if PyObject_CheckBuffer(msg) or (device and device_array(msg)):
        return (msg, None, None, None)
    if not isinstance(msg, (list, tuple)):
        return None
    nargs = len(msg)
    # the vector form reads a tuple as (counts, displs), a list as counts
    pair = tuple if vector else (list, tuple)
    if nargs == 2:
        o_buf, o_count = msg
        if isinstance(o_count, (str, _DATATYPE)):
            o_count, o_type = None, o_count
        elif isinstance(o_count, pair):
            if len(o_count) != 2:
                return None
            o_count, o_displ = o_count
    elif nargs == 3:
        o_buf, o_count, o_type = msg
        if isinstance(o_count, pair):
            if len(o_count) != 2:
                return None
            o_count, o_displ = o_count
    elif nargs == 4:
        o_buf, o_count, o_displ, o_type = msg
    else:
        return None
    if (o_buf is _BOTTOM or o_buf is None) and bottom and o_count is not None:
        return (o_buf, o_count, o_displ, o_type)
    if o_buf is None or o_buf is _BOTTOM or not (
            PyObject_CheckBuffer(o_buf) or (device and device_array(o_buf))):
        return None
    return (o_buf, o_count, o_displ, o_type)


cdef inline bint device_array(object obj):
    """Whether mpi4py reads `obj` as a device array (no buffer protocol:
    __cuda_array_interface__ or DLPack), memory the pool cannot read."""
    return not PyObject_CheckBuffer(obj) and (
        hasattr(obj, "__cuda_array_interface__") or hasattr(obj, "__dlpack__"))


cdef object format_type(str fmt):
    """The MPI datatype mpi4py reads from a buffer format, or None (uint8,
    "B", is MPI_UNSIGNED_CHAR, every op defined on it: not MPI_BYTE)."""
    if fmt[:1] in ("<", "@", "="):
        fmt = fmt[1:]
    return TYPE_DICT.get(fmt)


# Buffer format -> the datatype mpi4py reads from it (`format_type`): its
# handle, size and type code, and the datatype object (one of mpi4py's
# predefined ones, alive as long as mpi4py); size 0: not a type the shim
# takes.  A few formats ever occur; looked up without building a string.
DEF NFMT = 16
cdef struct fmt_entry:
    char fmt[8]
    Py_ssize_t handle
    Py_ssize_t size
    int tcode
    PyObject *dtype
cdef fmt_entry fmts[NFMT]
cdef int nfmts = 0
cdef const char *BYTE_FORMAT = "B"   # a buffer without a format holds bytes


cdef fmt_entry *format_entry(const char *fmt):
    """The entry of format `fmt`, made on its first sight; NULL when the
    table is full or the format long (then the caller reads it itself)."""
    global nfmts
    cdef int i
    for i in range(nfmts):
        if strcmp(fmts[i].fmt, fmt) == 0:
            return &fmts[i]
    if strlen(fmt) >= 8 or nfmts == NFMT:
        return NULL
    dtype = format_type(fmt.decode())
    info = type_info(dtype) if dtype is not None else None
    cdef fmt_entry *e = &fmts[nfmts]
    strcpy(e.fmt, fmt)
    e.size = 0
    if info is not None:
        _TYPE_OBJECTS.append(dtype)   # (kept alive: the entry borrows it)
        e.tcode, e.size, e.handle = info
        e.dtype = <PyObject *>dtype
    nfmts += 1
    return e


cdef Message get_buffer(object o_buf, object o_type, bint writable):
    """The buffer and element type of a message, or None."""
    cdef Message m = Message.__new__(Message)
    cdef int flags = PyBUF_ANY_CONTIGUOUS | PyBUF_FORMAT
    if writable:
        flags |= PyBUF_WRITABLE
    try:
        PyObject_GetBuffer(o_buf, &m.view, flags)
    except Exception:
        return None
    m.held = True
    m.lo = <uintptr_t>m.view.buf
    m.hi = m.lo + <size_t>m.view.len
    cdef object dtype
    cdef fmt_entry *e
    if o_type is None:
        e = format_entry(<const char *>m.view.format if m.view.format != NULL
                         else BYTE_FORMAT)
        if e != NULL:
            if e.size == 0:
                return None
            m.datatype = <object>e.dtype
            m.tcode, m.itemsize, m.handle = e.tcode, e.size, e.handle
            m.address = <uintptr_t>m.view.buf
            return m
        dtype = format_type(m.view.format.decode() if m.view.format != NULL else "B")
    else:
        dtype = lookup_type(o_type)
    if dtype is None:
        return None
    info = type_info(dtype)
    if info is None:
        return None
    m.datatype = dtype
    m.tcode, m.itemsize, m.handle = info
    m.address = <uintptr_t>m.view.buf
    return m


cdef object outside(str what, object nbytes, Py_ssize_t length):
    """The error for a message whose `what` reaches `nbytes` bytes (a Python
    int: it cannot wrap around) into a buffer of `length` bytes."""
    from .errors import CXLMPIMessageError

    return CXLMPIMessageError(
        f"message: {what} reaches {nbytes} bytes but the buffer holds {length}; "
        f"pass counts and displacements that fit the buffer")


cdef Message parse_typed(object o_buf, object dtype, tuple info, bint writable, int blocks):
    """`parse` of the commonest list form, ``[buf, MPI.DOUBLE]`` (a
    predefined datatype object, `info` its type_info): no format to read,
    the count inferred from the length, as mpi4py infers it."""
    if o_buf is None or o_buf is _BOTTOM or not PyObject_CheckBuffer(o_buf):
        return None
    cdef Message m = Message.__new__(Message)
    try:
        PyObject_GetBuffer(o_buf, &m.view,
                           PyBUF_ANY_CONTIGUOUS | (PyBUF_WRITABLE if writable else 0))
    except Exception:
        return None
    m.held = True
    m.lo = <uintptr_t>m.view.buf
    m.hi = m.lo + <size_t>m.view.len
    m.datatype = dtype
    m.tcode, m.itemsize, m.handle = info
    cdef Py_ssize_t n = m.view.len // m.itemsize, nblocks = blocks if blocks > 1 else 1
    if m.view.len % m.itemsize or n % nblocks:
        return None   # stock reports it (cannot infer the count)
    m.address = <uintptr_t>m.view.buf
    m.count = n // nblocks
    m.nbytes = m.count * m.itemsize
    return m


cpdef Message parse(object msg, bint writable, int blocks=0):
    """A `Message` for `msg`, or None when the pool cannot take it (an
    unsupported datatype, a GPU buffer, MPI.BOTTOM, or a message that stock
    mpi4py rejects).  With `blocks` (the buffer holds one block per rank, as
    a Gather's receive buffer does), `count` is the count of one block."""
    if (type(msg) is list or type(msg) is tuple) and len(msg) == 2:
        info = TYPE_OF.get(<Py_ssize_t><void *>msg[1])
        if info is not None:
            return parse_typed(msg[0], msg[1], info, writable, blocks)
    parts = unpack(msg, False)
    if parts is None:
        return None
    o_buf, o_count, o_displ, o_type = parts
    cdef Message m = get_buffer(o_buf, o_type, writable)
    if m is None:
        return None
    cdef Py_ssize_t length = m.view.len, offset = 0, count, displ
    cdef Py_ssize_t nblocks = blocks if blocks > 1 else 1
    try:
        if o_displ is not None:
            displ = o_displ.__index__()
            if displ < 0:
                return None
            # Compared in elements: displ x itemsize may wrap around.
            if displ > length // m.itemsize:
                if displ <= PY_SSIZE_T_MAX // m.itemsize:
                    return None  # stock reports it (displacement out of bounds)
                # stock's own check wraps around here: refuse it
                raise outside(f"displacement {displ} of {m.datatype.Get_name()}",
                              int(displ) * m.itemsize, length)
            offset = displ * m.itemsize
            length -= offset
        if o_count is not None:
            count = o_count.__index__()
            if count < 0:
                return None
        else:
            if length % m.itemsize or (length // m.itemsize) % nblocks:
                return None
            count = length // m.itemsize // nblocks
    except (TypeError, AttributeError, OverflowError):
        return None
    # In elements, never in bytes: count x nblocks x itemsize may wrap around
    # (2**61 + 1024 doubles "need" 8 KiB in 64 bits).
    if count > length // m.itemsize // nblocks:
        raise outside(f"{nblocks} x {count} of {m.datatype.Get_name()}",
                      int(nblocks) * int(count) * m.itemsize, length)
    m.address += offset
    m.count = count
    m.nbytes = count * m.itemsize
    m.lo = m.address
    m.hi = m.lo + <size_t>(count * nblocks * m.itemsize)
    return m


DEF VECTOR_INLINE = 8   # blocks a Vector holds without an allocation


@cython.no_gc   # (as Message)
cdef class Vector:
    """A parsed vector message (``[buf, counts, displs, type]`` and the
    shorter forms, as mpi4py reads them): its buffer (`m`, whose count is
    the sum of the counts) and the counts and displacements in elements, as
    C arrays -- `ints` when every one fits a C int, as MPI's functions take
    them.  Holds the buffer while it lives."""
    cdef readonly Message m
    cdef Py_ssize_t blocks
    cdef Py_ssize_t *counts
    cdef Py_ssize_t *displs
    cdef int *icounts
    cdef int *idispls
    cdef Py_ssize_t largest   # the largest count
    cdef bint ints
    cdef char *block          # the four arrays: `inline`, or allocated
    cdef Py_ssize_t inline[VECTOR_INLINE * 3]   # (2 Py_ssize_t and 2 ints a block)

    def __dealloc__(self):
        if self.block != <char *>self.inline:
            PyMem_Free(self.block)

    cdef int alloc(self, Py_ssize_t blocks) except -1:
        cdef char *block = <char *>self.inline
        if blocks > VECTOR_INLINE:
            block = <char *>PyMem_Malloc(blocks * (2 * sizeof(Py_ssize_t) + 2 * sizeof(int)))
            if block == NULL:
                raise MemoryError()
        self.block = block
        self.blocks = blocks
        self.counts = <Py_ssize_t *>block
        self.displs = self.counts + blocks
        self.icounts = <int *>(self.displs + blocks)
        self.idispls = self.icounts + blocks
        return 0

    cdef list count_list(self):
        return [self.counts[i] for i in range(self.blocks)]

    cdef list displ_list(self):
        return [self.displs[i] for i in range(self.blocks)]


cdef int read_ints(object value, Py_ssize_t blocks, Py_ssize_t *out,
                   bint scalar=True) except -1:
    """`blocks` ints from an int (where `scalar` allows one) or a sequence
    of them into `out`: 1, or 0 when `value` is not that (mpi4py reports
    it); ValueError on a length that is not `blocks`.  Read as mpi4py reads
    it, by len() and [i] (a dict {0: 1, 1: 2} is [1, 2]; a generator has no
    length)."""
    cdef Py_ssize_t i, n
    cdef object item
    try:
        if type(value) is not list and type(value) is not tuple:
            if scalar and is_integral(value):
                n = value.__index__()
                for i in range(blocks):
                    out[i] = n
                return 1
        n = len(value)
        if n != blocks:
            raise ValueError(f"message: expecting {blocks} items, got {n}")
        for i in range(n):
            item = value[i]
            out[i] = PyLong_AsSsize_t(item) if type(item) is int else item.__index__()
    except (TypeError, AttributeError, OverflowError):
        return 0
    return 1


cdef inline bint is_integral(object value):
    """An int-like count or displacement (mpi4py's test), not a sequence."""
    return type(value) is int or (hasattr(value, "__index__") and
                                  not hasattr(value, "__len__"))


cdef Vector read_vector(object msg, bint writable, int blocks):
    """A `Vector` of `msg`, or None when neither the pool nor a straight
    call can take it (mpi4py's method then reports what it finds wrong).
    Raises ValueError when a block runs outside the buffer or two blocks of
    a receive buffer (`writable`) overlap: MPI would write out of bounds
    there."""
    parts = unpack(msg, True)
    if parts is None:
        return None
    o_buf, o_counts, o_displs, o_type = parts
    cdef Message m = get_buffer(o_buf, o_type, writable)
    if m is None:
        return None
    cdef Vector v = Vector.__new__(Vector)
    v.m = m
    v.alloc(blocks)
    cdef Py_ssize_t length = m.view.len // m.itemsize, total, acc, i, c, d
    if (o_counts is None and m.view.len % m.itemsize) or \
            not read_layout(v, o_counts, o_displs, length, blocks):
        return None
    # Compared in elements, never summed beyond `length`: nothing wraps around.
    cdef bint ordered = True
    cdef Py_ssize_t first = length, end = 0   # the blocks' reach
    total = acc = 0
    v.largest = 0
    v.ints = True
    for i in range(blocks):
        c, d = v.counts[i], v.displs[i]
        if c < 0 or d < 0 or d > length or c > length - d:
            from .errors import CXLMPIMessageError

            raise CXLMPIMessageError(
                f"message: block {i} (displacement {d}, count {c}) runs outside "
                f"a buffer of {length} elements")
        if c > v.largest:
            v.largest = c
        if c > INT_MAX or d > INT_MAX:
            v.ints = False
        else:
            v.icounts[i], v.idispls[i] = <int>c, <int>d
        if total > PY_SSIZE_T_MAX // m.itemsize - c:
            from .errors import CXLMPIMessageError

            raise CXLMPIMessageError(
                f"message: more than {total} elements of {m.datatype.Get_name()} "
                f"in all: more bytes than a buffer can hold")
        total += c
        if c and d < acc:
            ordered = False
        if c:
            acc = d + c
            first = min(first, d)
            end = max(end, d + c)
    if writable and not ordered:
        spans = []   # (a loop, not a generator: no closure scope on every call)
        for i in range(blocks):
            if v.counts[i] > 0:
                spans.append((v.displs[i], v.displs[i] + v.counts[i]))
        spans.sort()
        for i in range(1, len(spans)):
            if spans[i][0] < spans[i - 1][1]:
                from .errors import CXLMPIMessageError

                raise CXLMPIMessageError(
                    f"message: receive blocks overlap at element {spans[i][0]}")
    m.count = total   # (blocks of a send buffer may overlap: up to blocks x length)
    m.nbytes = total * m.itemsize
    m.lo = m.address + <size_t>(min(first, end) * m.itemsize)
    m.hi = m.address + <size_t>(end * m.itemsize)
    return v


cdef int read_layout(Vector v, object o_counts, object o_displs, Py_ssize_t length,
                     Py_ssize_t blocks) except -1:
    """A vector message's counts and displacements into `v`, as mpi4py
    reads them from a buffer of `length` elements: none given, the elements
    split evenly, one after the other; a displacement given as one int,
    the stride between blocks.  1, or 0 for what mpi4py would refuse."""
    cdef Py_ssize_t i, acc, d
    if o_counts is None:
        for i in range(blocks):
            v.counts[i] = length // blocks + (length % blocks > i)
    elif not read_ints(o_counts, blocks, v.counts):
        return 0
    if o_displs is None:
        acc = 0
        for i in range(blocks):
            v.displs[i] = acc
            if v.counts[i] > 0:
                acc += v.counts[i]   # (bounded by the callers' checks)
            if acc > length:
                acc = length + 1     # (no sum wraps around)
    elif type(o_displs) is not list and type(o_displs) is not tuple and \
            is_integral(o_displs):
        try:
            d = o_displs.__index__()
        except OverflowError:
            return 0
        if d < 0 or (blocks > 1 and d > PY_SSIZE_T_MAX // (blocks - 1)):
            return 0
        for i in range(blocks):
            v.displs[i] = d * i
    elif not read_ints(o_displs, blocks, v.displs):
        return 0
    return 1


cdef Vector read_counts(object value, int blocks):
    """Reduce_scatter's recvcounts as a Vector without a message (`largest`
    and `m` unset), or None when they are not non-negative ints."""
    cdef Vector v = Vector.__new__(Vector)
    v.alloc(blocks)
    if not read_ints(value, blocks, v.counts, False):   # (mpi4py takes no int here)
        return None
    v.ints = True
    cdef Py_ssize_t i
    for i in range(blocks):
        if v.counts[i] < 0:
            return None
        if v.counts[i] > INT_MAX:
            v.ints = False
        else:
            v.icounts[i] = <int>v.counts[i]
    return v


cdef tuple parse_vector(object msg, bint writable, int blocks):
    """(Message, counts, displs) of a vector message, counts and displs as
    lists in elements (the pool's algorithms take them), or None: see
    `read_vector`."""
    cdef Vector v = read_vector(msg, writable, blocks)
    if v is None:
        return None
    return v.m, v.count_list(), v.displ_list()


# ------------------------------------------------------------- staging
#
# A rank may describe its message with a derived datatype while its peers
# use a plain buffer of the same elements (MPI matches type signatures, not
# layouts).  Were it to send such a call to MPI on its own, its peers
# would have to follow it there: in one pool they can (the pass mark), but
# not where the pool has not been set up yet (its set-up is collective) nor
# across pool groups (the other groups' leaders wait in the leaders' MPI
# step).  So a message of a derived datatype (or a predefined one with
# gaps, such as MPI.DOUBLE_INT; or at MPI.BOTTOM) is staged instead: the
# call runs on a contiguous temporary buffer of its elements (of the one
# predefined type they all are, else the bytes MPI packs them into), which
# `fill` copies the message into and `drain` copies it back out of --
# through MPI on a private self communicator, by the datatype itself, so
# that the layout is MPI's.  Its peers see a message like theirs, and
# every rank decides alike.  Where the
# call goes to MPI, MPI gets the user's message as given.  Not for the
# reductions: MPICH and Open MPI refuse a predefined op on any derived
# datatype, so such a rank goes to MPI and raises there, as under stock.
#
# A device array (a GPU buffer, read by mpi4py through
# __cuda_array_interface__ or DLPack) is staged alike, reductions included
# where its datatype is a predefined one: the pool cannot read device
# memory, and a rank that passed alone would hang its peers where they
# cannot follow.  MPI copies it (a CUDA-aware library between device and
# host); cxlmpi never touches device memory itself.

# A duplicate of COMM_SELF for the staging copies, made on first use, and
# the lock its copies take: two threads' Sendrecv pairs on one
# communicator would match each other's halves, and two first uses would
# run one collective (the Dup) on COMM_SELF at once.  A copy to oneself
# completes without a peer: the lock never waits on another rank.
cdef object _self_comm = None
cdef object _self_lock = threading.Lock()


cdef object one_type(object dtype):
    """The predefined datatype that every element of `dtype` is, or None
    (a struct of several, or one the pool does not know)."""
    base, combiner, params = dtype.decode()
    if combiner == "NAMED":
        return dtype if type_info(dtype) is not None else None
    kids = params["datatypes"] if combiner == "STRUCT" else [base]
    found, alike = None, True
    for kid in kids:
        leaf = one_type(kid) if alike else None
        if not kid.is_predefined:
            kid.Free()   # (decode's derived datatypes are new handles)
        if leaf is None or (found is not None and leaf.handle != found.handle):
            alike = False
        found = leaf
    return found if alike else None


cdef tuple derived(object msg, bint vector, bint writable):
    """(its parts as `unpack` reads them, (buffer length, size, extent,
    true lower bound, true extent, buffer address)) of a message of a
    derived datatype whose buffer it may read (`writable`: and write), or
    None.  A message at MPI.BOTTOM (the datatype holds absolute addresses,
    its buffer is all memory: MPI checks it, as under stock) is staged
    alike: a rank that sent it to MPI alone left its peers waiting."""
    parts = unpack(msg, vector, False, True)
    if parts is None:
        return None
    o_buf, _, _, o_type = parts
    if not isinstance(o_type, _DATATYPE) or (
            o_type.is_predefined and type_info(o_type) is not None):
        return None
    if o_buf is _BOTTOM:
        d = reach(o_type, PY_SSIZE_T_MAX)
        return (parts, d + (0,)) if d is not None else None
    cdef Py_buffer view
    try:
        PyObject_GetBuffer(o_buf, &view, PyBUF_WRITABLE if writable else 0)
    except Exception:
        return None
    cdef Py_ssize_t length = view.len
    cdef uintptr_t address = <uintptr_t>view.buf
    PyBuffer_Release(&view)
    d = reach(o_type, length)
    return (parts, d + (address,)) if d is not None else None


cdef tuple reach(object dtype, object length):
    """(buffer length, size, extent, true lower bound, true extent) of
    `dtype` in a buffer of `length` bytes, or None where MPI does not say
    or its elements take no room."""
    try:
        size = dtype.Get_size()
        extent = dtype.Get_extent()[1]
        tlb, textent = dtype.Get_true_extent()
    except MPI.Exception:
        return None
    if size <= 0 or textent < 0:
        return None
    return (length, size, extent, tlb, textent)


cdef extern from *:
    """
    typedef struct {   /* DLPack's DLTensor, up to its dtype */
        void *data;
        int32_t device_type, device_id;
        int32_t ndim;
        uint8_t code, bits;
        uint16_t lanes;
    } cxl_dltensor;
    """
    ctypedef struct cxl_dltensor:
        unsigned char code, bits
        unsigned short lanes


# DLPack's type codes -> numpy's kinds
cdef dict DL_KINDS = {0: "i", 1: "u", 2: "f", 5: "c", 6: "b"}


cdef object device_type(object obj):
    """The MPI datatype of a bare device array's elements (its
    __cuda_array_interface__ typestr, or its DLPack dtype), as `parse`
    reads a NumPy array of that type, or None."""
    import numpy

    try:
        cai = getattr(obj, "__cuda_array_interface__", None)
        if cai is not None:
            return format_type(numpy.dtype(cai["typestr"]).char)
        try:   # (in host memory NumPy reads it, read-only too)
            return format_type(numpy.from_dlpack(obj).dtype.char)
        except Exception:
            pass
        capsule = obj.__dlpack__()
        # (a DLManagedTensor begins with its DLTensor; the capsule, never
        # consumed, hands it back to its producer when it is freed)
        t = <cxl_dltensor *>PyCapsule_GetPointer(capsule, "dltensor")
        kind = DL_KINDS.get(t.code)
        if kind is None or t.lanes != 1 or t.bits % 8:
            return None
        return format_type(numpy.dtype(f"{kind}{t.bits // 8}").char)
    except Exception:
        return None


cdef tuple foreign(object msg, bint vector, bint writable, bint predefined):
    """`derived` for a message in a device array: its parts, the datatype
    read (a bare array's from its element type: `device_type`), and its
    reach, its length as mpi4py reads the buffer; None for any other
    message, a read-only array to write, or (`predefined`) a derived
    datatype."""
    parts = unpack(msg, vector, True)
    if parts is None or PyObject_CheckBuffer(parts[0]):
        return None
    o_buf, o_count, o_displ, o_type = parts
    try:
        view = MPI.buffer(o_buf)
    except Exception:
        return None
    if writable and view.readonly:
        return None
    length = view.nbytes
    o_type = device_type(o_buf) if o_type is None else lookup_type(o_type)
    if o_type is None or (predefined and not o_type.is_predefined):
        return None
    d = reach(o_type, length)
    return ((o_buf, o_count, o_displ, o_type), d + (view.address,)) if d is not None \
        else None


cdef tuple extent_of(tuple d, object displ, object count):
    """(first, end): the bytes that `count` (> 0) elements of the datatype
    of `d` (see `derived`) from element `displ` on reach, from the buffer's
    start (Python ints: nothing wraps around; the extent may be zero or
    negative)."""
    extent, tlb, textent = d[2], d[3], d[4]
    first = displ * extent + tlb
    last = (displ + count - 1) * extent + tlb
    return min(first, last), max(first, last) + textent


cdef tuple reach_of(tuple d, list parts):
    """[lo, hi): the user's memory that `parts` (see `staging`) reach in
    the buffer of `d` (address d[5])."""
    lo, hi = None, None
    for msg, _, _ in parts:
        if msg[1] > 0:
            first, end = extent_of(d, msg[2], msg[1])
            lo = first if lo is None else min(lo, first)
            hi = end if hi is None else max(hi, end)
    if lo is None or d[5] == 0:
        # (at MPI.BOTTOM: its reach's hull may hold other messages between
        # its parts, and the pool reads and writes only its copy; judged
        # aliased there, a rank went to MPI alone)
        return d[5], d[5]
    return d[5] + lo, d[5] + hi


cdef Message staging(tuple d, Py_ssize_t total, list parts):
    """The staged Message of `total` elements of `d`'s datatype, moved as
    `parts` [(user message, element offset, elements)] say: as elements of
    the one predefined type they all are, or else (a struct of several, a
    pair type such as MPI.DOUBLE_INT) as the bytes MPI packs them into,
    which MPI.PACKED moves (data movement only: reductions stage no derived
    datatype)."""
    global _self_comm
    base = one_type(parts[0][0][3])
    if base is None:
        base = MPI.PACKED
    info = type_info(base)
    cdef Py_ssize_t tsize = info[1], k = d[1] // tsize
    if d[1] % tsize:
        return None
    import numpy
    tmp = numpy.empty(total * d[1], numpy.uint8)
    cdef Message m = Message.__new__(Message)
    PyObject_GetBuffer(tmp, &m.view, PyBUF_WRITABLE)
    m.held = True
    # the user's datatype (compared as mpi4py compares a reduction's two),
    # the predefined one's code and size (the pool's kernels read those)
    m.datatype = parts[0][0][3]
    m.handle = <Py_ssize_t><uintptr_t>m.datatype.handle   # (never handed to MPI)
    m.tcode, m.itemsize = info[0], info[1]
    m.address = <uintptr_t>m.view.buf
    m.lo, m.hi = reach_of(d, parts)
    m.count = total * k
    m.nbytes = total * d[1]
    m.staged = (tmp, base, [(msg, off * k * tsize, n * k) for msg, off, n in parts])
    with _self_lock:
        if _self_comm is None:
            _self_comm = MPI.COMM_SELF.Dup()
    return m


cdef Message stage(object msg, bint writable, int blocks, Py_ssize_t least,
                   bint reducing=False):
    """`parse` for a message of a derived datatype or in a device array
    (see above) of at least `least` bytes: a Message of its elements in a
    temporary buffer (`count` per block, as `parse` counts), or None.  MPI
    itself copies the elements where the datatype says (`move`), as it
    would for the call under stock MPI, so a message whose datatype reaches
    past its buffer object (mpi4py does not check a derived datatype's
    reach: a column [A[0, 1:], 1, column] of a matrix A) is staged too; a
    rank that sent it to MPI alone left its peers waiting in the pool's
    set-up, and took their set-up's messages for its own.
    `reducing`: only a device array of a predefined datatype."""
    found = None if reducing else derived(msg, False, writable)
    if found is None:
        found = foreign(msg, False, writable, reducing)
    if found is None:
        return None
    (o_buf, o_count, o_displ, o_type), d = found
    cdef Py_ssize_t nblocks = blocks if blocks > 1 else 1, displ = 0, total
    try:
        if o_displ is not None:
            displ = o_displ.__index__()
        if o_count is None:
            if d[2] <= 0 or (d[0] - displ * d[2]) % d[2] or \
                    (d[0] - displ * d[2]) // d[2] % nblocks:
                return None
            total = (d[0] - displ * d[2]) // d[2]
        else:
            total = o_count.__index__() * nblocks
    except (TypeError, AttributeError, OverflowError):
        return None
    if displ < 0 or total < 0 or total > PY_SSIZE_T_MAX // 4 // d[1] or \
            total * d[1] < least:
        return None
    cdef Message m = staging(d, total, [([o_buf, total, displ, o_type], 0, total)])
    if m is not None:
        m.count //= nblocks
        m.nbytes //= nblocks
    return m


cdef Vector stage_vector(object msg, int blocks):
    """`read_vector` of a receive vector of a derived datatype (see
    above): its blocks one after the other in a temporary buffer, or
    None."""
    found = derived(msg, True, True)
    if found is None:
        found = foreign(msg, True, True, False)
    if found is None:
        return None
    (o_buf, o_counts, o_displs, o_type), d = found
    if d[2] <= 0 or (o_counts is None and d[0] % d[2]):
        return None   # (receive blocks of no extent overlap; counts split extents)
    cdef Vector v = Vector.__new__(Vector)
    v.alloc(blocks)
    cdef Py_ssize_t total = 0, i
    if not read_layout(v, o_counts, o_displs, d[0] // d[2], blocks):
        return None
    moves = []
    for i in range(blocks):
        if v.counts[i] < 0 or v.displs[i] < 0 \
                or v.counts[i] > PY_SSIZE_T_MAX // 4 // d[1] - total:
            return None
        if v.counts[i]:
            moves.append(([o_buf, v.counts[i], v.displs[i], o_type], total, v.counts[i]))
        total += v.counts[i]
    if not moves:
        return None
    v.m = staging(d, total, moves)
    if v.m is None:
        return None
    cdef Py_ssize_t k = v.m.count // total
    total = 0
    v.largest = 0
    v.ints = True
    for i in range(blocks):
        v.displs[i] = total
        v.counts[i] *= k
        total += v.counts[i]
        v.largest = max(v.largest, v.counts[i])
        if v.counts[i] > INT_MAX or v.displs[i] > INT_MAX:
            v.ints = False
        else:
            v.icounts[i], v.idispls[i] = <int>v.counts[i], <int>v.displs[i]
    return v


# DLPack's device types of memory that the host reads as its own: CPU,
# CUDA's pinned host memory, ROCm's
cdef tuple HOST_DEVICES = (1, 3, 11)


cdef Message parse_host(object msg, bint writable, int blocks):
    """`parse` of a message in a DLPack array in host memory (a PyTorch CPU
    tensor, say: no buffer protocol), read in place through mpi4py's view
    of its buffer (MPI.buffer, which keeps the array alive) with its
    datatype named; None for any other message."""
    parts = unpack(msg, False, True)
    if parts is None or PyObject_CheckBuffer(parts[0]) or \
            hasattr(parts[0], "__cuda_array_interface__"):
        return None
    o_buf, o_count, o_displ, o_type = parts
    try:
        if o_buf.__dlpack_device__()[0] not in HOST_DEVICES:
            return None
        view = MPI.buffer(o_buf)
    except Exception:
        return None
    if o_type is None:
        o_type = device_type(o_buf)
        if o_type is None:
            return None
    return parse([view, o_count, o_displ, o_type], writable, blocks)


cdef Message parse_any(object msg, bint writable, int blocks=0, Py_ssize_t least=0,
                       bint reducing=False):
    """`parse`, or else `parse_host`, or else `stage` (a message of at least
    `least` bytes; `reducing`: a reduction's, where only a device array of
    a predefined datatype is staged)."""
    cdef Message m = parse(msg, writable, blocks)
    if m is None:
        m = parse_host(msg, writable, blocks)
    if m is None:
        m = stage(msg, writable, blocks, least, reducing)
    return m if m is not None else nothing(msg)


cdef Message nothing(object msg):
    """A message of no elements whose buffer the pool cannot read -- None
    or MPI.BOTTOM, count 0 (``[MPI.BOTTOM, 0, MPI.DOUBLE]``: a rank that
    sends nothing) -- as a Message of no bytes; None for any other.  Such
    a rank had sent the call to MPI alone, its peers waiting in the pool."""
    parts = unpack(msg, False, False, True)
    if parts is None or not (parts[0] is None or parts[0] is _BOTTOM) or \
            not is_integral(parts[1]) or parts[1].__index__() != 0:
        return None
    dtype = lookup_type(parts[3])
    if dtype is None:
        return None
    info = type_info(dtype) if dtype.is_predefined else None
    cdef Message m = Message.__new__(Message)
    m.datatype = dtype
    if info is not None:
        m.tcode, m.itemsize, m.handle = info
    else:   # (a derived datatype: MPI is handed no elements of it)
        m.tcode, m.itemsize, m.handle = MOVE_ONLY, 1, <Py_ssize_t><uintptr_t>dtype.handle
    m.address = m.lo = m.hi = 0
    m.count = m.nbytes = 0
    return m


cdef inline Message parse_reduced(object msg, bint writable, int blocks=0):
    """`parse_any` for a reduction's message."""
    return parse_any(msg, writable, blocks, 0, True)


cdef int fill(Message m) except -1:
    """Copy a staged message's user buffer into its temporary one (before a
    pool call reads it); nothing for others."""
    if m is not None and m.staged is not None:
        tmp, base, moves = m.staged
        with _self_lock:
            for user, off, n in moves:
                move(user, [tmp[off:], n, base], True)
    return 0


cdef int drain(Message m) except -1:
    """Copy a staged message's temporary buffer back into the user's (after
    a pool call wrote it)."""
    if m is not None and m.staged is not None:
        tmp, base, moves = m.staged
        with _self_lock:
            for user, off, n in moves:
                move(user, [tmp[off:], n, base], False)
    return 0


cdef int move(object user, object tmp, bint to_tmp) except -1:
    """One staging copy between the user's message and the temporary one,
    through MPI.  A user message at MPI.BOTTOM from element `displ` on
    goes as one struct of its elements that far on: mpi4py checks a
    displacement against the buffer, and MPI.BOTTOM has no bytes."""
    t = None
    if user[0] is _BOTTOM and user[2]:
        t = MPI.Datatype.Create_struct([user[1]], [user[2] * user[3].Get_extent()[1]],
                                       [user[3]]).Commit()
        user = [_BOTTOM, 1, t]
    try:
        if to_tmp:
            _self_comm.Sendrecv(user, 0, 0, tmp, 0, 0)
        else:
            _self_comm.Sendrecv(tmp, 0, 0, user, 0, 0)
    finally:
        if t is not None:
            t.Free()
    return 0


cdef inline bint direct(Message m) noexcept:
    """Whether MPI may be handed `m` as it is (not a staged message)."""
    return m is not None and m.staged is None


cdef inline bint small(object obj, Py_ssize_t limit):
    # The commonest small message, a bare numpy array, decided without parsing.
    global _ndarray
    if _ndarray is None:
        numpy = sys.modules.get("numpy")
        if numpy is None:
            return False
        _ndarray = numpy.ndarray
    return type(obj) is _ndarray and obj.nbytes < limit


cdef inline bint aliased(Message a, Message b):
    """Whether the buffers of a call's send and receive messages share
    memory, which MPI forbids (IN_PLACE says it): such a call goes to MPI,
    to be refused or not as stock MPI decides (MPICH refuses it, Open MPI
    runs some), never through the pool, which reads one while it writes the
    other."""
    return a.lo < b.hi and b.lo < a.hi


# ----------------------------------------------------------------- state

# communicator handle -> state object (cxlmpi.comm._State), filled by
# cxlmpi.comm.state_for, emptied by the MPI attribute delete callback.
states = {}
cdef dict _states = states
cdef object _state_for = None
cdef object _fail = None
cdef object _order_failed = None


# The communicator the last call was made on, its rank, size, pool state
# (None: none yet) and its pool's pass marker (see to_mpi): a run of calls
# on one communicator asks mpi4py and the states once (rank and size never
# change while a communicator lives; the reference keeps the object from
# being another's; setting a state up forgets it, see state_of; a pool
# closed since is told nothing: note_pass on a closed pool does nothing).
cdef object _sized_comm = None
cdef object _sized_state = None
cdef int _sized_rank = 0, _sized_size = 0
cdef const void *_sized_where = NULL   # where mpi4py keeps its handle (see comm_handle)


cdef inline int sized(object comm) except -1:
    global _sized_comm, _sized_rank, _sized_size, _sized_state, _marked_pool, _marked_fn, \
        _marked_state, _sized_where
    if comm is _sized_comm:
        return 0
    # Everything into locals first: this may run Python code (a finalizer
    # of an object freed on the way), where another thread may call on its
    # own communicator and set these.  Then all of them at once, with no
    # Python code between (the objects they held are kept alive till after:
    # their release could run a finalizer in the middle), so that a call
    # reads one communicator's set, never a mix.
    cdef int rank = comm.Get_rank(), size = comm.Get_size()
    cdef const void *where = <const void *><uintptr_t>_addressof(comm)
    cdef mark_fn fn_c = NULL
    cdef void *st_c = NULL
    state = _states.get(comm.handle)
    pool = state.pool if state is not None else None
    marker = getattr(pool, "pass_marker", None)
    if marker is not None:
        fn, st = marker()
        fn_c = <mark_fn><uintptr_t>fn
        st_c = <void *><uintptr_t>st
    cdef object _held_comm = _sized_comm
    cdef object _held_state = _sized_state
    cdef object _held_pool = _marked_pool
    _sized_rank = rank
    _sized_size = size
    _sized_where = where
    _sized_state = state
    _marked_pool = pool
    _marked_fn = fn_c
    _marked_state = st_c
    _sized_comm = comm
    if hosts_apart:
        set_table(state)   # (this thread's: see lo1)
    return 0


cdef inline void set_table(object state):
    """`lo`/`hi`: the windows of `state`'s pool (see lo1)."""
    global lo, hi
    if state is None or state.hosts > 1:
        lo, hi = lo2, hi2
    else:
        lo, hi = lo1, hi1


cdef inline object comm_state(object comm):
    sized(comm)
    return _sized_state


cdef inline int comm_rank(object comm) except -1:
    sized(comm)
    return _sized_rank


cdef inline int comm_size(object comm) except -1:
    sized(comm)
    return _sized_size


def bind(state_for, fail, order_failed):
    """Install cxlmpi.state's state set-up and failure reporting (of the
    algorithms, and of the MPI barrier that ends a pool collective)."""
    global _state_for, _fail, _order_failed
    _state_for = state_for
    _fail = fail
    _order_failed = order_failed


cpdef object pool_of(object comm, int which=-1):
    """The pool of `comm` for collective `which` (-1: the object
    collectives), set up on first use (collective then: every rank must
    call it at the same point); None when its ranks share no pool or their
    pool hierarchy does not run that collective.  Raises the error that
    broke the pool, if one did."""
    global _sized_comm
    state = _states.get(comm.handle)
    if state is None:
        _sized_comm = None
        state = _state_for(comm)
    if state.error is not None:
        raise state.error
    if state.only is not None and (which < 0 or not state.only[which]):
        return None
    return state.pool


cdef object state_of(object comm, int which):
    """`pool_of`, returning the communicator's state (None: no pool for
    this collective): its pool and its routes."""
    global _sized_comm
    state = _states.get(comm.handle)
    if state is None:
        _sized_comm = None
        state = _state_for(comm)
        sized(comm)   # (the windows of the pool just set up: see `take`)
    if state.error is not None:
        raise state.error
    if state.pool is None or (state.only is not None and not state.only[which]):
        return None
    return state


# ------------------------------------------------------- path selection

include "shim/routes.pxi"


# Per thread (threads may each call on a communicator of their own at
# once): whether the current call times its path for the selector, and the
# routes of a call `skip` sent to MPI for a run -- a reference of its own
# (set_run_routes): a call whose MPI raised leaves it set until the next,
# and the communicator may be freed meanwhile.
cdef extern from *:
    """
    static __thread int cxl_learning;
    static __thread PyObject *cxl_run_routes;
    """
    bint learning "cxl_learning"
    PyObject *_run_routes "cxl_run_routes"


cdef inline void set_run_routes(PyObject *routes) noexcept:
    """Hold `routes` (NULL: none) as this thread's run routes; the routes
    held before are let go last (their release may run Python code)."""
    global _run_routes
    cdef PyObject *held = _run_routes
    Py_XINCREF(routes)
    _run_routes = routes
    Py_XDECREF(held)


cdef inline void run_ended_call(Routes r) noexcept:
    """A call of a run timed end to end has ended (see Routes.run_span)."""
    cdef double end = now()
    if r.run_last > 0:   # (not the run's opening call)
        if r.run_skip > 0:   # still in the untimed half, back to back or not
            r.run_skip -= 1
        elif r.ops_ptr[0] == r.run_last_ops + 1:
            r.run_seconds += end - r.run_last
            r.run_calls += 1
    r.run_last = end
    r.run_last_ops = r.ops_ptr[0]


cdef void timed_pass(int which) noexcept:
    """`passed` for a call of an MPI run that `skip` let through."""
    global learning
    learning = False
    cdef Routes r = <Routes>_run_routes
    set_run_routes(NULL)
    # (the same collective: a call whose stock MPI raised never got here,
    # and must not lend its mark to the next one)
    if r.run_which == which and r.run_span:
        stat_learn[which] += 1
        run_ended_call(r)


cdef inline bint in_arenas(Routes r, uintptr_t address, Py_ssize_t nbytes) noexcept:
    return r.arena_lo <= address and address + <size_t>nbytes <= r.arena_hi


cdef int take(object comm, object state, int which, Py_ssize_t nbytes, int root,
              uintptr_t a=0, Py_ssize_t an=0, uintptr_t b=0, Py_ssize_t bn=0) except -9:
    """The path of a call of `nbytes` (all blocks together) that the pool
    could take: 0 MPI, FOLLOW MPI without a pass mark, > 0 a pool code.
    Settled classes decide here; the others ask the selector after a
    header step (see cxlmpi.select).

    [a, a + an) and [b, b + bn): this rank's buffers when the call could
    run zero-copy if every rank's were in the pool (0: it could not).  A
    class settled on MPI for private buffers never runs the pool, so it
    would never see that the program now uses pool arrays: a rank whose
    buffers are in the arenas asks in a header step instead, where all
    learn whether every rank's are (then the class's placement is `pool`,
    alike on every rank); where some rank's are not, that rank goes to MPI
    at once and the others follow it there."""
    global learning
    learning = False
    if hosts_apart and which != BARRIER and not within(which, nbytes):
        return 0   # outside the windows of the pool this call set up
    cdef Routes r = state.routes
    if r is None:   # pinned
        return 1 if not adaptive or which == BARRIER or \
            blo[which] <= nbytes < bhi[which] else 0
    cdef int sc = size_class(nbytes)
    cdef int pl = r.where[which][sc]
    cdef int code = r.choice[which][sc][pl]
    if code == NEW and (r.run_which < 0 or r.run_new):
        # The class's first call: MPI, the reference, opens its first run,
        # as the selector would open it, without the header step's cost
        # (every rank meets the class at the same call).  The run's time
        # goes out with the next header step.  It takes the place of a run
        # another class's first call opened (that class has no learner
        # yet: its next call after the run asks in a header step, which
        # opens its run again), not of a run the selector waits for.
        r.start_run(which, sc, pl, 0, r.ops_ptr[0] + r.due[which][sc][pl],
                    r.first_skip[sc])
        r.run_new = True
        learning = True
        return 0
    cdef bint resident = (a != 0 and nbytes >= r.zc_min and in_arenas(r, a, an)
                          and (b == 0 or in_arenas(r, b, bn)))
    if code >= 0 and r.ops_ptr[0] < r.due[which][sc][pl] and (code or pl or not resident):
        learning = which == r.run_which and sc == r.run_sc and pl == r.run_pl
        return code
    cdef double t0 = now()
    sel = r.selector
    report, mine = sel.report()
    try:
        agreed, most, spent = state.pool.header(
            2 * (1 + nbytes) + (not resident), METHODS[which], root, 0, report, mine,
            r.spent_ns)
    except PoolFailure as exc:
        if exc.passed:   # a peer sent the call to MPI: all follow, none learns
            return FOLLOW
        raise run_failed(comm, exc) from None
    sel.delivered(most, spent)
    if not agreed & 1:   # every rank's buffers are in the arenas
        r.where[which][size_class((agreed >> 1) - 1)] = 1
    code, learning = sel.pick(which, (agreed >> 1) - 1, r.ops_ptr[0])
    r.spent_ns = <uint64_t>((now() - t0) * 1e9)
    return code if code != 0 else FOLLOW   # every rank knows: no pass mark


cdef int take_agreed(object state, int which, Py_ssize_t nbytes) except -9:
    """`take` after a header step that already ran this call (the
    v-collectives' settle): no second one."""
    global learning
    learning = False
    cdef Routes r = state.routes
    if r is None:
        return 1 if not adaptive or blo[which] <= nbytes < bhi[which] else 0
    cdef int sc = size_class(nbytes)
    cdef int pl = r.where[which][sc]
    cdef int code = r.choice[which][sc][pl]
    if code >= 0 and r.ops_ptr[0] < r.due[which][sc][pl]:
        learning = which == r.run_which and sc == r.run_sc and pl == r.run_pl
        return code
    code, learning = r.selector.pick(which, nbytes, r.ops_ptr[0])
    return code if code != 0 else FOLLOW


cdef inline bint skip(object comm, int which, object obj, Py_ssize_t scale=1) except -1:
    """`small(obj, lo[which])`, and: the class of a bare numpy array `obj`
    (its bytes are the call's, all blocks together) is settled on MPI --
    decided before any message parsing, from what every rank holds alike
    (the size, the routes), so that a call adaptive selection sends to MPI
    costs the pass-through's price.  Not when the residency hint could
    apply (pool-sized messages on a pool with arenas: the buffers' place
    counts).  A call of a run timed on MPI passes too, and `passed` times
    it (`learning`)."""
    global _ndarray, learning
    learning = False
    set_run_routes(NULL)
    if _ndarray is None:
        numpy = sys.modules.get("numpy")
        if numpy is None:
            return False
        _ndarray = numpy.ndarray
    if type(obj) is not _ndarray:
        return False
    cdef Py_ssize_t nbytes = obj.nbytes * scale
    if nbytes < lo[which]:
        return True
    if not adaptive:
        return False
    state = comm_state(comm)
    if state is None:
        return False
    routes = state.routes
    if routes is None:
        return False
    cdef Routes r = <Routes>routes
    if nbytes >= r.zc_min and r.arena_hi:
        return False
    cdef int sc = size_class(nbytes)
    cdef int pl = r.where[which][sc]
    if r.choice[which][sc][pl] != 0 or r.ops_ptr[0] >= r.due[which][sc][pl]:
        return False
    if which == r.run_which and sc == r.run_sc and pl == r.run_pl:
        # a call of a timed run on MPI: it takes the path a settled class
        # takes (a run through `take` would count parsing MPI never pays
        # then), and `passed` times it
        learning = True
        set_run_routes(<PyObject *>r)
    return True


cdef inline double clock() noexcept:
    return now() if learning or time_all else 0.0


cdef int took(object state, int which, Py_ssize_t nbytes, int code, int zc,
              double t) except -1:
    """After a call that `take` routed: the placement the pool found (zc:
    1 zero-copy, 0 copied, -1 it followed a peer to MPI), and the time of
    a call of the run in flight (the next header step reports it)."""
    cdef Routes r
    if state is None:
        return 0
    r = state.routes
    if r is None:
        return 0
    if zc >= 0 and code > 0:
        r.where[which][size_class(nbytes)] = zc
    if learning and zc >= 0 and r.run_which >= 0:
        stat_learn[which] += 1
        if code > 0 and zc != r.run_pl:
            r.run_calls = -(1 << 40)   # it did not run as the run's class: no sample
        elif r.run_span:
            run_ended_call(r)
        else:
            r.run_seconds += now() - t
            r.run_calls += 1
    return 0


# ------------------------------------------------------------ collectives

include "shim/direct.pxi"
include "shim/run.pxi"
include "shim/bcast.pxi"
include "shim/reduce.pxi"
include "shim/gather.pxi"
include "shim/exchange.pxi"


class CommBase(_Intracomm):
    """The intercepted collectives of CXLComm (see cxlmpi.comm).

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
    Reduce_scatter_block = Reduce_scatter_block
    Reduce_scatter = Reduce_scatter


# Named as the methods they are, in reprs, help() and tracebacks.
for _name in METHODS:
    getattr(CommBase, _name).__qualname__ = f"CommBase.{_name}"
del _name

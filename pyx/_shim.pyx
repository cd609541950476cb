# cython: language_level=3
"""The compiled hot path of the wrapped communicator: message parsing, the
pool-or-pass-through decision, and the collective methods themselves.

Compiled so that a small message passing through costs a few hundred
nanoseconds over stock mpi4py; Python decides, one compiled call into
cxlmpi._pool runs the whole algorithm.

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


from cpython.buffer cimport (PyObject_CheckBuffer, PyObject_GetBuffer,
                             PyBuffer_Release, PyBUF_ANY_CONTIGUOUS,
                             PyBUF_WRITABLE, PyBUF_FORMAT)
from libc.stdint cimport uintptr_t

cdef extern from "<time.h>" nogil:
    ctypedef int clockid_t
    cdef struct timespec:
        long tv_sec
        long tv_nsec
    int clock_gettime(clockid_t clk, timespec *ts)
    clockid_t CLOCK_MONOTONIC

import sys

from mpi4py import MPI

from ._pool import OP_CODES, TYPE_CODES, PoolFailure, reducer_defined

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
cdef object _stock_barrier = MPI.Intracomm.Barrier
cdef object _stock_bcast = MPI.Intracomm.Bcast
cdef object _stock_reduce = MPI.Intracomm.Reduce
cdef object _stock_allreduce = MPI.Intracomm.Allreduce

# --------------------------------------------------------------- settings

cdef Py_ssize_t threshold = 4096
cdef Py_ssize_t bcast_threshold = 262144
cdef bint disabled = False
cdef bint configured = False
# Time passed-through calls too (CXLMPI_STATS=1); otherwise only pool calls
# are timed, which keeps two clock reads off the small-message path.
cdef bint time_all = False


def configure(cfg):
    """Take the settings the hot path needs (called by cxlmpi.config)."""
    global threshold, bcast_threshold, disabled, configured, time_all
    threshold = cfg.threshold
    bcast_threshold = max(cfg.threshold, cfg.bcast_threshold)
    disabled = cfg.disable
    time_all = cfg.stats
    configured = True


cdef inline int ensure_configured() except -1:
    # The settings are read on the first intercepted call, not at import,
    # so that a malformed variable is reported where it matters, once.
    if not configured:
        from . import config
        config.get()
    return 0


# ------------------------------------------------------------------ stats

COLLECTIVES = ("barrier", "bcast", "reduce", "allreduce")
DEF NCOLL = 4
DEF BARRIER = 0
DEF BCAST = 1
DEF REDUCE = 2
DEF ALLREDUCE = 3
cdef double stat_pool[NCOLL]
cdef double stat_pass[NCOLL]
cdef double stat_bytes[NCOLL]
cdef double stat_seconds[NCOLL]


cdef inline double now() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + 1e-9 * ts.tv_nsec


cdef inline double start() noexcept:
    return now() if time_all else 0.0


cdef inline void passed(int which, double t0) noexcept:
    stat_pass[which] += 1
    if time_all:
        stat_seconds[which] += now() - t0


cdef inline void pooled(int which, double nbytes, double t0) noexcept:
    stat_pool[which] += 1
    stat_bytes[which] += nbytes
    stat_seconds[which] += now() - t0


def stats_rows():
    """{name: (pool_calls, passthrough_calls, nbytes, seconds)} of every
    intercepted collective, called or not."""
    return {COLLECTIVES[i]: (int(stat_pool[i]), int(stat_pass[i]),
                             int(stat_bytes[i]), stat_seconds[i])
            for i in range(NCOLL)}


def stats_reset():
    """Zero every counter."""
    for i in range(NCOLL):
        stat_pool[i] = stat_pass[i] = stat_bytes[i] = stat_seconds[i] = 0


# ---------------------------------------------------------- type tables

# MPI datatype handle -> (type code, size); -1 = data movement only.
cdef dict TYPE_INFO = {}
# typecode string -> MPI datatype (mpi4py's own table)
cdef dict TYPE_DICT = dict(MPI._typedict)
# MPI op handle -> op code
cdef dict OPS = {getattr(MPI, name).handle: code for name, code in OP_CODES.items()}

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
        TYPE_INFO[dtype.handle] = (code, size)


_add_types(_SIGNED, "i")
_add_types(_UNSIGNED, "u")
_add_types(_FLOAT, "f")
_add_types(_COMPLEX, "c")
_add_types(_OPAQUE, None)
if MPI.C_BOOL.Get_size() == 1:
    TYPE_INFO[MPI.C_BOOL.handle] = (TYPE_CODES["bool"], 1)
TYPE_INFO[MPI.BYTE.handle] = (TYPE_CODES["byte"], 1)


cpdef object op_code(object op):
    """Kernel op code of a predefined MPI op, or None (user-defined ops,
    MINLOC/MAXLOC, REPLACE and NO_OP pass through)."""
    if not isinstance(op, _OP):
        return None
    return OPS.get(op.handle)


# --------------------------------------------------------------- messages

cdef class Message:
    """A parsed message; holds the buffer until `release()` (or deletion)."""
    cdef Py_buffer view
    cdef bint held
    cdef readonly uintptr_t address
    cdef readonly Py_ssize_t count
    cdef readonly Py_ssize_t itemsize
    cdef readonly int tcode
    cdef readonly object datatype

    def __dealloc__(self):
        if self.held:
            PyBuffer_Release(&self.view)

    def release(self):
        """Give the buffer back to its owner."""
        if self.held:
            PyBuffer_Release(&self.view)
            self.held = False

    @property
    def nbytes(self):
        """Bytes of the message (count x element size)."""
        return self.count * self.itemsize


cdef inline object lookup_type(object o_type):
    if isinstance(o_type, str):
        return TYPE_DICT.get(o_type)
    if isinstance(o_type, _DATATYPE):
        return o_type
    return None


cpdef Message parse(object msg, bint writable):
    """A `Message` for `msg`, or None when the pool cannot take it (an
    unsupported datatype, a GPU buffer, MPI.BOTTOM, or a message that stock
    mpi4py rejects)."""
    cdef object o_buf = None, o_count = None, o_displ = None, o_type = None
    cdef Py_ssize_t nargs
    if PyObject_CheckBuffer(msg):
        o_buf = msg
    elif isinstance(msg, (list, tuple)):
        nargs = len(msg)
        if nargs == 2:
            o_buf, o_count = msg
            if isinstance(o_count, (str, _DATATYPE)):
                o_count, o_type = None, o_count
            elif isinstance(o_count, (list, tuple)):
                if len(o_count) != 2:
                    return None
                o_count, o_displ = o_count
        elif nargs == 3:
            o_buf, o_count, o_type = msg
            if isinstance(o_count, (list, tuple)):
                if len(o_count) != 2:
                    return None
                o_count, o_displ = o_count
        elif nargs == 4:
            o_buf, o_count, o_displ, o_type = msg
        else:
            return None
    else:
        return None
    if o_buf is None or o_buf is _BOTTOM or not PyObject_CheckBuffer(o_buf):
        return None

    cdef Message m = Message.__new__(Message)
    cdef int flags = PyBUF_ANY_CONTIGUOUS | PyBUF_FORMAT
    if writable:
        flags |= PyBUF_WRITABLE
    try:
        PyObject_GetBuffer(o_buf, &m.view, flags)
    except Exception:
        return None
    m.held = True

    cdef object dtype
    if o_type is None:
        fmt = m.view.format.decode() if m.view.format != NULL else "B"
        if fmt == "B":
            dtype = _BYTE
        else:
            if fmt[:1] in ("<", "@", "="):
                fmt = fmt[1:]
            dtype = TYPE_DICT.get(fmt)
    else:
        dtype = lookup_type(o_type)
    if dtype is None:
        return None
    info = TYPE_INFO.get(dtype.handle)
    if info is None:
        return None
    m.datatype = dtype
    m.tcode, m.itemsize = info

    cdef Py_ssize_t length = m.view.len, offset = 0, count, displ
    try:
        if o_displ is not None:
            displ = o_displ.__index__()
            if displ < 0 or displ * m.itemsize > length:
                return None
            offset = displ * m.itemsize
            length -= offset
        if o_count is not None:
            count = o_count.__index__()
            if count < 0:
                return None
        else:
            if length % m.itemsize:
                return None
            count = length // m.itemsize
    except (TypeError, AttributeError, OverflowError):
        return None
    if count * m.itemsize > length:
        raise ValueError(
            f"message: count {count} of {dtype.Get_name()} needs "
            f"{count * m.itemsize} bytes but the buffer holds {length}")
    m.address = <uintptr_t>m.view.buf + offset
    m.count = count
    return m


cdef inline bint small(object obj, Py_ssize_t limit):
    # The commonest small message, a bare numpy array, decided without parsing.
    global _ndarray
    if _ndarray is None:
        numpy = sys.modules.get("numpy")
        if numpy is None:
            return False
        _ndarray = numpy.ndarray
    return type(obj) is _ndarray and obj.nbytes < limit


cdef inline bint overlap(Message a, Message b):
    return (a.address < b.address + b.count * b.itemsize and
            b.address < a.address + a.count * a.itemsize and
            a.count > 0 and b.count > 0)


# ----------------------------------------------------------------- state

# communicator handle -> state object (cxlmpi.comm._State), filled by
# cxlmpi.comm.state_for, emptied by the MPI attribute delete callback.
states = {}
cdef dict _states = states
cdef object _state_for = None
cdef object _fail = None


def bind(state_for, fail):
    """Install cxlmpi.comm's state set-up and failure reporting."""
    global _state_for, _fail
    _state_for = state_for
    _fail = fail


cdef inline object pool_of(object comm):
    """The pool of `comm`, set up collectively on first use; None when its
    ranks share no pool."""
    state = _states.get(comm.handle)
    if state is None:
        state = _state_for(comm)
    if state.error is not None:
        raise state.error
    return state.pool


cdef inline object run_failed(object comm, object exc):
    return _fail(comm, _states.get(comm.handle), exc)


cdef inline object plan_reduce(object sendbuf, object recvbuf, object op,
                               bint receiving):
    """(send, recv, op code) when the pool can take this reduction; `send`
    stands for the receive buffer when sendbuf is IN_PLACE."""
    cdef Message send, recv = None
    if disabled or small(recvbuf if receiving else sendbuf, threshold):
        return None
    opc = op_code(op)
    if opc is None:
        return None
    if receiving:
        recv = parse(recvbuf, True)
        if recv is None:
            return None
        if sendbuf is _IN_PLACE:
            send = recv
        else:
            send = parse(sendbuf, False)
            if (send is None or send.count != recv.count
                    or send.datatype.handle != recv.datatype.handle
                    or overlap(send, recv)):
                return None
    else:
        send = parse(sendbuf, False)
        if send is None:
            return None
    if send.count * send.itemsize < threshold or send.tcode < 0 \
            or not reducer_defined(opc, send.tcode):
        return None
    return send, recv, opc


# ------------------------------------------------------------ collectives

class CommBase(_Intracomm):
    """The intercepted collectives of CXLComm (see cxlmpi.comm)."""

    __slots__ = ()  # no instance dict: one lookup fewer per method call

    def Barrier(self):
        """Barrier synchronization (in the pool once the pool exists)."""
        ensure_configured()
        cdef double t0 = start()
        state = _states.get(self.handle)
        if disabled or state is None or state.pool is None:
            _stock_barrier(self)
            passed(BARRIER, t0)
            return
        t0 = now()
        try:
            state.pool.barrier()
        except PoolFailure as exc:
            raise run_failed(self, exc) from None
        pooled(BARRIER, 0, t0)

    def Bcast(self, buf, int root=0):
        """Broadcast data from one process to all other processes."""
        ensure_configured()
        cdef double t0 = start()
        cdef Message msg = None
        if not disabled and not small(buf, bcast_threshold) and 0 <= root < self.Get_size():
            msg = parse(buf, root != self.Get_rank())
            if msg is not None and msg.count * msg.itemsize < bcast_threshold:
                msg = None
        pool = pool_of(self) if msg is not None else None
        if pool is None:
            _stock_bcast(self, buf, root)
            passed(BCAST, t0)
            return
        if not time_all:
            t0 = now()
        try:
            pool.bcast(msg.address, msg.count * msg.itemsize, root)
        except PoolFailure as exc:
            raise run_failed(self, exc) from None
        pooled(BCAST, msg.count * msg.itemsize, t0)

    def Reduce(self, sendbuf, recvbuf, op=MPI.SUM, int root=0):
        """Reduce to root."""
        ensure_configured()
        cdef double t0 = start()
        cdef Message send, recv
        plan = None
        if 0 <= root < self.Get_size():
            plan = plan_reduce(sendbuf, recvbuf, op, root == self.Get_rank())
        pool = pool_of(self) if plan is not None else None
        if pool is None:
            _stock_reduce(self, sendbuf, recvbuf, op, root)
            passed(REDUCE, t0)
            return
        send, recv, opc = plan
        if not time_all:
            t0 = now()
        try:
            pool.reduce(send.address, recv.address if recv is not None else 0,
                        send.count, send.itemsize, opc, send.tcode, root)
        except PoolFailure as exc:
            raise run_failed(self, exc) from None
        pooled(REDUCE, send.count * send.itemsize, t0)

    def Allreduce(self, sendbuf, recvbuf, op=MPI.SUM):
        """Reduce to all."""
        ensure_configured()
        cdef double t0 = start()
        cdef Message send, recv
        plan = plan_reduce(sendbuf, recvbuf, op, True)
        pool = pool_of(self) if plan is not None else None
        if pool is None:
            _stock_allreduce(self, sendbuf, recvbuf, op)
            passed(ALLREDUCE, t0)
            return
        send, recv, opc = plan
        if not time_all:
            t0 = now()
        try:
            pool.reduce(send.address, recv.address, send.count, send.itemsize,
                        opc, send.tcode, -1)
        except PoolFailure as exc:
            raise run_failed(self, exc) from None
        pooled(ALLREDUCE, send.count * send.itemsize, t0)

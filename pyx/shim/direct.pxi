# The calls that pass through, made straight to the MPI library
# (pyx/cxl_mpi.h) where the message is one mpi4py reads without surprises:
# a bare contiguous buffer of a predefined type (IN_PLACE where a reduction
# allows it).  mpi4py would parse that message again and call the same
# function with the same arguments; everything else -- the list forms,
# v-collectives, user-defined ops, a buffer mpi4py would refuse -- goes to
# mpi4py's method, which reports the errors as stock does.  Each `pass_*`
# function is the whole pass-through of one collective.
# (part of cxlmpi._shim: included by pyx/_shim.pyx)

from libc.string cimport strcmp, strcpy, strlen

cdef extern from "cxl_mpi.h" nogil:
    ctypedef Py_ssize_t cxl_h
    enum:
        CXL_MPI_REDUCE, CXL_MPI_ALLREDUCE, CXL_MPI_SCAN, CXL_MPI_EXSCAN,
        CXL_MPI_ALLGATHER, CXL_MPI_GATHER, CXL_MPI_SCATTER, CXL_MPI_ALLTOALL
    int cxl_mpi_resolve(const char *module, int handle_bytes)
    cxl_h cxl_mpi_read(const void *where)
    int cxl_mpi_barrier(cxl_h c)
    int cxl_mpi_bcast(void *b, int n, cxl_h t, int root, cxl_h c)
    int cxl_mpi_reduce(int which, const void *s, void *r, int n, cxl_h t, cxl_h op, int root,
                       cxl_h c)
    int cxl_mpi_reduce_scatter_block(const void *s, void *r, int n, cxl_h t, cxl_h op, cxl_h c)
    int cxl_mpi_move(int which, const void *s, int sn, cxl_h st, void *r, int rn, cxl_h rt,
                     int root, cxl_h c)

cdef extern from "<limits.h>":
    int INT_MAX


def _straight_library():
    """Whether the library's collectives were found where mpi4py's calls
    resolve (see pyx/cxl_mpi.h)."""
    path = getattr(MPI, "__file__", None)
    hb = MPI._sizeof(MPI.Comm)
    if not path or MPI._sizeof(MPI.Datatype) != hb or MPI._sizeof(MPI.Op) != hb:
        return False
    return bool(cxl_mpi_resolve(path.encode(), hb))


found = _straight_library()
straight = found and configured and not disabled   # (configure sets it anew)
cdef void *IN_PLACE_P = <void *><Py_ssize_t>int(MPI.IN_PLACE)
cdef cxl_h COMM_NULL_H = MPI.COMM_NULL.handle
cdef cxl_h BYTE_H = MPI.BYTE.handle
cdef double n_straight = 0      # calls made straight to the library (tests)


def straight_calls():
    """(whether pass-through calls go straight to the MPI library, how many
    did so far)."""
    return straight, int(n_straight)


# Buffer format -> (datatype handle, size), as get_buffer reads a format;
# size 0: not a type the straight path takes.  A few formats ever occur.
DEF NFMT = 16
cdef struct fmt_entry:
    char fmt[8]
    cxl_h handle
    Py_ssize_t size
cdef fmt_entry fmts[NFMT]
cdef int nfmts = 0
cdef const char *BYTE_FORMAT = "B"   # a buffer without a format holds bytes


cdef fmt_entry *format_entry(const char *fmt):
    global nfmts
    cdef int i
    for i in range(nfmts):
        if strcmp(fmts[i].fmt, fmt) == 0:
            return &fmts[i]
    if strlen(fmt) >= 8 or nfmts == NFMT:
        return NULL
    dtype = format_type(fmt.decode())
    info = TYPE_INFO.get(dtype.handle) if dtype is not None else None
    cdef fmt_entry *e = &fmts[nfmts]
    strcpy(e.fmt, fmt)
    e.handle = dtype.handle if info is not None else 0
    e.size = info[1] if info is not None else 0
    nfmts += 1
    return e


cdef struct Buf:
    Py_buffer view
    cxl_h type
    Py_ssize_t count      # of one block


cdef int hold(object obj, bint writable, Py_ssize_t blocks, Buf *b) except -1:
    """1: `obj` is a bare contiguous buffer of a predefined type, held in
    `b` with its count (per block, of `blocks`); 0: it is not, nothing held."""
    if not PyObject_CheckBuffer(obj):
        return 0
    cdef int flags = PyBUF_ANY_CONTIGUOUS | PyBUF_FORMAT
    if writable:
        flags |= PyBUF_WRITABLE
    try:
        PyObject_GetBuffer(obj, &b.view, flags)
    except Exception:   # (mpi4py's method raises it again, as stock)
        return 0
    cdef fmt_entry *e = format_entry(b.view.format if b.view.format != NULL else BYTE_FORMAT)
    cdef Py_ssize_t n
    if e != NULL and e.size > 0 and b.view.len % e.size == 0:
        n = b.view.len // e.size
        if n % blocks == 0 and n // blocks <= INT_MAX:
            b.type = e.handle
            b.count = n // blocks
            return 1
    PyBuffer_Release(&b.view)
    return 0


cdef inline cxl_h comm_handle(object comm) except? -1:
    """The communicator's handle now, read where mpi4py keeps it (a freed
    one is COMM_NULL there); 0 for COMM_NULL: mpi4py reports that."""
    sized(comm)
    cdef cxl_h c = cxl_mpi_read(_sized_where)
    return 0 if c == COMM_NULL_H else c


cdef inline int checked(int ierr) except -1:
    global n_straight
    if ierr != 0:
        raise MPI.Exception(ierr)
    n_straight += 1
    return 0


cdef object _op_obj = None
cdef cxl_h _op_h = 0


cdef inline cxl_h op_handle(object op) except? -1:
    """A predefined op's handle (0: not one)."""
    global _op_obj, _op_h
    if op is not _op_obj:
        if op_code(op) is None:
            return 0
        _op_obj, _op_h = op, op.handle
    return _op_h


cdef int pass_barrier(object comm) except -1:
    cdef cxl_h c = comm_handle(comm) if straight else 0
    cdef int ierr
    if c == 0:
        _stock_barrier(comm)
        return 0
    with nogil:
        ierr = cxl_mpi_barrier(c)
    return checked(ierr)


cdef int pass_bcast(object comm, object buf, int root) except -1:
    cdef cxl_h c = comm_handle(comm) if straight else 0
    cdef Buf b
    cdef int ierr
    if c == 0 or not 0 <= root < comm_size(comm) or \
            not hold(buf, root != comm_rank(comm), 1, &b):
        _stock_bcast(comm, buf, root)
        return 0
    with nogil:
        ierr = cxl_mpi_bcast(b.view.buf, <int>b.count, b.type, root, c)
    PyBuffer_Release(&b.view)
    return checked(ierr)


cdef int pass_reduce(object comm, int which, object sendbuf, object recvbuf, object op,
                     int root) except -1:
    """Reduce (root >= 0), Allreduce, Scan, Exscan (`which`: a CXL_MPI_*)."""
    cdef cxl_h c = comm_handle(comm) if straight else 0
    cdef cxl_h oph = op_handle(op) if c != 0 else 0
    cdef Buf s, r
    cdef bint rooted = which == CXL_MPI_REDUCE
    cdef bint receiving = not rooted or root == comm_rank(comm)
    cdef bint in_place = sendbuf is _IN_PLACE
    cdef int ierr, ok = 0
    if oph != 0 and (not rooted or 0 <= root < comm_size(comm)) and \
            (receiving or not in_place):
        if not receiving:
            ok = hold(sendbuf, False, 1, &s)
        elif hold(recvbuf, True, 1, &r):
            if in_place:
                ok = 1
            elif hold(sendbuf, False, 1, &s):
                ok = s.type == r.type and s.count == r.count
                if not ok:
                    PyBuffer_Release(&s.view)
            if not ok:
                PyBuffer_Release(&r.view)
    if not ok:
        if which == CXL_MPI_REDUCE:
            _stock_reduce(comm, sendbuf, recvbuf, op, root)
        elif which == CXL_MPI_ALLREDUCE:
            _stock_allreduce(comm, sendbuf, recvbuf, op)
        elif which == CXL_MPI_SCAN:
            _stock_scan(comm, sendbuf, recvbuf, op)
        else:
            _stock_exscan(comm, sendbuf, recvbuf, op)
        return 0
    cdef const void *sp = IN_PLACE_P if in_place else s.view.buf
    cdef void *rp = r.view.buf if receiving else NULL
    cdef Py_ssize_t n = r.count if receiving else s.count
    cdef cxl_h t = r.type if receiving else s.type
    with nogil:
        ierr = cxl_mpi_reduce(which, sp, rp, <int>n, t, oph, root, c)
    if not in_place:
        PyBuffer_Release(&s.view)
    if receiving:
        PyBuffer_Release(&r.view)
    return checked(ierr)


cdef int pass_reduce_scatter_block(object comm, object sendbuf, object recvbuf,
                                   object op) except -1:
    cdef cxl_h c = comm_handle(comm) if straight else 0
    cdef cxl_h oph = op_handle(op) if c != 0 else 0
    cdef Buf s, r
    cdef int ierr, ok = 0
    cdef int size = comm_size(comm)
    if oph != 0 and sendbuf is not _IN_PLACE and hold(recvbuf, True, 1, &r):
        if hold(sendbuf, False, size, &s):
            ok = s.type == r.type and s.count == r.count
            if not ok:
                PyBuffer_Release(&s.view)
        if not ok:
            PyBuffer_Release(&r.view)
    if not ok:
        _stock_reduce_scatter_block(comm, sendbuf, recvbuf, op)
        return 0
    with nogil:
        ierr = cxl_mpi_reduce_scatter_block(s.view.buf, r.view.buf, <int>r.count, r.type, oph, c)
    PyBuffer_Release(&s.view)
    PyBuffer_Release(&r.view)
    return checked(ierr)


cdef int pass_move(object comm, int which, object sendbuf, object recvbuf, int root) except -1:
    """Allgather and Alltoall (root < 0), Gather and Scatter (`which`)."""
    cdef cxl_h c = comm_handle(comm) if straight else 0
    cdef Buf s, r
    cdef int size = comm_size(comm), ierr, ok = 0
    cdef bint rooted = which == CXL_MPI_GATHER or which == CXL_MPI_SCATTER
    cdef bint at_root = rooted and root == comm_rank(comm)
    # the buffers MPI reads here (a non-root's Gather receive and Scatter
    # send buffers are not: NULL, as mpi4py passes)
    cdef bint sending = which != CXL_MPI_SCATTER or at_root
    cdef bint receiving = which != CXL_MPI_GATHER or at_root
    cdef Py_ssize_t sblocks = size if which in (CXL_MPI_ALLTOALL, CXL_MPI_SCATTER) else 1
    cdef Py_ssize_t rblocks = size if which != CXL_MPI_SCATTER else 1
    if c != 0 and (not rooted or 0 <= root < size) and \
            sendbuf is not _IN_PLACE and recvbuf is not _IN_PLACE:
        ok = not sending or hold(sendbuf, False, sblocks, &s)
        if ok and receiving:
            ok = hold(recvbuf, True, rblocks, &r)
            if not ok and sending:
                PyBuffer_Release(&s.view)
    if not ok:
        if which == CXL_MPI_ALLGATHER:
            _stock_allgather(comm, sendbuf, recvbuf)
        elif which == CXL_MPI_ALLTOALL:
            _stock_alltoall(comm, sendbuf, recvbuf)
        elif which == CXL_MPI_GATHER:
            _stock_gather(comm, sendbuf, recvbuf, root)
        else:
            _stock_scatter(comm, sendbuf, recvbuf, root)
        return 0
    cdef const void *sp = s.view.buf if sending else NULL
    cdef void *rp = r.view.buf if receiving else NULL
    cdef Py_ssize_t sn = s.count if sending else 0, rn = r.count if receiving else 0
    cdef cxl_h st = s.type if sending else BYTE_H, rt = r.type if receiving else BYTE_H
    with nogil:
        ierr = cxl_mpi_move(which, sp, <int>sn, st, rp, <int>rn, rt, root if rooted else -1, c)
    if sending:
        PyBuffer_Release(&s.view)
    if receiving:
        PyBuffer_Release(&r.view)
    return checked(ierr)

# The calls that pass through, made straight to the MPI library
# (pyx/cxl_mpi.h) where the shim has read the message as mpi4py reads it: a
# message the method parsed (`message`: every form mpi4py takes, with a
# predefined type; a vector message, `vector`), or, where it parsed
# none (a small numpy array that `skip` let by), a bare contiguous buffer of
# a predefined type; IN_PLACE where a reduction or Allgatherv allows it.
# mpi4py would parse it again and call the same function with the same
# arguments.  Everything else -- user-defined ops, counts beyond a C int, a
# buffer mpi4py would refuse -- goes to mpi4py's method, which reports the
# errors as stock does.  Each `pass_*` function
# is the whole pass-through of one collective.
# (part of cxlmpi._shim: included by pyx/_shim.pyx)


cdef extern from "cxl_mpi.h" nogil:
    ctypedef Py_ssize_t cxl_h
    enum:
        CXL_MPI_REDUCE, CXL_MPI_ALLREDUCE, CXL_MPI_SCAN, CXL_MPI_EXSCAN,
        CXL_MPI_ALLGATHER, CXL_MPI_GATHER, CXL_MPI_SCATTER, CXL_MPI_ALLTOALL,
        CXL_MPI_ALLGATHERV, CXL_MPI_GATHERV, CXL_MPI_SCATTERV, CXL_MPI_ALLTOALLV
    int cxl_mpi_resolve(const char *module, int handle_bytes)
    cxl_h cxl_mpi_read(const void *where)
    int cxl_mpi_barrier(cxl_h c)
    ctypedef struct cxl_pause:
        uint64_t polls
        double first_s
        long sleep_ns
    int cxl_mpi_pause(cxl_pause *p, double timeout_s)
    int cxl_mpi_order(cxl_h c, double timeout_s, int *ierr)
    int cxl_mpi_bcast(void *b, int n, cxl_h t, int root, cxl_h c)
    int cxl_mpi_reduce(int which, const void *s, void *r, int n, cxl_h t, cxl_h op, int root,
                       cxl_h c)
    int cxl_mpi_reduce_scatter_block(const void *s, void *r, int n, cxl_h t, cxl_h op, cxl_h c)
    int cxl_mpi_move(int which, const void *s, int sn, cxl_h st, void *r, int rn, cxl_h rt,
                     int root, cxl_h c)
    ctypedef struct cxl_vec:
        void *buf
        const Py_ssize_t *counts
        const Py_ssize_t *displs
        const int *icounts
        const int *idispls
        cxl_h type
    int cxl_mpi_large
    int cxl_mpi_resolve_large(const char *module, int count_bytes, int aint_bytes)
    int cxl_mpi_allgatherv(const void *s, Py_ssize_t sn, cxl_h st, const cxl_vec *r, cxl_h c)
    int cxl_mpi_gatherv(const void *s, Py_ssize_t sn, cxl_h st, const cxl_vec *r, int root,
                        cxl_h c)
    int cxl_mpi_scatterv(const cxl_vec *s, void *r, Py_ssize_t rn, cxl_h rt, int root, cxl_h c)
    int cxl_mpi_alltoallv(const cxl_vec *s, const cxl_vec *r, cxl_h c)
    int cxl_mpi_reduce_scatter(const void *s, const cxl_vec *r, cxl_h op, cxl_h c)


def _straight_library():
    """Whether the library's collectives were found where mpi4py's calls
    resolve (see pyx/cxl_mpi.h)."""
    path = getattr(MPI, "__file__", None)
    hb = MPI._sizeof(MPI.Comm)
    if not path or MPI._sizeof(MPI.Datatype) != hb or MPI._sizeof(MPI.Op) != hb:
        return False
    if not cxl_mpi_resolve(path.encode(), hb):
        return False
    cxl_mpi_resolve_large(path.encode(), MPI.COUNT.Get_size(), MPI.AINT.Get_size())
    return True


found = _straight_library()
straight = found and configured and not disabled   # (configure sets it anew)


def _without_library():
    """For tests: behave as where the library's functions were not found
    (pass-through calls through mpi4py, `order` through mpi4py's
    Ibarrier).  Call it on every rank before any collective."""
    global found, straight
    found = straight = False


cdef void *IN_PLACE_P = <void *><Py_ssize_t>int(MPI.IN_PLACE)
cdef cxl_h COMM_NULL_H = MPI.COMM_NULL.handle
cdef cxl_h BYTE_H = MPI.BYTE.handle
cdef double n_straight = 0      # calls made straight to the library (tests)


def straight_calls():
    """(whether pass-through calls go straight to the MPI library, how many
    did so far)."""
    return straight, int(n_straight)


cdef struct Buf:
    void *buf
    Py_ssize_t count      # of one block
    cxl_h type
    bint held             # `view` is held (else a Message holds the buffer)
    Py_buffer view


cdef int hold(object obj, bint writable, Py_ssize_t blocks, Buf *b) except -1:
    """1: `obj` is a bare contiguous buffer of a predefined type, held in
    `b` with its count (per block, of `blocks`); 0: it is not, nothing held."""
    b.held = False
    if not PyObject_CheckBuffer(obj):
        return 0
    cdef int flags = PyBUF_ANY_CONTIGUOUS | PyBUF_FORMAT
    if writable:
        flags |= PyBUF_WRITABLE
    try:
        PyObject_GetBuffer(obj, &b.view, flags)
    except Exception:   # (mpi4py's method raises it again, as stock)
        return 0
    cdef fmt_entry *e = format_entry(<const char *>b.view.format if b.view.format != NULL
                                     else BYTE_FORMAT)
    cdef Py_ssize_t n
    if e != NULL and e.size > 0 and b.view.len % e.size == 0:
        n = b.view.len // e.size
        if n % blocks == 0 and n // blocks <= INT_MAX:
            b.buf = b.view.buf
            b.type = e.handle
            b.count = n // blocks
            b.held = True
            return 1
    PyBuffer_Release(&b.view)
    return 0


cdef inline bint take_fits(Message m) noexcept:
    """Whether `take_message` takes `m`."""
    return direct(m) and m.count <= INT_MAX


cdef inline int take_message(Message m, Buf *b) noexcept:
    """1: `b` is the parsed message `m` (its buffer held by `m`); 0: none."""
    b.held = False
    if not take_fits(m):
        return 0
    b.buf = <void *>m.address
    b.count = m.count
    b.type = m.handle
    return 1


cdef inline int get(object obj, Message m, bint parsed, bint writable, Py_ssize_t blocks,
                    Buf *b) except -1:
    """The message of `obj` for a straight call: the parsed `m` where the
    method parsed (`parsed`), else a bare buffer held now."""
    return take_message(m, b) if parsed else hold(obj, writable, blocks, b)


cdef inline void release(Buf *b) noexcept:
    if b.held:
        PyBuffer_Release(&b.view)
        b.held = False


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


cdef inline cxl_h op_handle(object op) except? -1:
    """A predefined op's handle (0: not one)."""
    info = op_info(op)
    return 0 if info is None else info[1]


cdef int stock_guard(Message a, Message b=None, Message c=None) except -1:
    """Before a pass_*'s stock fallback, which hands MPI the user's buffers:
    a parsed message on a scratch copy (refused: its counts run past its
    buffer, refusals.pxi) raises its refusal instead, on this rank alone
    (its peers may then wait in MPI), since stock MPI would read or write
    past the buffer.  The callers send such a message here only where the
    straight call takes it; this is the net under them."""
    if (a is None or a.scratch is None) and (b is None or b.scratch is None) and \
            (c is None or c.scratch is None):
        return 0
    err = take_refusal()
    if err is None:
        from .errors import CXLMPIMessageError

        err = CXLMPIMessageError("cxlmpi: a message runs past its buffer, and MPI could "
                                 "run the call here only on the buffer itself")
    raise err


cdef int pass_barrier(object comm) except -1:
    cdef cxl_h c = comm_handle(comm) if straight else 0
    cdef int ierr
    if c == 0:
        _stock_barrier(comm)
        return 0
    with nogil:
        ierr = cxl_mpi_barrier(c)
    return checked(ierr)


cdef int pass_bcast(object comm, object buf, int root, Message m=None,
                    bint parsed=False) except -1:
    cdef cxl_h c = comm_handle(comm) if straight else 0
    cdef Buf b
    cdef int ierr
    if c == 0 or not 0 <= root < comm_size(comm) or \
            not get(buf, m, parsed, root != comm_rank(comm), 1, &b):
        stock_guard(m)
        _stock_bcast(comm, buf, root)
        return 0
    with nogil:
        ierr = cxl_mpi_bcast(b.buf, <int>b.count, b.type, root, c)
    release(&b)
    return checked(ierr)


cdef int pass_reduce(object comm, int which, object sendbuf, object recvbuf, object op,
                     int root, object plan=None) except -1:
    """Reduce (root >= 0), Allreduce, Scan, Exscan (`which`: a CXL_MPI_*);
    `plan`: plan_reduce's, where it parsed the messages."""
    cdef cxl_h c = comm_handle(comm) if straight else 0
    cdef cxl_h oph = op_handle(op) if c != 0 else 0
    cdef Buf s, r
    cdef bint rooted = which == CXL_MPI_REDUCE
    cdef bint receiving = not rooted or root == comm_rank(comm)
    cdef bint in_place = sendbuf is _IN_PLACE
    cdef bint parsed = plan is not None
    cdef Message ps = plan[0] if parsed else None, pr = plan[1] if parsed else None
    cdef int ierr, ok = 0
    if oph != 0 and (not rooted or 0 <= root < comm_size(comm)) and \
            (receiving or not in_place):
        if not receiving:
            ok = get(sendbuf, ps, parsed, False, 1, &s)
        elif get(recvbuf, pr, parsed, True, 1, &r):
            if in_place:
                ok = 1
            elif get(sendbuf, ps, parsed, False, 1, &s):
                # (a plan checked these, and that the buffers do not overlap)
                ok = s.type == r.type and s.count == r.count
                if not ok:
                    release(&s)
            if not ok:
                release(&r)
    if not ok:
        stock_guard(ps, pr)
        if which == CXL_MPI_REDUCE:
            _stock_reduce(comm, sendbuf, recvbuf, op, root)
        elif which == CXL_MPI_ALLREDUCE:
            _stock_allreduce(comm, sendbuf, recvbuf, op)
        elif which == CXL_MPI_SCAN:
            _stock_scan(comm, sendbuf, recvbuf, op)
        else:
            _stock_exscan(comm, sendbuf, recvbuf, op)
        return 0
    cdef const void *sp = IN_PLACE_P if in_place else s.buf
    cdef void *rp = r.buf if receiving else NULL
    cdef Py_ssize_t n = r.count if receiving else s.count
    cdef cxl_h t = r.type if receiving else s.type
    with nogil:
        ierr = cxl_mpi_reduce(which, sp, rp, <int>n, t, oph, root, c)
    if not in_place:
        release(&s)
    if receiving:
        release(&r)
    return checked(ierr)


cdef int pass_reduce_scatter_block(object comm, object sendbuf, object recvbuf, object op,
                                   Message ps=None, Message pr=None,
                                   bint parsed=False) except -1:
    cdef cxl_h c = comm_handle(comm) if straight else 0
    cdef cxl_h oph = op_handle(op) if c != 0 else 0
    cdef Buf s, r
    cdef int ierr, ok = 0
    cdef int size = comm_size(comm)
    if oph != 0 and sendbuf is not _IN_PLACE and get(recvbuf, pr, parsed, True, 1, &r):
        if get(sendbuf, ps, parsed, False, size, &s):
            ok = s.type == r.type and s.count == r.count
            if not ok:
                release(&s)
        if not ok:
            release(&r)
    if not ok:
        stock_guard(ps, pr)
        _stock_reduce_scatter_block(comm, sendbuf, recvbuf, op)
        return 0
    with nogil:
        ierr = cxl_mpi_reduce_scatter_block(s.buf, r.buf, <int>r.count, r.type, oph, c)
    release(&s)
    release(&r)
    return checked(ierr)


cdef int pass_move(object comm, int which, object sendbuf, object recvbuf, int root,
                   Message ps=None, Message pr=None, bint parsed=False) except -1:
    """Allgather and Alltoall (root < 0), Gather and Scatter (`which`);
    `ps`, `pr`: the messages the method parsed (`parsed`), those MPI reads
    on this rank."""
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
        ok = not sending or get(sendbuf, ps, parsed, False, sblocks, &s)
        if ok and receiving:
            ok = get(recvbuf, pr, parsed, True, rblocks, &r)
            if not ok and sending:
                release(&s)
    if not ok:
        stock_guard(ps, pr)
        if which == CXL_MPI_ALLGATHER:
            _stock_allgather(comm, sendbuf, recvbuf)
        elif which == CXL_MPI_ALLTOALL:
            _stock_alltoall(comm, sendbuf, recvbuf)
        elif which == CXL_MPI_GATHER:
            _stock_gather(comm, sendbuf, recvbuf, root)
        else:
            _stock_scatter(comm, sendbuf, recvbuf, root)
        return 0
    cdef const void *sp = s.buf if sending else NULL
    cdef void *rp = r.buf if receiving else NULL
    cdef Py_ssize_t sn = s.count if sending else 0, rn = r.count if receiving else 0
    cdef cxl_h st = s.type if sending else BYTE_H, rt = r.type if receiving else BYTE_H
    with nogil:
        ierr = cxl_mpi_move(which, sp, <int>sn, st, rp, <int>rn, rt, root if rooted else -1, c)
    if sending:
        release(&s)
    if receiving:
        release(&r)
    return checked(ierr)


cdef inline bint vector_fits(Vector v) noexcept:
    """Whether the library's functions take `v`'s counts: the large-count
    ones take any, the classic ones C ints."""
    return v is not None and (v.m is None or v.m.staged is None) and \
        (cxl_mpi_large or v.ints)


cdef inline bint count_fits(Message m) noexcept:
    return direct(m) and (cxl_mpi_large or m.count <= INT_MAX)


cdef inline void as_vec(Vector v, void *buf, cxl_h t, cxl_vec *out) noexcept:
    out.buf = buf
    out.counts, out.displs = v.counts, v.displs
    out.icounts, out.idispls = v.icounts, v.idispls
    out.type = t


cdef int pass_vector(object comm, int which, object sendbuf, object recvbuf, int root,
                     Message own, Vector vec, Vector rvec=None) except -1:
    """Allgatherv and Gatherv (`own`: the message sent, None with IN_PLACE;
    `vec`: the receive vector, read at Gatherv's root only), Scatterv
    (`vec`: the send vector, read at the root; `own`: the message received)
    and Alltoallv (`vec` sent, `rvec` received), as the methods parsed them
    (None: they did not)."""
    cdef cxl_h c = comm_handle(comm) if straight else 0
    cdef int size = comm_size(comm), ierr
    cdef bint rooted = which == CXL_MPI_GATHERV or which == CXL_MPI_SCATTERV
    cdef bint here = not rooted or root == comm_rank(comm)   # the vector is read here
    cdef bint in_place = (recvbuf if which == CXL_MPI_SCATTERV else sendbuf) is _IN_PLACE
    cdef bint ok = c != 0 and (not rooted or 0 <= root < size) and \
        (not here or vector_fits(vec))
    if which == CXL_MPI_ALLTOALLV:
        ok = ok and not in_place and vector_fits(rvec)
    elif in_place:
        ok = ok and here
    else:
        ok = ok and count_fits(own)
    if not ok:
        stock_guard(own, vec.m if vec is not None else None,
                    rvec.m if rvec is not None else None)
        if which == CXL_MPI_ALLGATHERV:
            _stock_allgatherv(comm, sendbuf, recvbuf)
        elif which == CXL_MPI_GATHERV:
            _stock_gatherv(comm, sendbuf, recvbuf, root)
        elif which == CXL_MPI_SCATTERV:
            _stock_scatterv(comm, sendbuf, recvbuf, root)
        else:
            _stock_alltoallv(comm, sendbuf, recvbuf)
        return 0
    # the vector (NULL where it is not read, as mpi4py passes) ...
    cdef cxl_vec v, r
    memset(&v, 0, sizeof(v))
    v.type = BYTE_H
    if here:
        as_vec(vec, <void *>vec.m.address, vec.m.handle, &v)
    if rvec is not None:
        as_vec(rvec, <void *>rvec.m.address, rvec.m.handle, &r)
    # ... and the single message (IN_PLACE at the root)
    cdef void *op = IN_PLACE_P if in_place else (<void *>own.address if own is not None
                                                 else NULL)
    cdef Py_ssize_t on = 0 if in_place or own is None else own.count
    cdef cxl_h ot = BYTE_H if in_place or own is None else own.handle
    with nogil:
        if which == CXL_MPI_ALLGATHERV:
            ierr = cxl_mpi_allgatherv(op, on, ot, &v, c)
        elif which == CXL_MPI_GATHERV:
            ierr = cxl_mpi_gatherv(op, on, ot, &v, root, c)
        elif which == CXL_MPI_SCATTERV:
            ierr = cxl_mpi_scatterv(&v, op, on, ot, root, c)
        else:
            ierr = cxl_mpi_alltoallv(&v, &r, c)
    return checked(ierr)


cdef int pass_reduce_scatter(object comm, object sendbuf, object recvbuf, object recvcounts,
                             object op, Message send, Message recv, Vector counts) except -1:
    """Reduce_scatter (`send` None with IN_PLACE); `counts`: recvcounts as
    a Vector of the receive buffer, None where the method read none."""
    cdef cxl_h c = comm_handle(comm) if straight else 0
    cdef cxl_h oph = op_handle(op) if c != 0 else 0
    cdef bint in_place = sendbuf is _IN_PLACE
    cdef int ierr
    if oph == 0 or not direct(recv) or not vector_fits(counts) or \
            (not in_place and not direct(send)):
        stock_guard(send, recv)
        _stock_reduce_scatter(comm, sendbuf, recvbuf, recvcounts, op)
        return 0
    cdef const void *sp = IN_PLACE_P if in_place else <void *>send.address
    cdef cxl_vec r
    as_vec(counts, <void *>recv.address, recv.handle, &r)
    with nogil:
        ierr = cxl_mpi_reduce_scatter(sp, &r, oph, c)
    return checked(ierr)

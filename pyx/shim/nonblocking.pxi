# Nonblocking and persistent collectives, as CXLComm intercepts them: each
# I-method (Iallreduce, ...) and each *_init method plans the call from
# what every rank holds alike -- the message sizes, the op and type, the
# root, the communicator's settled routes, never a timing or a count of
# calls -- and either passes it to stock MPI or posts it to the pool's
# worker (pyx/pool/worker.pxi) behind a generalized request, a real
# MPI.Request (cxlmpi.communicator.requests).  The worker runs the same
# algorithms as the blocking calls, in the order the calls were posted, and
# completes the request; a blocking call on the communicator lets it
# finish first (`settle_posted`, from `enter`).
#
# What goes to MPI, always: every form whose sizes only some ranks know
# (Igather(v), Iscatter(v), Iallgatherv, Ialltoallv, Ireduce_scatter), pools
# across hosts, and every call where MPI was not started with
# MPI_THREAD_MULTIPLE (the worker completes requests from its own thread).
# A message the pool cannot read in place (a derived datatype, a device
# array) is staged as for a blocking call: copied in when the call is
# posted, out when its request completes (its query, which runs with the
# GIL) -- never sent to MPI on its own, which its peers would not follow.
# (part of cxlmpi._shim: included by pyx/_shim.pyx)


cdef extern from "cxl_mpi.h" nogil:
    int cxl_mpi_resolve_greq(const char *module)
    void cxl_mpi_complete(Py_ssize_t request)
    int cxl_mpi_order(cxl_h c, double timeout_s, int *ierr)


# Per collective: calls posted to the pool, passed to MPI, their bytes, and
# the seconds their Wait (CXLMPI's own request method) waited.
cdef double nb_pool[NCOLL]
cdef double nb_pass[NCOLL]
cdef double nb_bytes[NCOLL]
cdef double nb_waited[NCOLL]

# Posted calls whose end this process has not seen yet: the records of
# cxlmpi.communicator.requests (each holds its messages' buffers).
cdef list _live = []
cdef object _start_request = None    # requests.start(comm, plan): the request
cdef object _persistent = None       # requests.persistent(comm, plan): the request
# CXLMPI_NONBLOCKING, MPI_THREAD_MULTIPLE, and MPI_Grequest_complete found
cdef bint nb_on = False
cdef Py_ssize_t nb_floor = 0     # CXLMPI_NONBLOCKING_THRESHOLD
# Ialltoall takes the pool only under CXLMPI_TUNING=pool: run by the worker
# it was slower than stock's at most sizes (2 ranks, 2-core VM, bench
# --overlap: 0.62-1.01x with private buffers, 0.68-1.35x with pool ones),
# while the blocking Alltoall's own selection keeps MPI where MPI wins.
cdef bint nb_alltoall = False


cdef void nb_complete(uintptr_t request, uintptr_t order, int *rc) noexcept nogil:
    """The worker's completion of a posted call that ran (`*rc`: OK, or
    the pool's error code): the MPI barrier that ends a pool collective
    (CXLMPI_ORDERING; `order`: the private communicator, 0: none) -- late
    or failed, the call fails as a timeout (the peer that did not come
    raised, or stands still), as a blocking call's `order` does -- then
    MPI_Grequest_complete."""
    cdef int ierr = 0
    if order and rc[0] == 0:
        if cxl_mpi_order(<cxl_h>order, order_timeout_s, &ierr) or ierr:
            rc[0] = -1   # (ERR_TIMEOUT of pyx/pool/layout.pxi)
    cxl_mpi_complete(<Py_ssize_t>request)


def bind_requests(start, persistent):
    """Install cxlmpi.communicator.requests' request makers."""
    global _start_request, _persistent
    _start_request, _persistent = start, persistent


def configure_nonblocking(bint on, Py_ssize_t threshold, bint everything=False):
    """(cxlmpi.config) CXLMPI_NONBLOCKING, where this MPI can host it, and
    CXLMPI_NONBLOCKING_THRESHOLD; `everything` (CXLMPI_TUNING=pool): every
    posted form the pool serves takes it, Ialltoall too."""
    global nb_on, nb_floor, nb_alltoall
    nb_floor = threshold
    nb_alltoall = everything
    path = getattr(MPI, "__file__", None)
    nb_on = (on and found and path is not None and MPI.Is_initialized()
             and MPI.Query_thread() == MPI.THREAD_MULTIPLE
             and cxl_mpi_resolve_greq(path.encode()))


cdef class Plan:
    """A nonblocking call the pool takes: the state, the collective, its
    bytes, and how to post it (`post(*args, flags=flags)`, a
    Pool.post_<family>); `keep` holds its messages' buffers."""
    cdef readonly object state, post, args, keep
    cdef readonly int which, flags       # flags: the variant of the path (V_*)
    cdef tuple fills, drains             # staged messages: copied in at post, out at the end
    cdef readonly Py_ssize_t nbytes


cdef Plan planned(object comm, int which, Py_ssize_t nbytes, str method, tuple args,
                  tuple fills, tuple drains):
    """The Plan of a call of `nbytes` that the pool could take, or None
    (MPI): the communicator's pool (set up on its first call: collective,
    as for the blocking calls) on one host and ready, and its routes'
    settled path for the class (an unsettled one: the pool's default)."""
    if not within(which, nbytes) or nbytes < nb_floor and which != BARRIER:
        return None
    state = state_of(comm, which)
    if state is None or state.hosts > 1 or type(state.pool) is not Pool:
        return None
    pool = state.pool
    exc = pool.failure()
    if exc is not None:   # (an earlier posted call broke the pool)
        raise run_failed(comm, exc)
    if not pool.ready:
        if pool.short:
            return None
        pool.drain()
        if not pool.prepare():   # (collective: the same call on every rank)
            return None
    cdef int code
    cdef Routes r = state.routes
    if r is None:
        code = 1 if not adaptive or blo[which] <= nbytes < bhi[which] else 0
    else:
        sc = cxl_size_class(nbytes)
        code = r.choice[which][sc][r.where[which][sc]]
        if code < 0:
            code = 1
    if code <= 0:
        return None
    cdef Plan p = Plan.__new__(Plan)
    p.state, p.which, p.nbytes, p.keep = state, which, nbytes, fills + drains
    p.fills, p.drains = fills, drains
    p.post = getattr(pool, method)
    p.args, p.flags = args, code - 1
    return p


def post(Plan plan):
    """Make the Op of `plan` (Pool.post_<family>), counted as posted."""
    for m in plan.fills:
        fill(m)
    op = plan.post(*plan.args, flags=plan.flags)
    nb_pool[plan.which] += 1
    nb_bytes[plan.which] += plan.nbytes
    return op


def finish(Plan plan):
    """After a posted call ran (its request's query, in the thread that
    completes it): copy staged receive messages back into the user's."""
    for m in plan.drains:
        drain(m)


def submit(Plan plan, op, request):
    """Hand `op` (of `post(plan)`) to its pool's worker, which completes
    `request` (an MPI.Grequest) once the call has run -- after the MPI
    barrier on the state's private communicator that ends a pool
    collective under CXLMPI_ORDERING."""
    state = plan.state
    cdef uintptr_t order = 0
    if state.order is not None and state.order_at:
        order = <uintptr_t>cxl_mpi_read(<const void *><uintptr_t>state.order_at)
    op.submit(<uintptr_t>&nb_complete, request.handle & 0xFFFFFFFFFFFFFFFF, order)


cdef int settle_posted(object comm) except -1:
    """Before a call runs anything on `comm`'s pool in this thread: let its
    worker end the calls posted before, and forget the records of every
    ended call."""
    global _live
    state = _states.get(comm.handle)
    if state is not None:
        pool = state.pool
        if type(pool) is Pool:
            if pool.posted:
                pool.drain()
            exc = pool.failure()
            if exc is not None:   # (a posted call broke the pool: closed first)
                raise run_failed(comm, exc)
    _live = [r for r in _live if not r.op.done]
    return 0


def finish_posted():
    """MPI_Finalize has begun: let every pool's worker end the calls posted
    to it (they still progress MPI and complete their requests); returns
    how many had not ended."""
    global _live
    pending = sum(1 for r in _live if not r.op.done)
    for state in list(_states.values()):
        pool = state.pool
        if type(pool) is Pool and pool.posted:
            pool.drain()
    _live = []
    return pending


def posted_failed(comm, exc):
    """The error the user sees for a posted call that failed in the pool."""
    return run_failed(comm, exc)


def live(record):
    """Keep `record` (its messages) until its call has ended (forgotten at
    the next blocking call, or here once many are kept)."""
    global _live
    if len(_live) >= 64:
        _live = [r for r in _live if not r.op.done]
    _live.append(record)


def nb_wait_seconds(int which, double seconds):
    nb_waited[which] += seconds


def nonblocking_rows():
    """{name: (posted to the pool, passed to MPI, bytes posted, seconds
    waited)} of every collective."""
    return {COLLECTIVES[i]: (int(nb_pool[i]), int(nb_pass[i]), int(nb_bytes[i]),
                             nb_waited[i]) for i in range(NCOLL)}


def nonblocking_reset():
    for i in range(NCOLL):
        nb_pool[i] = nb_pass[i] = nb_bytes[i] = nb_waited[i] = 0


cdef inline object nb_passed(int which, object result):
    nb_pass[which] += 1
    return result


# ------------------------------------------------------------ the plans

cdef Plan nb_plan_barrier(object comm):
    if not nb_on or disabled:
        return None
    state = _states.get(comm.handle)
    if state is not None and state.order is not None:
        return None   # (with CXLMPI_ORDERING, MPI's own barrier does the work)
    return planned(comm, BARRIER, 0, "post_barrier", (), (), ())


cdef Plan nb_plan_bcast(object comm, object buf, int root):
    if not nb_on or disabled or not 0 <= root < comm_size(comm):
        return None
    cdef bint rooted = root == comm_rank(comm)
    cdef Message m = message(buf, not rooted, 0, lo[BCAST], STAGE_ANY)
    if m is None:
        return None
    return planned(comm, BCAST, m.nbytes, "post_bcast", (m.address, m.nbytes, root),
                   (m,) if rooted else (), () if rooted else (m,))


cdef Plan nb_plan_reduce(object comm, int which, object sendbuf, object recvbuf,
                         object op, int root):
    """Ireduce (root >= 0), Iallreduce, Iscan and Iexscan."""
    if not nb_on or disabled or root >= comm_size(comm):
        return None
    cdef bint receiving = root < 0 or root == comm_rank(comm)
    opc = op_code(op)
    if opc is None:
        return None
    cdef Message send, recv = None
    if receiving:
        recv = message(recvbuf, True, 0, 0, STAGE_DEVICE)
        if recv is None:
            return None
    if sendbuf is _IN_PLACE and receiving:
        send = recv
    else:
        send = message(sendbuf, False, 0, 0, STAGE_DEVICE)
        if send is None or recv is not None and (
                send.count != recv.count or send.handle != recv.handle or aliased(send, recv)):
            return None
    if send.tcode < 0 or not reducer_defined(opc, send.tcode):
        return None
    cdef uintptr_t raddr = recv.address if recv is not None else 0
    # (Exscan leaves rank 0's receive buffer as it was: a staged one is
    # filled first, so that copying it back changes nothing)
    fills = (send, recv) if which == EXSCAN and send is not recv else (send,)
    drains = (recv,) if recv is not None else ()
    if which == SCAN or which == EXSCAN:
        return planned(comm, which, send.nbytes, "post_scan",
                       (send.address, raddr, send.count, send.itemsize, opc, send.tcode,
                        which == EXSCAN), fills, drains)
    return planned(comm, which, send.nbytes, "post_reduce",
                   (send.address, raddr, send.count, send.itemsize, opc, send.tcode, root),
                   fills, drains)


cdef Plan nb_plan_move(object comm, int which, object sendbuf, object recvbuf):
    """Iallgather and Ialltoall: decided from the block each rank sends (all
    send alike)."""
    if not nb_on or disabled or which == ALLTOALL and not nb_alltoall:
        return None
    cdef int size = comm_size(comm), rank = comm_rank(comm), q
    cdef bint inplace = sendbuf is _IN_PLACE
    cdef Message recv = message(recvbuf, True, size, 0, STAGE_ANY), send = None
    if recv is None:
        return None
    cdef Py_ssize_t block = recv.nbytes
    if not inplace:
        send = message(sendbuf, False, size if which == ALLTOALL else 0, 0, STAGE_ANY)
        if send is None or send.nbytes != block or aliased(send, recv):
            return None
    recv_addrs = [recv.address + q * block for q in range(size)]
    sizes = [block] * size
    if which == ALLGATHER:
        return planned(comm, which, block * size, "post_gather",
                       (recv_addrs[rank] if inplace else send.address, block, recv_addrs,
                        sizes, -1, block, "Iallgather"),
                       (recv if inplace else send,), (recv,))
    send_addrs = recv_addrs if inplace else [send.address + q * block for q in range(size)]
    return planned(comm, which, block * size, "post_exchange",
                   (send_addrs, sizes, recv_addrs, sizes, block, "Ialltoall"),
                   (recv if inplace else send,), (recv,))


cdef Plan nb_plan_reduce_scatter_block(object comm, object sendbuf, object recvbuf,
                                       object op):
    if not nb_on or disabled:
        return None
    cdef int size = comm_size(comm), d
    opc = op_code(op)
    if opc is None:
        return None
    cdef Message send = None, recv
    if sendbuf is _IN_PLACE:
        recv = message(recvbuf, True, size, 0, STAGE_DEVICE)
    else:
        recv = message(recvbuf, True, 0, 0, STAGE_DEVICE)
        send = message(sendbuf, False, size, 0, STAGE_DEVICE) if recv is not None else None
        if send is None or send.count != recv.count or send.handle != recv.handle \
                or aliased(send, recv):
            return None
    if recv is None or recv.tcode < 0 or not reducer_defined(opc, recv.tcode):
        return None
    base = recv.address if send is None else send.address
    return planned(comm, REDUCE_SCATTER_BLOCK, recv.nbytes * size, "post_reduce_scatter",
                   ([base + d * recv.nbytes for d in range(size)], [recv.count] * size,
                    recv.address, recv.itemsize, opc, recv.tcode, send is None,
                    "Ireduce_scatter_block"), (recv if send is None else send,), (recv,))


# ------------------------------------------------------------ the methods
# Each: the plan, or the stock method (counted as passed).  The persistent
# forms plan once, at *_init: every Start posts the same plan.

cdef object _I = MPI.Intracomm


def Ibarrier(self):
    """Nonblocking Barrier."""
    enter_posting(self)
    plan = nb_plan_barrier(self)
    return nb_passed(BARRIER, _I.Ibarrier(self)) if plan is None else \
        _start_request(self, plan)


def Ibcast(self, buf, int root=0):
    """Nonblocking Broadcast."""
    enter_posting(self)
    plan = nb_plan_bcast(self, buf, root)
    return nb_passed(BCAST, _I.Ibcast(self, buf, root)) if plan is None else \
        _start_request(self, plan)


def Ireduce(self, sendbuf, recvbuf, op=MPI.SUM, int root=0):
    """Nonblocking Reduce to root."""
    enter_posting(self)
    plan = nb_plan_reduce(self, REDUCE, sendbuf, recvbuf, op, root) if root >= 0 else None
    return nb_passed(REDUCE, _I.Ireduce(self, sendbuf, recvbuf, op, root)) \
        if plan is None else _start_request(self, plan)


def Iallreduce(self, sendbuf, recvbuf, op=MPI.SUM):
    """Nonblocking Reduce to all."""
    enter_posting(self)
    plan = nb_plan_reduce(self, ALLREDUCE, sendbuf, recvbuf, op, -1)
    return nb_passed(ALLREDUCE, _I.Iallreduce(self, sendbuf, recvbuf, op)) \
        if plan is None else _start_request(self, plan)


def Iscan(self, sendbuf, recvbuf, op=MPI.SUM):
    """Nonblocking inclusive Scan."""
    enter_posting(self)
    plan = nb_plan_reduce(self, SCAN, sendbuf, recvbuf, op, -1)
    return nb_passed(SCAN, _I.Iscan(self, sendbuf, recvbuf, op)) if plan is None else \
        _start_request(self, plan)


def Iexscan(self, sendbuf, recvbuf, op=MPI.SUM):
    """Nonblocking exclusive Scan."""
    enter_posting(self)
    plan = nb_plan_reduce(self, EXSCAN, sendbuf, recvbuf, op, -1)
    return nb_passed(EXSCAN, _I.Iexscan(self, sendbuf, recvbuf, op)) if plan is None else \
        _start_request(self, plan)


def Iallgather(self, sendbuf, recvbuf):
    """Nonblocking Gather to All."""
    enter_posting(self)
    plan = nb_plan_move(self, ALLGATHER, sendbuf, recvbuf)
    return nb_passed(ALLGATHER, _I.Iallgather(self, sendbuf, recvbuf)) if plan is None \
        else _start_request(self, plan)


def Ialltoall(self, sendbuf, recvbuf):
    """Nonblocking All to All."""
    enter_posting(self)
    plan = nb_plan_move(self, ALLTOALL, sendbuf, recvbuf)
    return nb_passed(ALLTOALL, _I.Ialltoall(self, sendbuf, recvbuf)) if plan is None \
        else _start_request(self, plan)


def Ireduce_scatter_block(self, sendbuf, recvbuf, op=MPI.SUM):
    """Nonblocking Reduce-Scatter Block."""
    enter_posting(self)
    plan = nb_plan_reduce_scatter_block(self, sendbuf, recvbuf, op)
    return nb_passed(REDUCE_SCATTER_BLOCK, _I.Ireduce_scatter_block(
        self, sendbuf, recvbuf, op)) if plan is None else _start_request(self, plan)


# The forms whose sizes only some ranks know: MPI's, counted.
def Iallgatherv(self, sendbuf, recvbuf):
    """Nonblocking Gather to All Vector (MPI's)."""
    return nb_passed(ALLGATHERV, _I.Iallgatherv(self, sendbuf, recvbuf))


def Igather(self, sendbuf, recvbuf, int root=0):
    """Nonblocking Gather (MPI's)."""
    return nb_passed(GATHER, _I.Igather(self, sendbuf, recvbuf, root))


def Igatherv(self, sendbuf, recvbuf, int root=0):
    """Nonblocking Gather Vector (MPI's)."""
    return nb_passed(GATHERV, _I.Igatherv(self, sendbuf, recvbuf, root))


def Iscatter(self, sendbuf, recvbuf, int root=0):
    """Nonblocking Scatter (MPI's)."""
    return nb_passed(SCATTER, _I.Iscatter(self, sendbuf, recvbuf, root))


def Iscatterv(self, sendbuf, recvbuf, int root=0):
    """Nonblocking Scatter Vector (MPI's)."""
    return nb_passed(SCATTERV, _I.Iscatterv(self, sendbuf, recvbuf, root))


def Ialltoallv(self, sendbuf, recvbuf):
    """Nonblocking All to All Vector (MPI's)."""
    return nb_passed(ALLTOALLV, _I.Ialltoallv(self, sendbuf, recvbuf))


def Ireduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=MPI.SUM):
    """Nonblocking Reduce-Scatter (MPI's)."""
    return nb_passed(REDUCE_SCATTER, _I.Ireduce_scatter(self, sendbuf, recvbuf, recvcounts,
                                                        op))


# Persistent (MPI-4): planned at *_init.
def Barrier_init(self, info=MPI.INFO_NULL):
    """Persistent Barrier."""
    enter_posting(self)
    plan = nb_plan_barrier(self)
    return nb_passed(BARRIER, _I.Barrier_init(self, info)) if plan is None else \
        _persistent(self, plan)


def Bcast_init(self, buf, int root=0, info=MPI.INFO_NULL):
    """Persistent Broadcast."""
    enter_posting(self)
    plan = nb_plan_bcast(self, buf, root)
    return nb_passed(BCAST, _I.Bcast_init(self, buf, root, info)) if plan is None else \
        _persistent(self, plan)


def Reduce_init(self, sendbuf, recvbuf, op=MPI.SUM, int root=0, info=MPI.INFO_NULL):
    """Persistent Reduce."""
    enter_posting(self)
    plan = nb_plan_reduce(self, REDUCE, sendbuf, recvbuf, op, root) if root >= 0 else None
    return nb_passed(REDUCE, _I.Reduce_init(self, sendbuf, recvbuf, op, root, info)) \
        if plan is None else _persistent(self, plan)


def Allreduce_init(self, sendbuf, recvbuf, op=MPI.SUM, info=MPI.INFO_NULL):
    """Persistent Allreduce."""
    enter_posting(self)
    plan = nb_plan_reduce(self, ALLREDUCE, sendbuf, recvbuf, op, -1)
    return nb_passed(ALLREDUCE, _I.Allreduce_init(self, sendbuf, recvbuf, op, info)) \
        if plan is None else _persistent(self, plan)


def Scan_init(self, sendbuf, recvbuf, op=MPI.SUM, info=MPI.INFO_NULL):
    """Persistent inclusive Scan."""
    enter_posting(self)
    plan = nb_plan_reduce(self, SCAN, sendbuf, recvbuf, op, -1)
    return nb_passed(SCAN, _I.Scan_init(self, sendbuf, recvbuf, op, info)) \
        if plan is None else _persistent(self, plan)


def Exscan_init(self, sendbuf, recvbuf, op=MPI.SUM, info=MPI.INFO_NULL):
    """Persistent exclusive Scan."""
    enter_posting(self)
    plan = nb_plan_reduce(self, EXSCAN, sendbuf, recvbuf, op, -1)
    return nb_passed(EXSCAN, _I.Exscan_init(self, sendbuf, recvbuf, op, info)) \
        if plan is None else _persistent(self, plan)


def Allgather_init(self, sendbuf, recvbuf, info=MPI.INFO_NULL):
    """Persistent Allgather."""
    enter_posting(self)
    plan = nb_plan_move(self, ALLGATHER, sendbuf, recvbuf)
    return nb_passed(ALLGATHER, _I.Allgather_init(self, sendbuf, recvbuf, info)) \
        if plan is None else _persistent(self, plan)


def Alltoall_init(self, sendbuf, recvbuf, info=MPI.INFO_NULL):
    """Persistent Alltoall."""
    enter_posting(self)
    plan = nb_plan_move(self, ALLTOALL, sendbuf, recvbuf)
    return nb_passed(ALLTOALL, _I.Alltoall_init(self, sendbuf, recvbuf, info)) \
        if plan is None else _persistent(self, plan)


def Reduce_scatter_block_init(self, sendbuf, recvbuf, op=MPI.SUM, info=MPI.INFO_NULL):
    """Persistent Reduce-Scatter Block."""
    enter_posting(self)
    plan = nb_plan_reduce_scatter_block(self, sendbuf, recvbuf, op)
    return nb_passed(REDUCE_SCATTER_BLOCK, _I.Reduce_scatter_block_init(
        self, sendbuf, recvbuf, op, info)) if plan is None else _persistent(self, plan)


# The posted forms the pool can take (the others count their calls and go
# to MPI); the reference's pool table reads it.
POSTED_TO_POOL = (
    "Ibarrier", "Ibcast", "Ireduce", "Iallreduce", "Iscan", "Iexscan", "Iallgather",
    "Ireduce_scatter_block", "Barrier_init", "Bcast_init", "Reduce_init",
    "Allreduce_init", "Scan_init", "Exscan_init", "Allgather_init",
    "Reduce_scatter_block_init")
NONBLOCKING_METHODS = (
    "Ibarrier", "Ibcast", "Ireduce", "Iallreduce", "Iscan", "Iexscan", "Iallgather",
    "Ialltoall", "Ireduce_scatter_block", "Iallgatherv", "Igather", "Igatherv", "Iscatter",
    "Iscatterv", "Ialltoallv", "Ireduce_scatter", "Barrier_init", "Bcast_init",
    "Reduce_init", "Allreduce_init", "Scan_init", "Exscan_init", "Allgather_init",
    "Alltoall_init", "Reduce_scatter_block_init")

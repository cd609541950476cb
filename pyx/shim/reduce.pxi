# Reduce, Allreduce, Scan and Exscan, as CXLComm intercepts them:
# `plan_reduce` checks the messages, the op and the type, `take` names the
# path, Pool.reduce / Pool.scan (pyx/pool/reduce.pxi) runs it.
# Module-level functions, bound as methods of CommBase in pyx/_shim.pyx;
# their nonblocking and persistent forms end the file.
# (part of cxlmpi._shim: included by pyx/_shim.pyx)


def Reduce(self, sendbuf, recvbuf, op=MPI.SUM, int root=0):
    """Reduce to root."""
    enter(self)
    if root == comm_rank(self):
        sendbuf = placed(sendbuf)
    cdef double t0 = start(), t
    cdef Message send, recv
    cdef int code = 0, zc = 0
    plan = None
    if 0 <= root < comm_size(self):   # (plan_reduce asks `skip` first)
        plan = plan_reduce(self, REDUCE, sendbuf, recvbuf, op, root == comm_rank(self))
    state = state_of(self, REDUCE) if plan is not None and plan[3] else None
    if state is not None:
        send, recv, opc, _ = plan
        code = take(self, state, REDUCE, send.nbytes, root, send.address, send.nbytes,
                    recv.address if recv is not None else 0, send.nbytes)
    if code <= 0:
        if code == 0:
            to_mpi(self)
        t = clock()
        pass_reduce(self, CXL_MPI_REDUCE, sendbuf, recvbuf, op, root, plan)
        passed(REDUCE, t0)
    else:
        t = now()
        if not time_all:
            t0 = t
        fill(send)
        zc = run(self, REDUCE, code, _stock_reduce, (self, sendbuf, recvbuf, op, root,),
                 state.pool.reduce, (send.address, recv.address if recv is not None else 0,
                                     send.count, send.itemsize, opc, send.tcode, root))
        if zc >= 0:
            drain(recv)
            pooled(REDUCE, send.nbytes, t0)
    if state is not None:
        took(state, REDUCE, send.nbytes, code, zc, t)


def Allreduce(self, sendbuf, recvbuf, op=MPI.SUM):
    """Reduce to all."""
    sendbuf = placed(sendbuf)
    enter(self)
    cdef double t0 = start(), t
    cdef Message send, recv
    cdef int code = 0, zc = 0
    plan = plan_reduce(self, ALLREDUCE, sendbuf, recvbuf, op, True)
    state = state_of(self, ALLREDUCE) if plan is not None and plan[3] else None
    if state is not None:
        send, recv, opc, _ = plan
        code = take(self, state, ALLREDUCE, send.nbytes, -1, send.address, send.nbytes,
                    recv.address, recv.nbytes)
    if code <= 0:
        if code == 0:
            to_mpi(self)
        t = clock()
        pass_reduce(self, CXL_MPI_ALLREDUCE, sendbuf, recvbuf, op, -1, plan)
        passed(ALLREDUCE, t0)
    else:
        t = now()
        if not time_all:
            t0 = t
        fill(send)
        zc = run(self, ALLREDUCE, code, _stock_allreduce, (self, sendbuf, recvbuf, op,),
                 state.pool.reduce, (send.address, recv.address, send.count, send.itemsize,
                                     opc, send.tcode, -1))
        if zc >= 0:
            drain(recv)
            pooled(ALLREDUCE, send.nbytes, t0)
    if state is not None:
        took(state, ALLREDUCE, send.nbytes, code, zc, t)


def Scan(self, sendbuf, recvbuf, op=MPI.SUM):
    """Inclusive Scan: rank r gets x0 op ... op xr."""
    sendbuf = placed(sendbuf)
    _scan(self, SCAN, sendbuf, recvbuf, op)


def Exscan(self, sendbuf, recvbuf, op=MPI.SUM):
    """Exclusive Scan: rank r gets x0 op ... op x(r-1); rank 0's receive
    buffer is left as it was (MPI leaves it undefined)."""
    sendbuf = placed(sendbuf)
    _scan(self, EXSCAN, sendbuf, recvbuf, op)


def _scan(object self, int which, object sendbuf, object recvbuf, object op):
    """Scan and Exscan."""
    enter(self)
    cdef double t0 = start(), t
    cdef Message send, recv
    cdef int code = 0, zc = 0
    stock = _stock_exscan if which == EXSCAN else _stock_scan
    plan = plan_reduce(self, which, sendbuf, recvbuf, op, True)
    state = state_of(self, which) if plan is not None and plan[3] else None
    if state is not None:
        send, recv, opc, _ = plan
        code = take(self, state, which, send.nbytes, -1)
    if code <= 0:
        if code == 0:
            to_mpi(self)
        t = clock()
        pass_reduce(self, CXL_MPI_EXSCAN if which == EXSCAN else CXL_MPI_SCAN, sendbuf,
                    recvbuf, op, -1, plan)
        passed(which, t0)
    else:
        t = now()
        if not time_all:
            t0 = t
        fill(send)
        if which == EXSCAN and send is not recv:
            fill(recv)   # (rank 0's is left as it was: as the user's)
        zc = run(self, which, code, stock, (self, sendbuf, recvbuf, op,),
                 state.pool.scan, (send.address, recv.address, send.count, send.itemsize,
                                   opc, send.tcode, which == EXSCAN))
        if zc >= 0:
            drain(recv)
            pooled(which, send.nbytes, t0)
    if state is not None:
        took(state, which, send.nbytes, code, zc, t)


# ------------------------------------------------ nonblocking and persistent
# The I-forms post the call the plan names (shim/nonblocking.pxi) or pass it
# to stock MPI, counted; the persistent forms plan once, at *_init, and
# every Start posts the same plan.


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
        if recv is not None and (send is None or send.count != recv.count or
                                 send.handle != recv.handle or aliased(send, recv)):
            if recv.tcode < 0 or not reducer_defined(opc, recv.tcode):
                return None   # (no reducer: MPI on every rank, before any refusal)
            return refused_here(comm, which, recv.nbytes,
                                "the send message (a form the pool cannot read, another "
                                "count or type than the receive message, or sharing its "
                                "memory)")
        if send is None:
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


def Ireduce(self, sendbuf, recvbuf, op=MPI.SUM, int root=0):
    """Nonblocking Reduce to root."""
    enter_posting(self)
    if root == comm_rank(self):
        sendbuf = placed(sendbuf)
    plan = nb_plan_reduce(self, REDUCE, sendbuf, recvbuf, op, root) if root >= 0 else None
    return nb_request(self, plan, REDUCE, _I.Ireduce, (sendbuf, recvbuf, op, root), False)


def Iallreduce(self, sendbuf, recvbuf, op=MPI.SUM):
    """Nonblocking Reduce to all."""
    sendbuf = placed(sendbuf)
    enter_posting(self)
    plan = None if posted_small(recvbuf, ALLREDUCE) else \
        nb_plan_reduce(self, ALLREDUCE, sendbuf, recvbuf, op, -1)
    return nb_request(self, plan, ALLREDUCE, _I.Iallreduce, (sendbuf, recvbuf, op), False)


def Iscan(self, sendbuf, recvbuf, op=MPI.SUM):
    """Nonblocking inclusive Scan."""
    sendbuf = placed(sendbuf)
    enter_posting(self)
    plan = None if posted_small(recvbuf, SCAN) else \
        nb_plan_reduce(self, SCAN, sendbuf, recvbuf, op, -1)
    return nb_request(self, plan, SCAN, _I.Iscan, (sendbuf, recvbuf, op), False)


def Iexscan(self, sendbuf, recvbuf, op=MPI.SUM):
    """Nonblocking exclusive Scan."""
    sendbuf = placed(sendbuf)
    enter_posting(self)
    plan = None if posted_small(recvbuf, EXSCAN) else \
        nb_plan_reduce(self, EXSCAN, sendbuf, recvbuf, op, -1)
    return nb_request(self, plan, EXSCAN, _I.Iexscan, (sendbuf, recvbuf, op), False)


def Reduce_init(self, sendbuf, recvbuf, op=MPI.SUM, int root=0, info=MPI.INFO_NULL):
    """Persistent Reduce."""
    enter_init(self)
    if root == comm_rank(self):
        sendbuf = placed(sendbuf)
    plan = init_plan(self, lambda: nb_plan_reduce(self, REDUCE, sendbuf, recvbuf, op, root)) \
        if root >= 0 else None
    return nb_request(self, plan, REDUCE,
                      _I.Reduce_init, (sendbuf, recvbuf, op, root, info), True)


def Allreduce_init(self, sendbuf, recvbuf, op=MPI.SUM, info=MPI.INFO_NULL):
    """Persistent Allreduce."""
    sendbuf = placed(sendbuf)
    enter_init(self)
    plan = init_plan(self, lambda: nb_plan_reduce(self, ALLREDUCE, sendbuf, recvbuf, op, -1))
    return nb_request(self, plan, ALLREDUCE,
                      _I.Allreduce_init, (sendbuf, recvbuf, op, info), True)


def Scan_init(self, sendbuf, recvbuf, op=MPI.SUM, info=MPI.INFO_NULL):
    """Persistent inclusive Scan."""
    sendbuf = placed(sendbuf)
    enter_init(self)
    plan = init_plan(self, lambda: nb_plan_reduce(self, SCAN, sendbuf, recvbuf, op, -1))
    return nb_request(self, plan, SCAN, _I.Scan_init, (sendbuf, recvbuf, op, info), True)


def Exscan_init(self, sendbuf, recvbuf, op=MPI.SUM, info=MPI.INFO_NULL):
    """Persistent exclusive Scan."""
    sendbuf = placed(sendbuf)
    enter_init(self)
    plan = init_plan(self, lambda: nb_plan_reduce(self, EXSCAN, sendbuf, recvbuf, op, -1))
    return nb_request(self, plan, EXSCAN, _I.Exscan_init, (sendbuf, recvbuf, op, info), True)

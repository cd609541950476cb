# Reduce, Allreduce, Scan and Exscan, as CXLComm intercepts them:
# `plan_reduce` checks the messages, the op and the type, `take` names the
# path, Pool.reduce / Pool.scan (pyx/pool/reduce.pxi) runs it.
# Module-level functions, bound as methods of CommBase in pyx/_shim.pyx.
# (part of cxlmpi._shim: included by pyx/_shim.pyx)


def Reduce(self, sendbuf, recvbuf, op=MPI.SUM, int root=0):
    """Reduce to root."""
    enter(self)
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
    _scan(self, SCAN, sendbuf, recvbuf, op)


def Exscan(self, sendbuf, recvbuf, op=MPI.SUM):
    """Exclusive Scan: rank r gets x0 op ... op x(r-1); rank 0's receive
    buffer is left as it was (MPI leaves it undefined)."""
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

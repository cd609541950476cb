# Reduce_scatter_block and Reduce_scatter, as CXLComm intercepts them:
# Pool.reduce_scatter (pyx/pool/exchange.pxi) runs them.  Module-level
# functions, bound as methods of CommBase in pyx/_shim.pyx; their
# nonblocking and persistent forms end the file.
# (part of cxlmpi._shim: included by pyx/_shim.pyx)


def Reduce_scatter_block(self, sendbuf, recvbuf, op=MPI.SUM):
    """Reduce-Scatter Block (every rank gets one equal block)."""
    sendbuf = placed(sendbuf)
    enter(self)
    cdef double t0 = start(), t
    if disabled or skip(self, REDUCE_SCATTER_BLOCK,
                        recvbuf if sendbuf is _IN_PLACE else sendbuf):
        to_mpi(self)
        pass_reduce_scatter_block(self, sendbuf, recvbuf, op)
        passed(REDUCE_SCATTER_BLOCK, t0)
        return
    cdef Message send = None, recv = None, pr = None
    cdef int size = comm_size(self), code = 0, zc = 0
    opc = op_code(op)
    if opc is not None:
        if sendbuf is _IN_PLACE:
            recv = message(recvbuf, True, size, 0, STAGE_DEVICE)
        else:
            pr = recv = message(recvbuf, True, 0, 0, STAGE_DEVICE)
            send = message(sendbuf, False, size, 0, STAGE_DEVICE) if recv is not None else None
            if send is None or send.count != recv.count or \
                    send.handle != recv.handle or aliased(send, recv):
                recv = None
        if recv is None or \
                not within(REDUCE_SCATTER_BLOCK, recv.nbytes * size) or \
                recv.tcode < 0 or not reducer_defined(opc, recv.tcode):
            recv = None
    state = state_of(self, REDUCE_SCATTER_BLOCK) if recv is not None else None
    if state is not None:
        code = take(self, state, REDUCE_SCATTER_BLOCK, recv.nbytes * size, -1,
                    send.address if send is not None else 0, recv.nbytes * size,
                    recv.address, recv.nbytes)
    if code <= 0:
        if code == 0:
            to_mpi(self)
        t = clock()
        pass_reduce_scatter_block(self, sendbuf, recvbuf, op, send, pr, pr is not None)
        passed(REDUCE_SCATTER_BLOCK, t0)
    else:
        t = now()
        if not time_all:
            t0 = t
        block = recv.nbytes
        base = recv.address if send is None else send.address
        fill(recv if send is None else send)
        zc = run(self, REDUCE_SCATTER_BLOCK, code,
                 _stock_reduce_scatter_block, (self, sendbuf, recvbuf, op,),
                 state.pool.reduce_scatter,
                 ([base + d * block for d in range(size)], [recv.count] * size,
                  recv.address, recv.itemsize, opc, recv.tcode, send is None,
                  "Reduce_scatter_block"))
        if zc >= 0:
            drain(recv)
            pooled(REDUCE_SCATTER_BLOCK, block * size, t0)
    if state is not None:
        took(state, REDUCE_SCATTER_BLOCK, recv.nbytes * size, code, zc, t)


cdef tuple rs_messages(object sendbuf, object recvbuf, object recvcounts, object op,
                       int size, int rank):
    """(the pool could take it, op code, send, recv, counts, total) of a
    Reduce_scatter (send None: in place; counts None: no counts, which
    stock mpi4py gathers first, or an op the pool cannot apply; send and
    recv None: messages that disagree with the counts)."""
    cdef Message send = None, recv = None
    cdef Vector counts = None
    cdef Py_ssize_t total = 0, i
    opc = None if disabled or recvcounts is None else op_code(op)
    if opc is not None:
        counts = read_counts(recvcounts, size)
    if counts is not None:
        for i in range(size):
            if total > PY_SSIZE_T_MAX - counts.counts[i]:
                counts = None
                break
            total += counts.counts[i]
    if counts is None:
        return False, None, None, None, None, 0
    recv = message(recvbuf, True, 0, 0, STAGE_DEVICE)
    if recv is not None and sendbuf is _IN_PLACE:
        if recv.count != total:
            recv = None
    elif recv is not None:
        send = message(sendbuf, False, 0, 0, STAGE_DEVICE)
        if send is None or send.count != total or recv.count != counts.counts[rank] \
                or send.handle != recv.handle or aliased(send, recv):
            recv = send = None
    cdef bint fits = recv is not None and within(REDUCE_SCATTER, total * recv.itemsize) \
        and recv.tcode >= 0 and reducer_defined(opc, recv.tcode)
    return fits, opc, send, recv, counts, total


cdef list rs_pieces(Message send, Message recv, Vector counts):
    """Where each rank's piece of a Reduce_scatter starts (send None: in
    the receive buffer)."""
    cdef Py_ssize_t acc = 0, i
    cdef uintptr_t base = recv.address if send is None else send.address
    addrs = []
    for i in range(counts.blocks):
        addrs.append(base + acc * recv.itemsize)
        acc += counts.counts[i]
    return addrs


def Reduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=MPI.SUM):
    """Reduce-Scatter (vector: rank d gets recvcounts[d] elements).
    Without recvcounts, stock mpi4py first gathers them through MPI; such
    calls pass through."""
    sendbuf = placed(sendbuf)
    enter(self)
    cdef double t0 = start(), t
    cdef Message send, recv
    cdef Vector counts
    cdef int size = comm_size(self), rank = comm_rank(self), code = 0, zc = 0
    cdef Py_ssize_t total
    fits, opc, send, recv, counts, total = rs_messages(sendbuf, recvbuf, recvcounts, op,
                                                       size, rank)
    state = state_of(self, REDUCE_SCATTER) if fits else None
    if state is not None:
        code = take(self, state, REDUCE_SCATTER, total * recv.itemsize, -1,
                    send.address if send is not None else 0, total * recv.itemsize,
                    recv.address, recv.nbytes)
    if code <= 0:
        if code == 0:
            to_mpi(self)
        t = clock()
        pass_reduce_scatter(self, sendbuf, recvbuf, recvcounts, op, send, recv, counts)
        passed(REDUCE_SCATTER, t0)
    else:
        t = now()
        if not time_all:
            t0 = t
        item = recv.itemsize
        fill(recv if send is None else send)
        zc = run(self, REDUCE_SCATTER, code,
                 _stock_reduce_scatter, (self, sendbuf, recvbuf, recvcounts, op,),
                 state.pool.reduce_scatter, (rs_pieces(send, recv, counts),
                                             counts.count_list(), recv.address, item,
                                             opc, recv.tcode, send is None,
                                             "Reduce_scatter"))
        if zc >= 0:
            drain(recv)
            pooled(REDUCE_SCATTER, total * item, t0)
    if state is not None:
        took(state, REDUCE_SCATTER, total * recv.itemsize, code, zc, t)


# ------------------------------------------------ nonblocking and persistent
# The I-forms post the call the plan names (shim/nonblocking.pxi) or pass it
# to stock MPI, counted; the persistent forms plan once, at *_init, and
# every Start posts the same plan.


cdef Plan nb_plan_reduce_scatter_block(object comm, object sendbuf, object recvbuf,
                                       object op):
    if not nb_on or disabled:
        return None
    cdef int size = comm_size(comm), d
    opc = op_code(op)
    if opc is None:
        return None
    cdef Message send = None
    cdef Message recv = message(recvbuf, True, size if sendbuf is _IN_PLACE else 0, 0,
                                STAGE_DEVICE)
    if recv is None or recv.tcode < 0 or not reducer_defined(opc, recv.tcode):
        return None   # (no reducer: MPI on every rank, before any refusal)
    if sendbuf is not _IN_PLACE:
        send = message(sendbuf, False, size, 0, STAGE_DEVICE)
        if send is None or send.count != recv.count or send.handle != recv.handle \
                or aliased(send, recv):
            return refused_here(comm, REDUCE_SCATTER_BLOCK, recv.nbytes * size,
                                "the send message (a form the pool cannot read, another "
                                "count or type than the receive blocks, or sharing their "
                                "memory)")
    base = recv.address if send is None else send.address
    return planned(comm, REDUCE_SCATTER_BLOCK, recv.nbytes * size, "post_reduce_scatter",
                   ([base + d * recv.nbytes for d in range(size)], [recv.count] * size,
                    recv.address, recv.itemsize, opc, recv.tcode, send is None,
                    "Ireduce_scatter_block"), (recv if send is None else send,), (recv,))


cdef Plan nb_plan_reduce_scatter(object comm, object sendbuf, object recvbuf,
                                 object recvcounts, object op):
    """Ireduce_scatter: decided from the counts, which every rank holds."""
    if not nb_on:
        return None
    cdef int size = comm_size(comm), rank = comm_rank(comm)
    cdef Message send, recv
    cdef Vector counts
    fits, opc, send, recv, counts, total = rs_messages(sendbuf, recvbuf, recvcounts, op,
                                                       size, rank)
    if not fits:
        return None
    return planned(comm, REDUCE_SCATTER, total * recv.itemsize, "post_reduce_scatter",
                   (rs_pieces(send, recv, counts), counts.count_list(), recv.address,
                    recv.itemsize, opc, recv.tcode, send is None, "Ireduce_scatter"),
                   (recv if send is None else send,), (recv,))


def Ireduce_scatter_block(self, sendbuf, recvbuf, op=MPI.SUM):
    """Nonblocking Reduce-Scatter Block."""
    sendbuf = placed(sendbuf)
    enter_posting(self)
    plan = None if posted_small(sendbuf, REDUCE_SCATTER_BLOCK) else \
        nb_plan_reduce_scatter_block(self, sendbuf, recvbuf, op)
    return nb_request(self, plan, REDUCE_SCATTER_BLOCK,
                      _I.Ireduce_scatter_block, (sendbuf, recvbuf, op), False)


def Ireduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=MPI.SUM):
    """Nonblocking Reduce-Scatter."""
    sendbuf = placed(sendbuf)
    enter_posting(self)
    return nb_request(self, nb_plan_reduce_scatter(self, sendbuf, recvbuf, recvcounts, op),
                      REDUCE_SCATTER, _I.Ireduce_scatter, (sendbuf, recvbuf, recvcounts, op),
                      False)


def Reduce_scatter_block_init(self, sendbuf, recvbuf, op=MPI.SUM, info=MPI.INFO_NULL):
    """Persistent Reduce-Scatter Block."""
    sendbuf = placed(sendbuf)
    enter_init(self)
    plan = init_plan(self, lambda: nb_plan_reduce_scatter_block(self, sendbuf, recvbuf, op))
    return nb_request(self, plan, REDUCE_SCATTER_BLOCK,
                      _I.Reduce_scatter_block_init, (sendbuf, recvbuf, op, info), True)


def Reduce_scatter_init(self, sendbuf, recvbuf, recvcounts=None, op=MPI.SUM,
                        info=MPI.INFO_NULL):
    """Persistent Reduce-Scatter."""
    sendbuf = placed(sendbuf)
    enter_init(self)
    plan = init_plan(self, lambda: nb_plan_reduce_scatter(self, sendbuf, recvbuf,
                                                          recvcounts, op))
    return nb_request(self, plan, REDUCE_SCATTER, _I.Reduce_scatter_init,
                      (sendbuf, recvbuf, recvcounts, op, info), True)

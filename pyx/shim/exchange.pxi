# The personalized exchanges, Scatter(v), Alltoall(v) and
# Reduce_scatter(_block), as CXLComm intercepts them: Pool.exchange and
# Pool.reduce_scatter (pyx/pool/exchange.pxi) run them.  Scatter(v) and
# Alltoallv settle their path in a header step (`settle_rooted`,
# `settle_rooted_v`, `settle`).  Module-level functions, bound as methods of CommBase in
# pyx/_shim.pyx; their nonblocking and persistent forms end the file.
# (part of cxlmpi._shim: included by pyx/_shim.pyx)


def Scatter(self, sendbuf, recvbuf, int root=0):
    """Scatter data from one process to all other processes.  A receive
    buffer may name more than the root sends (MPICH takes it), and only
    the root knows the block: the ranks settle the path in a header step
    (`settle_rooted`)."""
    enter(self)
    cdef double t0 = start(), t
    cdef Message send, recv
    cdef int size = comm_size(self), rank = comm_rank(self), code, zc = 0
    cdef Py_ssize_t block = 0
    state, agreed, code, send, recv, parsed = settle_rooted(
        self, SCATTER, sendbuf, recvbuf, root, size, rank)
    if code <= 0:
        if code == 0:
            to_mpi(self)
        t = clock()
        pass_move(self, CXL_MPI_SCATTER, sendbuf, recvbuf, root, send, recv, parsed)
        passed(SCATTER, t0)
    else:
        t = now()
        if not time_all:
            t0 = t
        block = agreed - 1   # (every block: the checksum added up)
        zeros = [0] * size
        if rank == root:
            send_addrs = [send.address + d * block for d in range(size)]
            send_sizes = [block] * size
        else:
            send_addrs, send_sizes = zeros, zeros
        recv_addrs, recv_sizes = list(zeros), list(zeros)
        recv_sizes[root] = block
        recv_addrs[root] = send_addrs[root] if recv is None else recv.address
        fill(send)
        zc = run(self, SCATTER, code, _stock_scatter, (self, sendbuf, recvbuf, root,),
                 state.pool.exchange, (send_addrs, send_sizes, recv_addrs, recv_sizes,
                                       block, "Scatter"))
        if zc >= 0:
            drain(recv)
            pooled(SCATTER, block * size, t0)
    if state is not None:
        took(state, SCATTER, (agreed - 1) * size, code, zc, t)


def Scatterv(self, sendbuf, recvbuf, int root=0):
    """Scatter Vector: the ranks agree on the path and length in a
    header step, as for Gatherv."""
    enter(self)
    cdef double t0 = start(), t
    cdef Message recv
    cdef Vector vec
    cdef int size = comm_size(self), rank = comm_rank(self), code, zc = 0
    cdef Py_ssize_t i
    state, agreed, code, vec, recv = settle_rooted_v(
        self, SCATTERV, sendbuf, False, recvbuf, root, size, rank)
    if code <= 0:
        if code == 0:
            to_mpi(self)
        t = clock()
        pass_vector(self, CXL_MPI_SCATTERV, sendbuf, recvbuf, root, recv, vec)
        passed(SCATTERV, t0)
    else:
        t = now()
        if not time_all:
            t0 = t
        zeros = [0] * size
        if rank == root:
            item = vec.m.itemsize
            send_addrs = [vec.m.address + vec.displs[i] * item for i in range(size)]
            send_sizes = [vec.counts[i] * item for i in range(size)]
        else:
            send_addrs, send_sizes = zeros, zeros
        recv_addrs, recv_sizes = list(zeros), list(zeros)
        if recv is None:
            recv_addrs[root], recv_sizes[root] = send_addrs[root], send_sizes[root]
        else:
            recv_addrs[root], recv_sizes[root] = recv.address, recv.nbytes
        zc = run(self, SCATTERV, code, _stock_scatterv, (self, sendbuf, recvbuf, root,),
                 state.pool.exchange, (send_addrs, send_sizes, recv_addrs, recv_sizes,
                                       agreed - 1, "Scatterv"))
        if zc >= 0:
            pooled(SCATTERV, sum(send_sizes) if rank == root else recv_sizes[root], t0)
    if state is not None:
        took(state, SCATTERV, (agreed - 1) * size, code, zc, t)


def Alltoall(self, sendbuf, recvbuf):
    """All to All Scatter/Gather: every rank sends block d to rank d."""
    enter(self)
    cdef double t0 = start(), t
    # Decided from the blocks this rank sends, as Allgather is.
    cdef bint inplace = sendbuf is _IN_PLACE
    if disabled or skip(self, ALLTOALL, recvbuf if inplace else sendbuf):
        to_mpi(self)
        pass_move(self, CXL_MPI_ALLTOALL, sendbuf, recvbuf, -1)
        passed(ALLTOALL, t0)
        return
    cdef Message send = None, recv = None, pr
    cdef int size = comm_size(self), code = 0, zc = 0
    cdef Py_ssize_t block = -1
    pr = recv = message(recvbuf, True, size, lo[ALLTOALL])
    if inplace:
        block = recv.nbytes if recv is not None else -1
    else:
        send = message(sendbuf, False, size, lo[ALLTOALL])
        block = send.nbytes if send is not None else -1
        if recv is not None and (send is None or send.nbytes != recv.nbytes
                                 or aliased(send, recv)):
            recv = None
    state = state_of(self, ALLTOALL) if block >= 0 and within(ALLTOALL, block * size) \
        else None
    if state is not None:
        code = take(self, state, ALLTOALL, block * size, -1,
                    send.address if send is not None else 0, block * size,
                    recv.address if recv is not None else 0, block * size)
        if recv is None and code > 0:
            code = 0   # (its peers follow it to MPI)
    if code <= 0:
        if code == 0:
            to_mpi(self)
        t = clock()
        pass_move(self, CXL_MPI_ALLTOALL, sendbuf, recvbuf, -1, send, pr, pr is not None)
        passed(ALLTOALL, t0)
    else:
        t = now()
        if not time_all:
            t0 = t
        recv_addrs = [recv.address + q * block for q in range(size)]
        send_addrs = recv_addrs if send is None else \
            [send.address + d * block for d in range(size)]
        sizes = [block] * size
        fill(recv if send is None else send)
        zc = run(self, ALLTOALL, code, _stock_alltoall, (self, sendbuf, recvbuf,),
                 state.pool.exchange, (send_addrs, sizes, recv_addrs, sizes, block,
                                       "Alltoall"))
        if zc >= 0:
            drain(recv)
            pooled(ALLTOALL, block * size, t0)
    if state is not None:
        took(state, ALLTOALL, block * size, code, zc, t)


def Alltoallv(self, sendbuf, recvbuf):
    """All to All Scatter/Gather Vector: no rank knows every count, so
    the ranks agree on the path and length in a header step, as for
    Gatherv (where a rank whose blocks are all below the pool's window
    sends the call to MPI at once, and the others follow it).  IN_PLACE
    passes through (on every rank: it is required to match)."""
    enter(self)
    cdef double t0 = start(), t
    cdef Message send = None, recv = None
    cdef Vector svec = None, rvec = None
    cdef int size = comm_size(self), rank = comm_rank(self), code, zc = 0
    cdef uint64_t local = 0, pairs = 0
    cdef Py_ssize_t si, ri, i
    eligible = not disabled and lo[ALLTOALLV] != NEVER and sendbuf is not _IN_PLACE
    refused, parsed = None, False
    if eligible:
        try:
            rvec = vector(recvbuf, True, size)
            svec = vector(sendbuf, False, size)
        except ValueError as exc:  # (counts past what memory holds: raised at once)
            refused, rvec, svec = exc, None, None
        else:   # outside a buffer: parsed on a scratch copy (refusals.pxi)
            refused = take_refusal()
            # (MPI may run it on the copy where `pass_vector` takes both)
            parsed = refused is not None and straight and vector_fits(svec) and \
                vector_fits(rvec)
        if rvec is not None and svec is not None and not aliased(svec.m, rvec.m):
            send, recv = svec.m, rvec.m
            si, ri = send.itemsize, recv.itemsize
            local = 1 + max(svec.largest * si, rvec.largest * ri)
            if not alone(ALLTOALLV, local, size):
                pairs = pairs_sent(rank, svec, si) + pairs_received(rank, rvec, ri)
    state, agreed, code = settle(self, ALLTOALLV, eligible, local, size, -1, pairs, refused,
                                 None, parsed)
    if code <= 0:
        if code == 0:
            to_mpi(self)
        t = clock()
        pass_vector(self, CXL_MPI_ALLTOALLV, sendbuf, recvbuf, -1, None, svec, rvec)
        passed(ALLTOALLV, t0)
    else:
        t = now()
        if not time_all:
            t0 = t
        zc = run(self, ALLTOALLV, code, _stock_alltoallv, (self, sendbuf, recvbuf,),
                 state.pool.exchange,
                 ([send.address + svec.displs[i] * si for i in range(size)],
                  [svec.counts[i] * si for i in range(size)],
                  [recv.address + rvec.displs[i] * ri for i in range(size)],
                  [rvec.counts[i] * ri for i in range(size)], agreed - 1, "Alltoallv"))
        if zc >= 0:
            pooled(ALLTOALLV, send.count * si, t0)
    if state is not None:
        took(state, ALLTOALLV, (agreed - 1) * size, code, zc, t)


def Reduce_scatter_block(self, sendbuf, recvbuf, op=MPI.SUM):
    """Reduce-Scatter Block (every rank gets one equal block)."""
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


cdef Plan nb_plan_scatter(object comm, object sendbuf, object recvbuf, int root):
    """Iscatter: decided from the block every rank receives (the root's
    own, or, where it receives nothing of its own -- in place, None, no
    elements, as mpi4py passes them -- its send block).  The root posts
    the block it sends, so that where it is not what another rank
    receives, every rank raises the mismatch (stock: a truncation, where a
    receiver names less) -- receive buffers that name more than the root
    sends, which MPICH takes, too: a posted call has no header step to
    learn the root's block from, as the blocking Scatter does."""
    cdef int size = comm_size(comm), rank = comm_rank(comm), d
    if not nb_on or not nb_every or disabled or not 0 <= root < size:
        return None
    cdef Message send = None, recv = None
    cdef Py_ssize_t block = 0, stride = 0
    zeros = [0] * size
    recv_addrs, recv_sizes = list(zeros), list(zeros)
    if rank != root:
        recv = message(recvbuf, True, 0, 0, STAGE_ANY)
        if recv is None:
            return None
        recv_addrs[root], recv_sizes[root] = recv.address, recv.nbytes
        return planned(comm, SCATTER, recv.nbytes * size, "post_exchange",
                       (zeros, zeros, recv_addrs, recv_sizes, recv.nbytes, "Iscatter", root),
                       (), (recv,))
    send = message(sendbuf, False, size, 0, STAGE_ANY)
    if send is None:
        return None
    block = stride = send.nbytes
    if recvbuf is not None and recvbuf is not _IN_PLACE:
        recv = message(recvbuf, True, 0, 0, STAGE_ANY)
        if recv is None or aliased(send, recv):
            return None
        if recv.nbytes == 0:
            recv = None   # (MPI copies nothing out of its own block)
        else:
            block = recv.nbytes
    send_addrs = [send.address + d * stride for d in range(size)]
    send_sizes = [stride] * size
    recv_addrs[root] = send_addrs[root] if recv is None else recv.address
    recv_sizes[root] = send_sizes[root] = min(block, stride)   # (its own block)
    return planned(comm, SCATTER, block * size, "post_exchange",
                   (send_addrs, send_sizes, recv_addrs, recv_sizes, stride, "Iscatter", root),
                   (send,), (recv,) if recv is not None else ())


def Ialltoall(self, sendbuf, recvbuf):
    """Nonblocking All to All."""
    enter_posting(self)
    plan = nb_plan_move(self, ALLTOALL, sendbuf, recvbuf)
    return nb_request(self, plan, ALLTOALL, _I.Ialltoall, (sendbuf, recvbuf), False)


def Iscatter(self, sendbuf, recvbuf, int root=0):
    """Nonblocking Scatter."""
    enter_posting(self)
    return nb_request(self, nb_plan_scatter(self, sendbuf, recvbuf, root), SCATTER,
                      _I.Iscatter, (sendbuf, recvbuf, root), False)


def Iscatterv(self, sendbuf, recvbuf, int root=0):
    """Nonblocking Scatter Vector (MPI's: only the root knows every count,
    and a posted call has no header step to tell the others)."""
    return nb_passed(SCATTERV, _I.Iscatterv(self, sendbuf, recvbuf, root))


def Ialltoallv(self, sendbuf, recvbuf):
    """Nonblocking All to All Vector (MPI's: each rank knows its own
    counts only)."""
    return nb_passed(ALLTOALLV, _I.Ialltoallv(self, sendbuf, recvbuf))


def Ireduce_scatter_block(self, sendbuf, recvbuf, op=MPI.SUM):
    """Nonblocking Reduce-Scatter Block."""
    enter_posting(self)
    plan = nb_plan_reduce_scatter_block(self, sendbuf, recvbuf, op)
    return nb_request(self, plan, REDUCE_SCATTER_BLOCK,
                      _I.Ireduce_scatter_block, (sendbuf, recvbuf, op), False)


def Ireduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=MPI.SUM):
    """Nonblocking Reduce-Scatter."""
    enter_posting(self)
    return nb_request(self, nb_plan_reduce_scatter(self, sendbuf, recvbuf, recvcounts, op),
                      REDUCE_SCATTER, _I.Ireduce_scatter, (sendbuf, recvbuf, recvcounts, op),
                      False)


def Alltoall_init(self, sendbuf, recvbuf, info=MPI.INFO_NULL):
    """Persistent Alltoall."""
    enter_posting(self)
    plan = nb_plan_move(self, ALLTOALL, sendbuf, recvbuf)
    return nb_request(self, plan, ALLTOALL, _I.Alltoall_init, (sendbuf, recvbuf, info), True)


def Reduce_scatter_block_init(self, sendbuf, recvbuf, op=MPI.SUM, info=MPI.INFO_NULL):
    """Persistent Reduce-Scatter Block."""
    enter_posting(self)
    plan = nb_plan_reduce_scatter_block(self, sendbuf, recvbuf, op)
    return nb_request(self, plan, REDUCE_SCATTER_BLOCK,
                      _I.Reduce_scatter_block_init, (sendbuf, recvbuf, op, info), True)


def Scatter_init(self, sendbuf, recvbuf, int root=0, info=MPI.INFO_NULL):
    """Persistent Scatter."""
    enter_posting(self)
    return nb_request(self, nb_plan_scatter(self, sendbuf, recvbuf, root), SCATTER,
                      _I.Scatter_init, (sendbuf, recvbuf, root, info), True)


def Scatterv_init(self, sendbuf, recvbuf, int root=0, info=MPI.INFO_NULL):
    """Persistent Scatterv (MPI's, as Iscatterv)."""
    return nb_passed(SCATTERV, _I.Scatterv_init(self, sendbuf, recvbuf, root, info))


def Alltoallv_init(self, sendbuf, recvbuf, info=MPI.INFO_NULL):
    """Persistent Alltoallv (MPI's, as Ialltoallv)."""
    return nb_passed(ALLTOALLV, _I.Alltoallv_init(self, sendbuf, recvbuf, info))


def Reduce_scatter_init(self, sendbuf, recvbuf, recvcounts=None, op=MPI.SUM,
                        info=MPI.INFO_NULL):
    """Persistent Reduce-Scatter."""
    enter_posting(self)
    return nb_request(self, nb_plan_reduce_scatter(self, sendbuf, recvbuf, recvcounts, op),
                      REDUCE_SCATTER, _I.Reduce_scatter_init,
                      (sendbuf, recvbuf, recvcounts, op, info), True)

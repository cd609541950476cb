# The personalized exchanges, Scatter(v) and Alltoall(v), as CXLComm
# intercepts them: Pool.exchange (pyx/pool/exchange.pxi) runs them
# (Reduce_scatter: shim/reduce_scatter.pxi).  Scatter(v) and
# Alltoallv settle their path in a header step (`settle_rooted`,
# `settle_rooted_v`, `settle`).  Module-level functions, bound as methods of CommBase in
# pyx/_shim.pyx; their nonblocking and persistent forms end the file.
# (part of cxlmpi._shim: included by pyx/_shim.pyx)


def Scatter(self, sendbuf, recvbuf, int root=0):
    """Scatter data from one process to all other processes.  A receive
    buffer may name more than the root sends (MPICH takes it), and only
    the root knows the block: the ranks settle the path in a header step
    (`settle_rooted`).  A root whose receive buffer is None (IN_PLACE to
    mpi4py) sends the call to MPI, and its peers follow: MPI's Scatter does
    not make a receiver wait for the others, the pool's does, and programs
    lean on that (tests/scripts/run_ahead.py)."""
    enter(self)
    cdef double t0 = start(), t
    cdef Message send, recv
    cdef int size = comm_size(self), rank = comm_rank(self), code, zc = 0
    cdef Py_ssize_t block = 0
    if 0 <= root < size and rooted_skip(self, SCATTER, sendbuf, recvbuf, rank == root, size):
        to_mpi(self)
        pass_move(self, CXL_MPI_SCATTER, sendbuf, recvbuf, root)
        passed(SCATTER, t0)
        return
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
    sendbuf = placed(sendbuf)
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
    sendbuf = placed(sendbuf)
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


# ------------------------------------------------ nonblocking and persistent
# The I-forms post the call the plan names (shim/nonblocking.pxi) or pass it
# to stock MPI, counted; the persistent forms plan once, at *_init, and
# every Start posts the same plan.


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
            return refused_here(comm, SCATTER, stride * size,
                                "Iscatter's receive message at the root (a form the pool "
                                "cannot read, or sharing the send buffer's memory)")
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
    sendbuf = placed(sendbuf)
    enter_posting(self)
    plan = nb_plan_move(self, ALLTOALL, sendbuf, recvbuf)
    return nb_request(self, plan, ALLTOALL, _I.Ialltoall, (sendbuf, recvbuf), False)


def Iscatter(self, sendbuf, recvbuf, int root=0):
    """Nonblocking Scatter."""
    enter_posting(self)
    if root == comm_rank(self):
        recvbuf = placed(recvbuf)
    return nb_request(self, nb_plan_scatter(self, sendbuf, recvbuf, root), SCATTER,
                      _I.Iscatter, (sendbuf, recvbuf, root), False)


cdef Plan nb_plan_scatterv(object comm, object sendbuf, object recvbuf, int root):
    """Iscatterv: as Igatherv (shim/gather.pxi), the other way: under
    CXLMPI_TUNING=pool, posted to the pool whatever its size, the largest
    block learnt by the worker, counts checked against what every rank
    receives before any data moves; a message this rank's pool cannot take
    is refused on every rank (`refused_here`)."""
    cdef int size = comm_size(comm), rank = comm_rank(comm), i
    if not nb_on or not nb_every or disabled or not 0 <= root < size:
        return None
    cdef Message recv = None
    cdef Vector vec = None
    cdef Py_ssize_t item
    cdef uint64_t pairs = 0
    try:
        if rank != root:
            recv = message(recvbuf, True, 0, 0, STAGE_ANY)
        else:
            vec = vector(sendbuf, False, size, True)
            if vec is not None and recvbuf is not None and recvbuf is not _IN_PLACE:
                recv = message(recvbuf, True, 0, 0, STAGE_ANY)
                if recv is None or aliased(recv, vec.m):
                    vec = None
    except Exception as err:
        return refused_here(comm, SCATTERV, 0, err, True)
    zeros = [0] * size
    recv_addrs, recv_sizes = list(zeros), list(zeros)
    if rank != root:
        if recv is None:
            return refused_here(comm, SCATTERV, 0, "Iscatterv's receive message", True)
        recv_addrs[root], recv_sizes[root] = recv.address, recv.nbytes
        return planned(comm, SCATTERV, recv.nbytes, "post_exchange",
                       (zeros, zeros, recv_addrs, recv_sizes, MAX_VARIES, "Iscatterv", root,
                        -<uint64_t>pair_hash(root, rank, recv.nbytes), recv.nbytes),
                       (), (recv,), True)
    if vec is None:
        return refused_here(comm, SCATTERV, 0, "Iscatterv's messages at the root (a form "
                            "the pool cannot read, or send and receive sharing memory)", True)
    item = vec.m.itemsize
    send_addrs = [vec.m.address + vec.displs[i] * item for i in range(size)]
    send_sizes = [vec.counts[i] * item for i in range(size)]
    for i in range(size):
        if i != root:
            pairs += <uint64_t>pair_hash(root, i, send_sizes[i])
    if recv is not None and recv.nbytes == 0:
        recv = None   # (MPI copies nothing out of its own block)
    if recv is None:
        recv_addrs[root], recv_sizes[root] = send_addrs[root], send_sizes[root]
    else:
        pairs += <uint64_t>pair_hash(root, root, send_sizes[root]) - \
            <uint64_t>pair_hash(root, root, recv.nbytes)
        recv_addrs[root] = recv.address
        recv_sizes[root] = send_sizes[root] = min(recv.nbytes, send_sizes[root])
    return planned(comm, SCATTERV, vec.m.nbytes, "post_exchange",
                   (send_addrs, send_sizes, recv_addrs, recv_sizes, MAX_VARIES, "Iscatterv",
                    root, pairs, vec.largest * item),
                   (vec.m,), (recv,) if recv is not None else (), True)


cdef Plan nb_plan_alltoallv(object comm, object sendbuf, object recvbuf):
    """Ialltoallv: each rank knows only its own counts; as Igatherv."""
    cdef int size = comm_size(comm), rank = comm_rank(comm), i
    if not nb_on or not nb_every or disabled or sendbuf is _IN_PLACE:
        return None
    cdef Vector rvec = None, svec = None
    try:
        rvec = vector(recvbuf, True, size, True)
        svec = vector(sendbuf, False, size, True) if rvec is not None else None
    except Exception as err:
        return refused_here(comm, ALLTOALLV, 0, err, True)
    if rvec is None or svec is None or aliased(svec.m, rvec.m):
        return refused_here(comm, ALLTOALLV, 0, "Ialltoallv's messages (a form the pool "
                            "cannot read, or send and receive sharing memory)", True)
    cdef Py_ssize_t si = svec.m.itemsize, ri = rvec.m.itemsize
    return planned(comm, ALLTOALLV, svec.m.nbytes, "post_exchange",
                   ([svec.m.address + svec.displs[i] * si for i in range(size)],
                    [svec.counts[i] * si for i in range(size)],
                    [rvec.m.address + rvec.displs[i] * ri for i in range(size)],
                    [rvec.counts[i] * ri for i in range(size)], MAX_VARIES, "Ialltoallv", -1,
                    pairs_sent(rank, svec, si) + pairs_received(rank, rvec, ri),
                    max(svec.largest * si, rvec.largest * ri)),
                   (svec.m,), (rvec.m,), True)


def Iscatterv(self, sendbuf, recvbuf, int root=0):
    """Nonblocking Scatter Vector."""
    enter_posting(self)
    if root == comm_rank(self):
        recvbuf = placed(recvbuf)
    return nb_request(self, nb_plan_scatterv(self, sendbuf, recvbuf, root), SCATTERV,
                      _I.Iscatterv, (sendbuf, recvbuf, root), False)


def Ialltoallv(self, sendbuf, recvbuf):
    """Nonblocking All to All Vector."""
    sendbuf = placed(sendbuf)
    enter_posting(self)
    return nb_request(self, nb_plan_alltoallv(self, sendbuf, recvbuf), ALLTOALLV,
                      _I.Ialltoallv, (sendbuf, recvbuf), False)


def Alltoall_init(self, sendbuf, recvbuf, info=MPI.INFO_NULL):
    """Persistent Alltoall."""
    sendbuf = placed(sendbuf)
    enter_init(self)
    plan = init_plan(self, lambda: nb_plan_move(self, ALLTOALL, sendbuf, recvbuf))
    return nb_request(self, plan, ALLTOALL, _I.Alltoall_init, (sendbuf, recvbuf, info), True)


def Scatter_init(self, sendbuf, recvbuf, int root=0, info=MPI.INFO_NULL):
    """Persistent Scatter."""
    enter_init(self)
    if root == comm_rank(self):
        recvbuf = placed(recvbuf)
    plan = init_plan(self, lambda: nb_plan_scatter(self, sendbuf, recvbuf, root))
    return nb_request(self, plan, SCATTER,
                      _I.Scatter_init, (sendbuf, recvbuf, root, info), True)


def Scatterv_init(self, sendbuf, recvbuf, int root=0, info=MPI.INFO_NULL):
    """Persistent Scatterv."""
    enter_init(self)
    if root == comm_rank(self):
        recvbuf = placed(recvbuf)
    plan = init_plan(self, lambda: nb_plan_scatterv(self, sendbuf, recvbuf, root))
    return nb_request(self, plan, SCATTERV,
                      _I.Scatterv_init, (sendbuf, recvbuf, root, info), True)


def Alltoallv_init(self, sendbuf, recvbuf, info=MPI.INFO_NULL):
    """Persistent Alltoallv."""
    sendbuf = placed(sendbuf)
    enter_init(self)
    plan = init_plan(self, lambda: nb_plan_alltoallv(self, sendbuf, recvbuf))
    return nb_request(self, plan, ALLTOALLV,
                      _I.Alltoallv_init, (sendbuf, recvbuf, info), True)

# Allgather(v) and Gather(v), as CXLComm intercepts them: Pool.gather
# (pyx/pool/gather.pxi) runs them all.  Gatherv's counts are known only at
# the root, so its ranks settle the path in a header step
# (`settle_rooted_v`); so do Gather's (`settle_rooted`), whose root may name
# more than arrives.  Module-level functions, bound as methods of CommBase
# in pyx/_shim.pyx; their nonblocking and persistent forms end the file.
# (part of cxlmpi._shim: included by pyx/_shim.pyx)


def Allgather(self, sendbuf, recvbuf):
    """Gather to All."""
    sendbuf = placed(sendbuf)
    enter(self)
    cdef double t0 = start(), t
    cdef int size = comm_size(self), rank = comm_rank(self), code = 0, zc = 0
    # Decided from the block this rank sends (all send alike), never from
    # its receive buffer, which may name more (MPICH takes it): a rank
    # whose receive blocks are not its send block sends the call to MPI,
    # after the pool's set-up, which every rank then meets alike.
    cdef bint inplace = sendbuf is _IN_PLACE
    if disabled or skip(self, ALLGATHER, recvbuf if inplace else sendbuf,
                        1 if inplace else size):
        to_mpi(self)
        pass_move(self, CXL_MPI_ALLGATHER, sendbuf, recvbuf, -1)
        passed(ALLGATHER, t0)
        return
    cdef Message send = None, recv = None, pr
    cdef Py_ssize_t block = -1
    pr = recv = message(recvbuf, True, size, lo[ALLGATHER])
    if inplace:
        block = recv.nbytes if recv is not None else -1
    else:
        send = message(sendbuf, False, 0, lo[ALLGATHER] // size)
        block = send.nbytes if send is not None else -1
        if recv is not None and (send is None or send.nbytes != recv.nbytes
                                 or aliased(send, recv)):
            recv = None
    state = state_of(self, ALLGATHER) if block >= 0 and within(ALLGATHER, block * size) \
        else None
    if state is not None:
        code = take(self, state, ALLGATHER, block * size, -1,
                    send.address if send is not None else 0, block,
                    recv.address if recv is not None else 0, block * size)
        if recv is None and code > 0:
            code = 0   # (its peers follow it to MPI)
    if code <= 0:
        if code == 0:
            to_mpi(self)
        t = clock()
        pass_move(self, CXL_MPI_ALLGATHER, sendbuf, recvbuf, -1, send, pr, pr is not None)
        passed(ALLGATHER, t0)
    else:
        t = now()
        if not time_all:
            t0 = t
        block = recv.nbytes
        addrs = [recv.address + q * block for q in range(size)]
        sendaddr = addrs[rank] if send is None else send.address
        fill(recv if send is None else send)
        zc = run(self, ALLGATHER, code, _stock_allgather, (self, sendbuf, recvbuf,),
                 state.pool.gather, (sendaddr, block, addrs, [block] * size, -1, block,
                                     "Allgather"))
        if zc >= 0:
            drain(recv)
            pooled(ALLGATHER, block * size, t0)
    if state is not None:
        took(state, ALLGATHER, block * size, code, zc, t)


def Allgatherv(self, sendbuf, recvbuf):
    """Gather to All Vector (the receive counts are known on every rank)."""
    sendbuf = placed(sendbuf)
    enter(self)
    cdef double t0 = start(), t
    cdef Message send = None, recv = None
    cdef Vector vec = None
    cdef int size = comm_size(self), rank = comm_rank(self), code = 0, zc = 0
    cdef bint fits = False
    cdef Py_ssize_t i
    cdef uint64_t pairs
    if not disabled:
        vec = vector(recvbuf, True, size, True)
        if vec is not None:
            recv = vec.m
            if sendbuf is not _IN_PLACE:
                send = message(sendbuf, False)
            # the pool's set-up (collective) from what every rank holds
            # alike, the counts; a rank whose own block is not the one it
            # names sends the call to MPI after it (its peers follow)
            fits = send is not None and send.nbytes == vec.counts[rank] * recv.itemsize \
                and not aliased(send, recv) or sendbuf is _IN_PLACE
    state = state_of(self, ALLGATHERV) if vec is not None and within(ALLGATHERV, recv.nbytes) \
        else None
    if state is not None:
        code = take(self, state, ALLGATHERV, recv.nbytes, -1)
        if not fits and code > 0:
            code = 0
    if code <= 0:
        if code == 0:
            to_mpi(self)
        t = clock()
        pass_vector(self, CXL_MPI_ALLGATHERV, sendbuf, recvbuf, -1, send, vec)
        passed(ALLGATHERV, t0)
    else:
        t = now()
        if not time_all:
            t0 = t
        item = recv.itemsize
        addrs = [recv.address + vec.displs[i] * item for i in range(size)]
        sizes = [vec.counts[i] * item for i in range(size)]
        sendaddr = addrs[rank] if send is None else send.address
        fill(recv if send is None else send)
        # every rank's counts must agree with what each sender sends
        pairs = pairs_received(rank, vec, item)
        for i in range(size):
            pairs += <uint64_t>pair_hash(rank, i, sizes[rank])
        zc = run(self, ALLGATHERV, code, _stock_allgatherv, (self, sendbuf, recvbuf,),
                 state.pool.gather, (sendaddr, sizes[rank], addrs, sizes, -1,
                                     vec.largest * item, "Allgatherv", pairs))
        if zc >= 0:
            drain(recv)
            pooled(ALLGATHERV, recv.nbytes, t0)
    if state is not None:
        took(state, ALLGATHERV, recv.nbytes, code, zc, t)


def Gather(self, sendbuf, recvbuf, int root=0):
    """Gather together values from a group of processes.  The root's
    buffer may name more than the others send (MPICH takes it): the ranks
    settle the path in a header step (`settle_rooted`)."""
    enter(self)
    if root == comm_rank(self):
        sendbuf = placed(sendbuf)
    cdef double t0 = start(), t
    cdef Message send, recv
    cdef int size = comm_size(self), rank = comm_rank(self), code, zc = 0
    cdef Py_ssize_t block = 0
    if 0 <= root < size and rooted_skip(self, GATHER, recvbuf, sendbuf, rank == root, size):
        to_mpi(self)
        pass_move(self, CXL_MPI_GATHER, sendbuf, recvbuf, root)
        passed(GATHER, t0)
        return
    state, agreed, code, recv, send, parsed = settle_rooted(
        self, GATHER, sendbuf, recvbuf, root, size, rank)
    if code <= 0:
        if code == 0:
            to_mpi(self)
        t = clock()
        pass_move(self, CXL_MPI_GATHER, sendbuf, recvbuf, root, send, recv, parsed)
        passed(GATHER, t0)
    else:
        t = now()
        if not time_all:
            t0 = t
        block = agreed - 1   # (every block: the checksum added up)
        if rank == root:
            addrs = [recv.address + q * block for q in range(size)]
        else:
            addrs = [0] * size
        sendaddr = addrs[rank] if send is None else send.address
        fill(recv if send is None else send)
        zc = run(self, GATHER, code, _stock_gather, (self, sendbuf, recvbuf, root,),
                 state.pool.gather, (sendaddr, block, addrs, [block] * size, root, block,
                                     "Gather"))
        if zc >= 0:
            drain(recv)
            pooled(GATHER, block * size, t0)
    if state is not None:
        took(state, GATHER, (agreed - 1) * size, code, zc, t)


def Gatherv(self, sendbuf, recvbuf, int root=0):
    """Gather Vector.  Only the root knows every count, so the ranks
    agree in a header step of the control lines: each publishes its
    largest block (or that it cannot take the pool path) and all decide
    from the maximum alike.  A rank whose own blocks are below the pool's
    window (the root: every block) sends the call to MPI at once, and the
    others follow it (`alone`)."""
    enter(self)
    if root == comm_rank(self):
        sendbuf = placed(sendbuf)
    cdef double t0 = start(), t
    cdef Message send
    cdef Vector vec
    cdef int size = comm_size(self), rank = comm_rank(self), code, zc = 0
    cdef Py_ssize_t i
    state, agreed, code, vec, send = settle_rooted_v(
        self, GATHERV, recvbuf, True, sendbuf, root, size, rank)
    if code <= 0:
        if code == 0:
            to_mpi(self)
        t = clock()
        pass_vector(self, CXL_MPI_GATHERV, sendbuf, recvbuf, root, send, vec)
        passed(GATHERV, t0)
    else:
        t = now()
        if not time_all:
            t0 = t
        if rank == root:
            item = vec.m.itemsize
            addrs = [vec.m.address + vec.displs[i] * item for i in range(size)]
            sizes = [vec.counts[i] * item for i in range(size)]
            sendaddr = addrs[rank] if send is None else send.address
            nbytes = sizes[rank]
        else:
            addrs = [0] * size
            sizes = [0] * size
            sendaddr = send.address
            nbytes = send.nbytes
        zc = run(self, GATHERV, code, _stock_gatherv, (self, sendbuf, recvbuf, root,),
                 state.pool.gather, (sendaddr, nbytes, addrs, sizes, root, agreed - 1,
                                     "Gatherv"))
        if zc >= 0:
            pooled(GATHERV, sum(sizes) if rank == root else nbytes, t0)
    if state is not None:
        took(state, GATHERV, (agreed - 1) * size, code, zc, t)


# ------------------------------------------------ nonblocking and persistent
# The I-forms post the call the plan names (shim/nonblocking.pxi) or pass it
# to stock MPI, counted; the persistent forms plan once, at *_init, and
# every Start posts the same plan.


cdef Plan nb_plan_move(object comm, int which, object sendbuf, object recvbuf):
    """Iallgather and Ialltoall: decided from the block each rank sends (all
    send alike)."""
    if not nb_on or disabled or which == ALLTOALL and not nb_every:
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
            return refused_here(comm, which, block * size,
                                "the send message (a form the pool cannot read, another "
                                "size than the receive blocks, or sharing their memory)")
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


def Iallgather(self, sendbuf, recvbuf):
    """Nonblocking Gather to All."""
    sendbuf = placed(sendbuf)
    enter_posting(self)
    plan = None if posted_small(recvbuf, ALLGATHER) else \
        nb_plan_move(self, ALLGATHER, sendbuf, recvbuf)
    return nb_request(self, plan, ALLGATHER, _I.Iallgather, (sendbuf, recvbuf), False)


cdef Plan nb_plan_allgatherv(object comm, object sendbuf, object recvbuf):
    """Iallgatherv: decided from the counts, which every rank holds."""
    if not nb_on or disabled:
        return None
    cdef int size = comm_size(comm), rank = comm_rank(comm), i
    cdef Vector vec = vector(recvbuf, True, size, True)
    if vec is None:
        return None
    cdef Message recv = vec.m, send = None
    cdef Py_ssize_t item = recv.itemsize
    if sendbuf is not _IN_PLACE:
        send = message(sendbuf, False)
        if send is None or send.nbytes != vec.counts[rank] * item or aliased(send, recv):
            return refused_here(comm, ALLGATHERV, recv.nbytes,
                                "Iallgatherv's send message (a form the pool cannot read, "
                                "a size its count does not name, or sharing the receive "
                                "buffer's memory)")
    addrs = [recv.address + vec.displs[i] * item for i in range(size)]
    sizes = [vec.counts[i] * item for i in range(size)]
    # every rank's counts must agree with what each sender sends
    cdef uint64_t pairs = pairs_received(rank, vec, item)
    for i in range(size):
        pairs += <uint64_t>pair_hash(rank, i, sizes[rank])
    return planned(comm, ALLGATHERV, recv.nbytes, "post_gather",
                   (addrs[rank] if send is None else send.address, sizes[rank], addrs, sizes,
                    -1, vec.largest * item, "Iallgatherv", pairs),
                   (recv if send is None else send,), (recv,))


cdef Plan nb_plan_gather(object comm, object sendbuf, object recvbuf, int root):
    """Igather: decided from the block every rank sends (the root's own,
    or, where it sends nothing of its own -- in place, None, no elements, as
    mpi4py passes them -- its receive block).  The root posts the block its
    buffer holds where that is smaller than what it sends (stock: a
    truncation), and every rank raises the mismatch: never a write past
    its blocks.  Receive blocks larger than the others send, which the
    blocking Gather learns of in its header step, meet the mismatch too
    where the root sends nothing of its own (a posted call never waits for
    its peers to learn a size)."""
    cdef int size = comm_size(comm), rank = comm_rank(comm), q
    if not nb_on or not nb_every or disabled or not 0 <= root < size:
        return None
    cdef Message send = None, recv = None
    cdef Py_ssize_t block = 0, stride = 0
    if rank == root:
        recv = message(recvbuf, True, size, 0, STAGE_ANY)
        if recv is None:
            return None
        block = stride = recv.nbytes
        if sendbuf is not None and sendbuf is not _IN_PLACE:
            send = message(sendbuf, False, 0, 0, STAGE_ANY)
            if send is None or aliased(send, recv):
                return refused_here(comm, GATHER, stride * size,
                                    "Igather's send message at the root (a form the pool "
                                    "cannot read, or sharing the receive buffer's memory)")
            if send.nbytes == 0:
                send = None   # (MPI copies nothing into its own block)
            else:
                block = send.nbytes
    else:
        send = message(sendbuf, False, 0, 0, STAGE_ANY)
        if send is None:
            return None
        return planned(comm, GATHER, send.nbytes * size, "post_gather",
                       (send.address, send.nbytes, [0] * size, [send.nbytes] * size, root,
                        send.nbytes, "Igather"), (send,), ())
    cdef Py_ssize_t got = min(block, stride)
    addrs = [recv.address + q * stride for q in range(size)]
    return planned(comm, GATHER, block * size, "post_gather",
                   (addrs[rank] if send is None else send.address, got, addrs, [got] * size,
                    root, got, "Igather"), (recv if send is None else send,), (recv,))


def Iallgatherv(self, sendbuf, recvbuf):
    """Nonblocking Gather to All Vector."""
    sendbuf = placed(sendbuf)
    enter_posting(self)
    return nb_request(self, nb_plan_allgatherv(self, sendbuf, recvbuf), ALLGATHERV,
                      _I.Iallgatherv, (sendbuf, recvbuf), False)


def Igather(self, sendbuf, recvbuf, int root=0):
    """Nonblocking Gather."""
    enter_posting(self)
    if root == comm_rank(self):
        sendbuf = placed(sendbuf)
    return nb_request(self, nb_plan_gather(self, sendbuf, recvbuf, root), GATHER,
                      _I.Igather, (sendbuf, recvbuf, root), False)


cdef Plan nb_plan_gatherv(object comm, object sendbuf, object recvbuf, int root):
    """Igatherv: only the root knows every count, so no size decides its
    path (a posted call has no header step before it returns): under
    CXLMPI_TUNING=pool every rank posts it to the pool, whatever its size,
    and the worker learns the largest block first (MAX_VARIES).  Counts
    that differ from what a rank sends -- the root's own block included,
    of which it copies no more than both name -- fail every rank (the
    block checksum) before any data moves; so does a message this rank's
    pool cannot take (`refused_here`: never MPI alone)."""
    cdef int size = comm_size(comm), rank = comm_rank(comm), i
    if not nb_on or not nb_every or disabled or not 0 <= root < size:
        return None
    cdef Message send = None
    cdef Vector vec = None
    cdef Py_ssize_t item, own
    cdef uint64_t pairs = 0
    try:
        if rank != root:
            send = message(sendbuf, False, 0, 0, STAGE_ANY)
        else:
            vec = vector(recvbuf, True, size, True)
            if vec is not None and sendbuf is not None and sendbuf is not _IN_PLACE:
                send = message(sendbuf, False, 0, 0, STAGE_ANY)
                if send is None or aliased(send, vec.m):
                    vec = None
    except Exception as err:
        return refused_here(comm, GATHERV, 0, err, True)
    if rank != root:
        if send is None:
            return refused_here(comm, GATHERV, 0, "Igatherv's send message", True)
        return planned(comm, GATHERV, send.nbytes, "post_gather",
                       (send.address, send.nbytes, [0] * size, [0] * size, root, MAX_VARIES,
                        "Igatherv", <uint64_t>pair_hash(rank, root, send.nbytes),
                        send.nbytes), (send,), (), True)
    if vec is None:
        return refused_here(comm, GATHERV, 0, "Igatherv's messages at the root (a form "
                            "the pool cannot read, or send and receive sharing memory)", True)
    item = vec.m.itemsize
    addrs = [vec.m.address + vec.displs[i] * item for i in range(size)]
    sizes = [vec.counts[i] * item for i in range(size)]
    for i in range(size):
        if i != root:
            pairs -= <uint64_t>pair_hash(i, root, sizes[i])
    if send is not None:
        own = send.nbytes
        if own == 0:
            send = None   # (MPI copies nothing into its own block)
        else:
            pairs += <uint64_t>pair_hash(root, root, own) - \
                <uint64_t>pair_hash(root, root, sizes[root])
            sizes[root] = min(own, sizes[root])
    return planned(comm, GATHERV, vec.m.nbytes, "post_gather",
                   (addrs[root] if send is None else send.address, sizes[root], addrs, sizes,
                    root, MAX_VARIES, "Igatherv", pairs, vec.largest * item),
                   (vec.m if send is None else send,), (vec.m,), True)


def Igatherv(self, sendbuf, recvbuf, int root=0):
    """Nonblocking Gather Vector."""
    enter_posting(self)
    if root == comm_rank(self):
        sendbuf = placed(sendbuf)
    return nb_request(self, nb_plan_gatherv(self, sendbuf, recvbuf, root), GATHERV,
                      _I.Igatherv, (sendbuf, recvbuf, root), False)


def Allgather_init(self, sendbuf, recvbuf, info=MPI.INFO_NULL):
    """Persistent Allgather."""
    sendbuf = placed(sendbuf)
    enter_init(self)
    plan = init_plan(self, lambda: nb_plan_move(self, ALLGATHER, sendbuf, recvbuf))
    return nb_request(self, plan, ALLGATHER, _I.Allgather_init, (sendbuf, recvbuf, info), True)


def Allgatherv_init(self, sendbuf, recvbuf, info=MPI.INFO_NULL):
    """Persistent Allgatherv."""
    sendbuf = placed(sendbuf)
    enter_init(self)
    plan = init_plan(self, lambda: nb_plan_allgatherv(self, sendbuf, recvbuf))
    return nb_request(self, plan, ALLGATHERV,
                      _I.Allgatherv_init, (sendbuf, recvbuf, info), True)


def Gather_init(self, sendbuf, recvbuf, int root=0, info=MPI.INFO_NULL):
    """Persistent Gather."""
    enter_init(self)
    if root == comm_rank(self):
        sendbuf = placed(sendbuf)
    plan = init_plan(self, lambda: nb_plan_gather(self, sendbuf, recvbuf, root))
    return nb_request(self, plan, GATHER,
                      _I.Gather_init, (sendbuf, recvbuf, root, info), True)


def Gatherv_init(self, sendbuf, recvbuf, int root=0, info=MPI.INFO_NULL):
    """Persistent Gatherv."""
    enter_init(self)
    if root == comm_rank(self):
        sendbuf = placed(sendbuf)
    plan = init_plan(self, lambda: nb_plan_gatherv(self, sendbuf, recvbuf, root))
    return nb_request(self, plan, GATHERV,
                      _I.Gatherv_init, (sendbuf, recvbuf, root, info), True)

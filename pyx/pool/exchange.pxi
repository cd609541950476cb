# Personalized exchanges: Alltoall(v), Scatter(v) and Reduce_scatter(_block),
# through per-destination sub-slots or straight between pool buffers
# (run_exchange and run_reduce_scatter choose).
# (part of cxlmpi._pool: included by pyx/_pool.pyx)


cdef int alg_exchange(state_t *st, const char **send_addr, const size_t *send_nbytes,
                      char **recv_addr, const size_t *recv_nbytes,
                      size_t nsteps, size_t sub) noexcept nogil:
    """Alltoall(v) and Scatter(v): personalized exchange.  A half is cut into
    p sub-slots of `sub` bytes, sub-slot d for the data going to rank d; each
    step every rank puts up to `sub` more bytes for each peer in its
    sub-slots, and every rank copies the bytes meant for it out of every
    peer's half.  This rank's own block is copied directly."""
    cdef size_t j, off, n
    cdef int q, rc, me = st.rank
    cdef char *mine
    cdef const char *src
    if recv_addr[me] != send_addr[me]:
        cxl_copy(recv_addr[me], send_addr[me], min_size(send_nbytes[me], recv_nbytes[me]))
    for j in range(nsteps):
        off = j * sub
        mine = half_ptr(st, me, st.step + 1)
        for q in range(st.size):
            if q != me and off < send_nbytes[q]:
                n = min_size(sub, send_nbytes[q] - off)
                copy_in(st, mine + q * sub, send_addr[q] + off, n)
        rc = step_all(st)
        if rc != OK:
            return rc
        for q in range(st.size):
            if q != me and off < recv_nbytes[q]:
                n = min_size(sub, recv_nbytes[q] - off)
                src = half_ptr(st, q, st.step) + me * sub
                will_read(st, src, n)
                cxl_copy(recv_addr[q] + off, src, n)
    return OK


cdef int alg_exchange_push(state_t *st, const char **send_addr, const size_t *send_nbytes,
                           char **recv_addr, const size_t *recv_nbytes) noexcept nogil:
    """Every receive block is in the pool: each rank copies its block for
    each rank straight into that rank's receive buffer (never more than the
    receiver said it takes), then one completion step; in sw mode each rank
    then drops stale lines of its receive buffer."""
    cdef int d, q, p = st.size, me = st.rank
    cdef const uint64_t *table
    cdef uint64_t at
    cdef size_t n
    cdef char *dst
    for d in range(p):
        if d == me:
            n = min_size(send_nbytes[me], recv_nbytes[me])
            if n and <const char *>recv_addr[me] != send_addr[me]:
                cxl_copy(recv_addr[me], send_addr[me], n)
            continue
        table = <const uint64_t *>half_ptr(st, d, st.step)
        n = min_size(send_nbytes[d], table[2 * p + me])
        n = min_size(n, arena_room(st, table[p + me]))
        if n == 0:
            continue
        at = table[p + me] - 1
        dst = st.heap + at
        cxl_copy(dst, send_addr[d], n)
        wrote(st, dst, n)
    rc = step_all(st)
    if rc == OK and st.sw:
        for q in range(p):
            if q != me:
                will_read(st, recv_addr[q], recv_nbytes[q])
    return rc


cdef int alg_exchange_pull(state_t *st, const char **send_addr, const size_t *send_nbytes,
                           char **recv_addr, const size_t *recv_nbytes) noexcept nogil:
    """Every block is in the pool: each rank copies the blocks meant for it
    straight from their owners' buffers (the table of the header step is
    still in every rank's half), then one completion step."""
    cdef int q, me = st.rank
    cdef uint64_t at
    cdef size_t n
    cdef const char *src
    for q in range(st.size):
        if q == me:
            src = send_addr[me]
            n = min_size(send_nbytes[me], recv_nbytes[me])
        else:
            at = (<const uint64_t *>half_ptr(st, q, st.step))[me]
            n = min_size(recv_nbytes[q], arena_room(st, at))
            src = st.heap + at - 1
        if n and <const char *>recv_addr[q] != src:
            will_read(st, src, n)
            cxl_copy(recv_addr[q], src, n)
    return step_all(st)


cdef int exchange_direct(state_t *st, const char **send_addr,
                         const size_t *send_nbytes, char **recv_addr,
                         const size_t *recv_nbytes, bint *done) noexcept nogil:
    """The header step of a personalized exchange, then pull or push when
    the tables allow it (`done`); else the caller copies through the halves."""
    cdef bint pull = False, push = False
    cdef int rc = publish_block_offsets(st, send_addr, send_nbytes, recv_addr, recv_nbytes,
                                        &pull, &push)
    done[0] = rc == OK and (pull or push)
    if rc != OK or not done[0]:
        return rc
    st.took_zc = 1
    if pull:
        return alg_exchange_pull(st, send_addr, send_nbytes, recv_addr, recv_nbytes)
    return alg_exchange_push(st, send_addr, send_nbytes, recv_addr, recv_nbytes)


cdef int alg_reduce_scatter_pull(state_t *st, cxl_reduce_fn fn, char *recvbuf,
                                 size_t count, size_t itemsize) noexcept nogil:
    """Every piece is in the pool: each rank folds the pieces meant for it
    straight from their owners' buffers into its receive buffer."""
    cdef const char *src[MAX_ZC_RANKS]
    cdef char *dst[1]
    cdef uint64_t at
    cdef int q
    for q in range(st.size):
        at = (<const uint64_t *>half_ptr(st, q, st.step))[st.rank]
        if arena_room(st, at) < count * itemsize:
            at = 1  # a piece shorter than this rank's count: erroneous, stay inside
        src[q] = st.heap + at - 1
    dst[0] = recvbuf
    if count:
        alg_reduce_direct(st, fn, src, dst, 1, 0, count, itemsize)
    return step_all(st)


cdef int alg_reduce_scatter(state_t *st, const char **send_addr,
                            const size_t *counts, char *recvbuf, size_t itemsize,
                            cxl_reduce_fn fn, size_t nsteps, size_t sub_count,
                            bint inplace) noexcept nogil:
    """Reduce_scatter(_block): rank d's result is the rank-order fold of
    every rank's piece d (`counts[d]` elements at `send_addr[d]`).  Pieces
    travel as in alg_exchange, `sub_count` elements a step; the receiver
    folds them straight into its receive buffer, its own piece read from its
    send buffer (or from its pool copy when in place: see `piece`)."""
    cdef size_t j, off, n, my_n
    cdef int q, rc, me = st.rank
    cdef size_t sub = sub_count * itemsize
    cdef char *mine
    for j in range(nsteps):
        off = j * sub_count
        mine = half_ptr(st, me, st.step + 1)
        for q in range(st.size):
            if off < counts[q] and (q != me or (inplace and me != 0)):
                n = min_size(sub_count, counts[q] - off)
                copy_in(st, mine + q * sub, send_addr[q] + off * itemsize, n * itemsize)
        rc = step_all(st)
        if rc != OK:
            return rc
        if off >= counts[me]:
            continue
        my_n = min_size(sub_count, counts[me] - off)
        for q in range(st.size):
            if q != me:
                will_read(st, half_ptr(st, q, st.step) + me * sub, my_n * itemsize)
        for q in range(st.size):
            st.srcs[q] = piece(st, send_addr[me] + off * itemsize, q, inplace, sub)
        fold_block(fn, recvbuf + off * itemsize, st.srcs, st.size, 0, my_n, itemsize)
    return OK


cdef inline const char *piece(state_t *st, const char *own, int q, bint inplace,
                              size_t sub) noexcept nogil:
    """Where rank q's piece for this rank is: the pool, or this rank's own
    send buffer -- unless in place on a rank other than 0, where the result
    (at the start of the buffer) overlaps the own piece at another offset."""
    if q == st.rank and not (inplace and st.rank != 0):
        return own
    return half_ptr(st, q, st.step) + <size_t>st.rank * sub


cdef int run_exchange(state_t *st, const char **send_addr, const size_t *send_nbytes,
                      char **recv_addr, const size_t *recv_nbytes, size_t max_nbytes,
                      int flags) noexcept nogil:
    """Alltoall(v) and Scatter(v), with the variant `flags` (V_*):
    `send_*[d]` goes to rank d, `recv_*[q]` comes from rank q; `max_nbytes`:
    the largest block between any two ranks (the same everywhere).  A large
    call in a pool with arenas (`zerocopy_tables`) first takes the header
    step of exchange_direct (pull or push between pool buffers); otherwise,
    or where its tables do not allow it, sub-slots of the halves."""
    cdef size_t sub = sub_slot(st, 1, flags)
    cdef int rc = OK
    cdef bint done = False
    if zerocopy_tables(st, max_nbytes * st.size):
        rc = exchange_direct(st, send_addr, send_nbytes, recv_addr, recv_nbytes, &done)
    if rc == OK and not done:
        rc = alg_exchange(st, send_addr, send_nbytes, recv_addr, recv_nbytes,
                          (max_nbytes + sub - 1) // sub, sub)
    return rc


cdef int run_reduce_scatter(state_t *st, const char **send_addr, const size_t *counts,
                            char *recvbuf, size_t itemsize, cxl_reduce_fn fn,
                            bint inplace, int flags) noexcept nogil:
    """Reduce_scatter(_block), with the variant `flags` (V_*):
    `send_addr[d]` is where this rank's piece for rank d starts, `counts[d]`
    its elements (the same on every rank); `inplace`: the pieces are in the
    receive buffer, whose start gets the result.  A large call in a pool
    with arenas (`zerocopy_tables`) first publishes where every piece lives
    and, every piece in the pool, each rank folds its own straight from
    them (alg_reduce_scatter_pull); otherwise the pieces travel through
    sub-slots of the halves."""
    cdef size_t piece_nbytes[MAX_ZC_RANKS]
    cdef char *nowhere[MAX_ZC_RANKS]
    cdef size_t nothing[MAX_ZC_RANKS]
    cdef size_t sub_count = sub_slot(st, itemsize, flags) // itemsize
    cdef size_t nsteps = 0, total = 0
    cdef int q, rc = OK
    cdef bint all_resident = False, push = False
    for q in range(st.size):
        nsteps = max(nsteps, (counts[q] + sub_count - 1) // sub_count)
        total += counts[q] * itemsize
    # In place the result overwrites the start of the send buffer, which
    # rank 0 may still be reading: the copying path then.
    if zerocopy_tables(st, total) and not inplace:
        for q in range(st.size):
            piece_nbytes[q] = counts[q] * itemsize
            nowhere[q] = NULL
            nothing[q] = 0
        rc = publish_block_offsets(st, send_addr, piece_nbytes, nowhere, nothing,
                                   &all_resident, &push)
        if rc == OK and all_resident:
            st.took_zc = 1
            return alg_reduce_scatter_pull(st, fn, recvbuf, counts[st.rank], itemsize)
    if rc == OK:
        rc = alg_reduce_scatter(st, send_addr, counts, recvbuf, itemsize, fn, nsteps,
                                sub_count, inplace)
    return rc

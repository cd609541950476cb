# Gather(v) and Allgather(v): every rank publishes its block, readers copy
# each peer's out, or (run_gather's choice) blocks move straight between
# pool buffers as in a personalized exchange.
# (part of cxlmpi._pool: included by pyx/_pool.pyx)


cdef int alg_gather(state_t *st, const char *sendbuf, size_t send_nbytes,
                    char **recv_addr, const size_t *recv_nbytes, int root,
                    size_t nsteps, size_t chunk) noexcept nogil:
    """Allgather(v) (root < 0) and Gather(v): every rank publishes its block,
    `chunk` bytes a step, in its own half; every reader (every rank, or the
    root) copies each peer's chunk to where that peer's block goes.  A
    reader's own block is copied straight from its send buffer.  A reader
    never copies more than it expects from a peer (`recv_nbytes`)."""
    cdef size_t j, off, n
    cdef int q, rc
    cdef bint reader = root < 0 or root == st.rank
    cdef char *mine
    cdef const char *src
    if reader and recv_addr[st.rank] != sendbuf:
        cxl_copy(recv_addr[st.rank], sendbuf, min_size(send_nbytes, recv_nbytes[st.rank]))
    for j in range(nsteps):
        off = j * chunk
        mine = half_ptr(st, st.rank, st.step + 1)
        if off < send_nbytes:
            n = min_size(chunk, send_nbytes - off)
            copy_in(st, mine, sendbuf + off, n)
        rc = step_all(st)
        if rc != OK:
            return rc
        if reader:
            for q in range(st.size):
                if q == st.rank or off >= recv_nbytes[q]:
                    continue
                n = min_size(chunk, recv_nbytes[q] - off)
                src = half_ptr(st, q, st.step)
                will_read(st, src, n)
                cxl_copy(recv_addr[q] + off, src, n)
    return OK


cdef int run_gather(state_t *st, const char *sendbuf, size_t send_nbytes,
                    char **recv_addr, const size_t *recv_nbytes, int root,
                    size_t max_nbytes, int flags) noexcept nogil:
    """Allgather(v) (root < 0) and Gather(v), with the variant `flags`
    (V_*); `max_nbytes`: the largest block of any rank (the same
    everywhere).  A large call in a pool with arenas (`zerocopy_tables`)
    first runs as a personalized exchange of the same block for every rank
    (exchange_direct: pull or push between pool buffers, off the root of a
    Gather nothing received); otherwise, or where its tables do not allow
    it, every block goes through the halves."""
    cdef const char *send_addr[MAX_ZC_RANKS]
    cdef size_t each_nbytes[MAX_ZC_RANKS]
    cdef char *nowhere[MAX_ZC_RANKS]
    cdef size_t nothing[MAX_ZC_RANKS]
    cdef size_t chunk = step_chunk(st, 1, False, flags)
    cdef int q, rc = OK
    cdef bint done = False
    if zerocopy_tables(st, max_nbytes * st.size):
        for q in range(st.size):
            send_addr[q] = sendbuf
            each_nbytes[q] = send_nbytes
            nowhere[q] = NULL
            nothing[q] = 0
        if root < 0 or root == st.rank:
            rc = exchange_direct(st, send_addr, each_nbytes, recv_addr, recv_nbytes, &done)
        else:
            rc = exchange_direct(st, send_addr, each_nbytes, nowhere, nothing, &done)
    if rc == OK and not done:
        rc = alg_gather(st, sendbuf, send_nbytes, recv_addr, recv_nbytes, root,
                        (max_nbytes + chunk - 1) // chunk, chunk)
    return rc

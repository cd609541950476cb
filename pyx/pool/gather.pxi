# Gather(v) and Allgather(v): every rank publishes its block, readers copy
# each peer's out.
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

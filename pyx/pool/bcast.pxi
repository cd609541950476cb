# Barrier and Bcast: the pipelined copy through the root's halves, and the
# zero-copy paths (receivers pull from the root's pool buffer, or the root
# pushes into theirs); run_bcast chooses.
# (part of cxlmpi._pool: included by pyx/_pool.pyx)


cdef int run_barrier(state_t *st) noexcept nogil:
    return step_all(st)


cdef int alg_bcast(state_t *st, char *buf, size_t nbytes, int root,
                   size_t chunk) noexcept nogil:
    """Root copies chunk k into its half k % 2 while the others copy chunk k-1
    out of the other half: a two-stage pipeline."""
    cdef size_t off = 0, n
    cdef char *slot
    cdef int rc
    while off < nbytes:
        n = nbytes - off if nbytes - off < chunk else chunk
        slot = half_ptr(st, root, st.step + 1)
        if st.rank == root:
            copy_in(st, slot, buf + off, n)
        rc = step_all(st)
        if rc != OK:
            return rc
        if st.rank != root:
            will_read(st, slot, n)
            cxl_copy(buf + off, slot, n)
        off += n
    return OK


cdef int alg_bcast_push(state_t *st, char *buf, size_t nbytes, int root,
                        const uint64_t *recvs) noexcept nogil:
    """Every receiver's buffer is in the pool: the root copies straight into
    each of them, then one completion step (receivers in sw mode then drop
    stale lines of their buffer)."""
    cdef int q
    cdef char *dst
    cdef int rc
    if st.rank == root:
        for q in range(st.size):
            if q != root:
                dst = st.heap + recvs[q] - 1
                if dst != buf:
                    will_write_into(st, dst, nbytes)
                    cxl_copy(dst, buf, nbytes)
                    wrote(st, dst, nbytes)
    rc = step_all(st)
    if rc == OK and st.rank != root:
        will_read(st, buf, nbytes)
    return rc


cdef int alg_bcast_pull(state_t *st, char *buf, size_t nbytes, int root,
                        uint64_t root1) noexcept nogil:
    """The root's buffer is in the pool: every other rank copies straight
    from it (one copy instead of two, none at the root)."""
    cdef const char *src = st.heap + root1 - 1
    if st.rank != root and <const char *>buf != src:
        will_read(st, src, nbytes)
        if nbytes >= STREAM_MIN_NBYTES:
            cxl_copy_out(buf, src, nbytes)
        else:
            cxl_copy(buf, src, nbytes)
    return step_all(st)


cdef int run_bcast(state_t *st, char *buf, size_t nbytes, int root,
                   int flags) noexcept nogil:
    """Bcast, with the variant `flags` (V_*).  A large message in a pool
    with arenas (`zerocopy`) first takes a header step that publishes where
    every rank's buffer lives, and every rank picks alike: receivers pull
    from the root's pool buffer, or the root pushes into every receiver's;
    otherwise the pipelined copy through the root's halves."""
    cdef uint64_t sends[MAX_ZC_RANKS]
    cdef uint64_t recvs[MAX_ZC_RANKS]
    cdef bint push = False
    cdef int q, rc
    cdef uint64_t mine = 0, theirs = 0   # offset + 1 of this rank's buffer, or 0
    if zerocopy(st, nbytes):
        if st.rank == root:
            mine = resident(st, buf, nbytes)
        else:
            theirs = resident(st, buf, nbytes)
        # the root's buffer may be read in place, a receiver's written into
        will_lend(st, buf if mine or theirs else NULL, nbytes)
        rc = publish_offsets(st, mine, theirs, sends, recvs)
        if rc != OK:
            return rc
        if all_fit(st, sends + root, 1, nbytes):
            st.took_zc = 1
            return alg_bcast_pull(st, buf, nbytes, root, sends[root])
        # every receiver's buffer in the pool: the root writes straight
        # into them (one copy each instead of two)
        push = True
        for q in range(st.size):
            if q != root and not all_fit(st, recvs + q, 1, nbytes):
                push = False
        if push:
            st.took_zc = 1
            return alg_bcast_push(st, buf, nbytes, root, recvs)
    return alg_bcast(st, buf, nbytes, root, step_chunk(st, 1, False, flags))

# Rank-order folds: every reduction (Allreduce, Reduce, the scans,
# Reduce_scatter) combines contributions in this one order, so that every rank
# gets bit-identical results.
# (part of cxlmpi._pool: included by pyx/_pool.pyx)


cdef inline const char *source(state_t *st, int q, uint64_t step, size_t offset,
                               size_t at, const char *mine) noexcept nogil:
    """Where rank q's contribution to message byte `at` (byte `offset` of its
    half) is read: its own buffer when it is read in place (st.res), this
    rank's private buffer (`mine`), or q's half of `step`."""
    if st.res != NULL and st.res[q] != NULL:
        return st.res[q] + at
    if q == st.rank and mine != NULL:
        return mine
    return half_ptr(st, q, step) + offset


cdef void reduce_all(state_t *st, cxl_reduce_fn fn, char *dst, size_t offset,
                     size_t count, size_t itemsize, uint64_t step, int nranks,
                     const char *mine, char *dst2, size_t at) noexcept nogil:
    """dst = x0 op x1 op ... op x(nranks-1), left to right in rank order (a
    copy of x0 for one rank), from `count` elements at byte `offset` of each
    rank's half of `step` (message byte `at`); a rank's x is read from its
    own buffer instead when it is read in place, and this rank's from `mine`
    when that is not NULL (its private buffer: one copy fewer).  Block by
    block, so that the running result stays in L1 across the p - 1 folds
    and, when `dst2` is not NULL, is copied there while still hot.  The same
    order on every rank and for every slice: every rank gets bit-identical
    results."""
    cdef int q
    cdef size_t block = BLOCK_NBYTES // itemsize if BLOCK_NBYTES > itemsize else 1
    cdef size_t done = 0, n
    for q in range(nranks):
        st.srcs[q] = source(st, q, step, offset, at, mine)
    while done < count:
        n = min_size(count - done, block)
        fold_block(fn, dst + done * itemsize, st.srcs, nranks, done, n, itemsize)
        if dst2 != NULL:
            cxl_copy(dst2 + done * itemsize, dst + done * itemsize, n * itemsize)
        done += n


cdef void invalidate_all(state_t *st, size_t offset, size_t nbytes,
                         uint64_t step, size_t at) noexcept nogil:
    cdef int q
    if st.sw:
        for q in range(st.size):
            if st.res != NULL and st.res[q] != NULL:
                cxl_flush(st.res[q] + at, nbytes, 1)
            elif q != st.rank:
                cxl_flush(half_ptr(st, q, step) + offset, nbytes, 1)


cdef inline const char *own_source(state_t *st, const char *sendbuf,
                                   const char *dst) noexcept nogil:
    """This rank's contribution may be read straight from its send buffer,
    unless the result overwrites it before the fold reaches it (in place,
    rank >= 2: dst = x0 op x1 is written first)."""
    if sendbuf == dst and st.rank >= 2:
        return NULL
    return sendbuf


cdef void fold_block(cxl_reduce_fn fn, char *dst, const char **src, int nranks,
                     size_t off, size_t n, size_t itemsize) noexcept nogil:
    """dst[0:n] = src0 op src1 op ... (rank order) at element `off`: the one
    fold every reduction uses (a copy of src0 for one rank)."""
    cdef int q
    cdef size_t b = off * itemsize
    if nranks == 1:
        cxl_copy(dst, src[0] + b, n * itemsize)
        return
    fn(dst, src[0] + b, src[1] + b, n)
    for q in range(2, nranks):
        fn(dst, dst, src[q] + b, n)


cdef int alg_reduce_direct(state_t *st, cxl_reduce_fn fn, const char **src,
                           char **dst, int ndst, size_t lo, size_t hi,
                           size_t itemsize) noexcept nogil:
    """Fold elements [lo, hi) of every source straight from where they live
    and write the result to every destination, block by block through a
    small private buffer (a destination may be a source: in place)."""
    cdef char tmp[BLOCK_TMP]
    cdef size_t block = BLOCK_TMP // itemsize if BLOCK_TMP > itemsize else 1
    cdef size_t at = lo, n
    cdef int q, d
    if st.sw:
        for q in range(st.size):
            cxl_flush(src[q] + lo * itemsize, (hi - lo) * itemsize, 1)
        for d in range(ndst):
            will_write_into(st, dst[d] + lo * itemsize, (hi - lo) * itemsize)
    while at < hi:
        n = min_size(hi - at, block)
        fold_block(fn, tmp, src, st.size, at, n, itemsize)
        for d in range(ndst):
            cxl_copy(dst[d] + at * itemsize, tmp, n * itemsize)
        at += n
    if st.sw:
        for d in range(ndst):
            cxl_flush(dst[d] + lo * itemsize, (hi - lo) * itemsize, 0)
    return OK


cdef cxl_reduce_fn reducer(int op, int tcode) except NULL:
    """The kernel of `op` on type `tcode` (the dispatcher checked it exists)."""
    cdef cxl_reduce_fn fn = cxl_reducer(op, tcode)
    if fn == NULL:
        raise ValueError(f"op {op} is not defined for type {tcode}")
    return fn

# Reduce, Allreduce and the scans: everyone folds everything (small), reduce-
# scatter then allgather (large), and folding straight from pool buffers;
# run_reduce and run_scan choose.
# (part of cxlmpi._pool: included by pyx/_pool.pyx)


cdef int alg_fold_prefix(state_t *st, const char *sendbuf, char *recvbuf,
                         size_t count, size_t itemsize, cxl_reduce_fn fn,
                         int root, int nranks, size_t chunk) noexcept nogil:
    """Every rank publishes its contribution; the root (every rank when
    root < 0) folds those of ranks 0 .. nranks-1 straight into its receive
    buffer: all of them for Reduce and Allreduce, x0 .. xr for Scan and
    x0 .. x(r-1) for Exscan (nothing on rank 0, whose buffer stays as is)."""
    cdef size_t per_step = chunk // itemsize
    cdef size_t done = 0, n
    cdef char *mine
    cdef char *dst
    cdef int rc
    while done < count:
        n = min_size(count - done, per_step)
        mine = half_ptr(st, st.rank, st.step + 1)
        if st.res == NULL or st.res[st.rank] == NULL:
            copy_in(st, mine, sendbuf + done * itemsize, n * itemsize)
        rc = step_all(st)
        if rc != OK:
            return rc
        if (root < 0 or root == st.rank) and nranks > 0:
            dst = recvbuf + done * itemsize
            invalidate_all(st, 0, n * itemsize, st.step, done * itemsize)
            reduce_all(st, fn, dst, 0, n, itemsize, st.step, nranks,
                       own_source(st, sendbuf + done * itemsize, dst), NULL,
                       done * itemsize)
        done += n
    return OK


cdef int alg_reduce_rsag(state_t *st, const char *sendbuf, char *recvbuf,
                         size_t count, size_t itemsize, cxl_reduce_fn fn,
                         int root, size_t chunk) noexcept nogil:
    """Reduce-scatter then allgather (or gather to the root), pipelined.

    Chunk k is published at step s (all of it but this rank's own slice,
    which only this rank reads, straight from its send buffer); right after
    the wait every rank reduces its 1/p slice of chunk k into its other half
    (the half of step s + 1, free by then), next to chunk k + 1's input, and
    into its own receive buffer while the block is hot.  At step s + 1 every
    rank (the root only, for Reduce) copies the other ranks' slices of chunk
    k out."""
    cdef size_t per_step = chunk // itemsize
    cdef size_t out_offset = per_step * itemsize
    cdef size_t nchunks = (count + per_step - 1) // per_step
    cdef size_t k, n, prev_n = 0, done = 0, prev_done = 0
    cdef size_t lo, hi
    cdef int q, p = st.size, rc
    cdef char *mine
    cdef char *out
    cdef const char *src
    for k in range(nchunks + 1):
        mine = half_ptr(st, st.rank, st.step + 1)
        n = 0
        if k < nchunks:
            n = min_size(count - done, per_step)
            src = sendbuf + done * itemsize
            lo = n * st.rank // p
            hi = n * (st.rank + 1) // p
            if st.res == NULL or st.res[st.rank] == NULL:
                copy_in(st, mine, src, lo * itemsize)
                copy_in(st, mine + hi * itemsize, src + hi * itemsize, (n - hi) * itemsize)
        rc = step_all(st)
        if rc != OK:
            return rc
        if k > 0 and (root < 0 or root == st.rank):
            # chunk k-1: slice q lives in rank q's half of this step (this
            # rank's own slice is in its receive buffer already)
            for q in range(p):
                if q == st.rank:
                    continue
                lo = prev_n * q // p
                hi = prev_n * (q + 1) // p
                out = half_ptr(st, q, st.step) + out_offset
                will_read(st, out, (hi - lo) * itemsize)
                cxl_copy(recvbuf + (prev_done + lo) * itemsize, out,
                         (hi - lo) * itemsize)
        if k < nchunks:
            lo = n * st.rank // p
            hi = n * (st.rank + 1) // p
            out = half_ptr(st, st.rank, st.step + 1) + out_offset
            invalidate_all(st, lo * itemsize, (hi - lo) * itemsize, st.step,
                           (done + lo) * itemsize)
            reduce_all(st, fn, out, lo * itemsize, hi - lo, itemsize, st.step, p,
                       sendbuf + (done + lo) * itemsize,
                       recvbuf + (done + lo) * itemsize
                       if (root < 0 or root == st.rank) else NULL, (done + lo) * itemsize)
            wrote(st, out, (hi - lo) * itemsize)
        prev_n = n
        prev_done = done
        done += n
    return OK


cdef int alg_reduce_pull(state_t *st, const uint64_t *sends, const uint64_t *recvs,
                         char *recvbuf, size_t count, size_t itemsize,
                         cxl_reduce_fn fn, int root, bint all_recv) noexcept nogil:
    """Every send buffer is in the pool.  With every receive buffer there
    too (the root's, for Reduce), rank r folds its 1/p slice from every
    source and writes it into every receive buffer: each byte is read once
    and written once per destination.  Otherwise every rank that receives
    folds everything into its own (private) receive buffer."""
    cdef const char *src[MAX_ZC_RANKS]
    cdef char *dst[MAX_ZC_RANKS]
    cdef int q, p = st.size, ndst = 0, rc
    cdef size_t lo, hi
    for q in range(p):
        src[q] = st.heap + sends[q] - 1
    if all_recv:
        lo = slice_bound(st, count, st.rank, itemsize)
        hi = slice_bound(st, count, st.rank + 1, itemsize)
        for q in range(p):
            if root < 0 or q == root:
                dst[ndst] = st.heap + recvs[q] - 1
                ndst += 1
        alg_reduce_direct(st, fn, src, dst, ndst, lo, hi, itemsize)
    elif root < 0 or root == st.rank:
        dst[0] = recvbuf
        alg_reduce_direct(st, fn, src, dst, 1, 0, count, itemsize)
    rc = step_all(st)  # completion: every source read, every result written
    if rc == OK and st.sw and (root < 0 or root == st.rank):
        cxl_flush(recvbuf, count * itemsize, 1)
    return rc


cdef inline size_t slice_bound(state_t *st, size_t count, int r,
                               size_t itemsize) noexcept nogil:
    """Where rank r's 1/p slice of `count` elements starts (r = p: the
    end).  In sw mode on a line boundary (whole lines of elements), so that
    no two ranks write one line of a receive buffer that starts on one."""
    cdef size_t at = count * r // st.size
    cdef size_t per_line
    if st.sw and r < st.size:
        per_line = LINE_NBYTES // itemsize
        at -= at % per_line
    return at


cdef bint reduce_rsag(state_t *st, size_t count, size_t itemsize,
                      int flags) noexcept nogil:
    """Whether a reduction of `count` elements runs reduce-scatter +
    allgather: the V_RSAG / V_FLAT variant, else by its size and ranks
    (never with fewer elements than ranks)."""
    # Two ranks move the same bytes across cores either way, and the
    # everyone-reduces-all algorithm takes one step per chunk instead of
    # two: by default reduce-scatter + allgather from three ranks on.
    cdef bint rsag = (st.size >= st.rsag_min_ranks
                      and count * itemsize >= st.rsag_min_nbytes)
    if flags & V_RSAG:
        rsag = True
    elif flags & V_FLAT:
        rsag = False
    return rsag and count >= <size_t>st.size


cdef int run_reduce(state_t *st, const char *sendbuf, char *recvbuf, size_t count,
                    size_t itemsize, cxl_reduce_fn fn, int root, int flags) noexcept nogil:
    """Reduce (to `root`) and Allreduce (root < 0), with the variant `flags`
    (V_*); `sendbuf` may equal `recvbuf` (in place), `recvbuf` is ignored
    off the root of a Reduce.  A large reduction in a pool with arenas
    (`zerocopy`) first takes a header step that publishes where every
    rank's buffers live, and every rank picks alike: every send buffer in
    the pool -- fold straight from them (alg_reduce_pull); some -- read
    those in place and the others through their halves.  Then reduce-
    scatter + allgather (`reduce_rsag`) or every receiver folding
    everything."""
    cdef uint64_t sends[MAX_ZC_RANKS]
    cdef uint64_t recvs[MAX_ZC_RANKS]
    cdef const char *res[MAX_ZC_RANKS]
    cdef bint all_recv = False, any_res = False
    cdef int q, rc
    cdef size_t nbytes = count * itemsize
    cdef bint rsag = reduce_rsag(st, count, itemsize, flags)
    cdef bint zc = zerocopy(st, nbytes)
    cdef uint64_t send1 = 0, recv1 = 0   # offset + 1 of this rank's buffers, or 0
    if zc:
        send1 = resident(st, sendbuf, nbytes)
        if root < 0 or root == st.rank:
            recv1 = resident(st, recvbuf, nbytes)
        # a send buffer may be read in place, a receive buffer written into
        will_lend(st, sendbuf if send1 else NULL, nbytes)
        if recv1 != send1:
            will_lend(st, recvbuf if recv1 else NULL, nbytes)
        rc = publish_offsets(st, send1, recv1, sends, recvs)
        if rc != OK:
            return rc
        zc = all_fit(st, sends, st.size, nbytes)
        if zc:
            all_recv = all_fit(st, recvs, st.size, nbytes) \
                if root < 0 else all_fit(st, recvs + root, 1, nbytes)
            if st.sw and itemsize <= LINE_NBYTES and LINE_NBYTES % itemsize == 0:
                # every rank writes its slice into every receive buffer:
                # slices then start on lines of each (slice_bound)
                for q in range(st.size):
                    if (root < 0 or q == root) and (recvs[q] - 1) % LINE_NBYTES:
                        all_recv = False
            elif st.sw:
                all_recv = False
            for q in range(st.size):  # no rank folds over its own input
                if not all_recv and recvs[q] == sends[q]:
                    zc = False
        if zc:
            st.took_zc = 1
            return alg_reduce_pull(st, sends, recvs, recvbuf, count, itemsize, fn, root,
                                   all_recv)
        # Some send buffers in the pool: those ranks skip copying in and are
        # read in place (never one whose result overwrites its input).
        for q in range(st.size):
            res[q] = NULL
            if all_fit(st, sends + q, 1, nbytes) and sends[q] != recvs[q]:
                res[q] = st.heap + sends[q] - 1
                any_res = True
    st.res = res if any_res else NULL
    cdef size_t chunk = step_chunk(st, itemsize, rsag, flags)
    if rsag:
        rc = alg_reduce_rsag(st, sendbuf, recvbuf, count, itemsize, fn, root, chunk)
    else:
        rc = alg_fold_prefix(st, sendbuf, recvbuf, count, itemsize, fn, root, st.size, chunk)
    st.res = NULL
    if rc == OK and any_res:
        rc = step_all(st)  # completion: peers are done reading
    return rc


cdef int run_scan(state_t *st, const char *sendbuf, char *recvbuf, size_t count,
                  size_t itemsize, cxl_reduce_fn fn, bint exclusive,
                  int flags) noexcept nogil:
    """Scan (inclusive) or Exscan of `count` elements, with the variant
    `flags`: rank r folds the contributions of ranks 0 .. r (0 .. r-1)."""
    return alg_fold_prefix(st, sendbuf, recvbuf, count, itemsize, fn, -1,
                           st.rank if exclusive else st.rank + 1,
                           step_chunk(st, itemsize, False, flags))

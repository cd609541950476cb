# What every family's choice of algorithm reads: the bytes one step carries
# (a chunk of a half, a sub-slot per destination) and whether a call first
# asks where every rank's buffers live (zero copy).  Each run_<family> calls
# these with the call's variant flags (V_*), so every choice of a family is
# made in its one nogil entry.
# (part of cxlmpi._pool: included by pyx/_pool.pyx)


cdef inline size_t step_chunk(state_t *st, size_t itemsize, bint rsag,
                              int flags) noexcept nogil:
    """Bytes one rank publishes per step: whole elements that fit a half
    (with room for the 1/p result slice in the reduce-scatter case);
    CXLMPI_CHUNK_SIZE, or the whole half with the V_BIGCHUNK variant."""
    cdef size_t cap = st.half_nbytes
    if rsag:
        cap = cap * st.size // (st.size + 1) - itemsize
    cdef size_t chunk = st.chunk_nbytes if st.chunk_nbytes < cap else cap
    if flags & V_BIGCHUNK:
        chunk = cap
    chunk -= chunk % itemsize
    return chunk if chunk >= itemsize else itemsize


cdef inline size_t sub_slot(state_t *st, size_t itemsize, int flags) noexcept nogil:
    """Bytes of a per-destination sub-slot (whole elements, 64-aligned)."""
    cdef size_t sub = st.half_nbytes // st.size
    if st.chunk_nbytes < sub and not flags & V_BIGCHUNK:
        sub = st.chunk_nbytes
    sub -= sub % 64
    sub -= sub % itemsize
    return sub if sub >= itemsize else itemsize


cdef inline bint zerocopy(state_t *st, size_t nbytes) noexcept nogil:
    """Whether a collective of `nbytes` first asks where every rank's
    buffers live (the same answer on every rank: the pool has arenas, and
    the size is past zerocopy_min_nbytes)."""
    return (st.heap_lo < st.heap_hi and nbytes >= st.zerocopy_min_nbytes
            and st.size <= MAX_ZC_RANKS)


cdef inline bint zerocopy_tables(state_t *st, size_t nbytes) noexcept nogil:
    """`zerocopy`, and room in a half for the three tables of p words the
    personalized collectives publish."""
    return zerocopy(st, nbytes) and <size_t>st.size * 24 <= st.half_nbytes

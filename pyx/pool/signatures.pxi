# The check that follows a call's first step: do the ranks' calls match?
# (part of cxlmpi._pool: included by pyx/_pool.pyx)

# The bytes of a signature's second word (its top byte holds the variant)
cdef uint64_t SIG_NBYTES_MASK = (<uint64_t>1 << 56) - 1

# Bcast's kind code: its ranks may name different bytes (see below)
cdef uint64_t KIND_BCAST = kind_code("Bcast")


cdef int check_signatures(state_t *st) noexcept nogil:
    """After the first step of a call: every rank made the same call (the
    same collective, root, op, type and bytes), and the blocks the ranks
    send match those they receive (the sum of the third words is zero:
    each rank adds a hash of every block it sends and subtracts one of
    every block it receives).  All ranks read the same words, so all reach
    the same verdict.

    A Bcast whose ranks agree on all but the bytes (a receiver names more
    or fewer than the root sends: mpi4py infers the count from the buffer)
    goes to MPI on every rank (ERR_PASSED), before any user buffer is
    written: stock MPI then does with it what it does without cxlmpi
    (MPICH raises on such receivers and delivers to the root's own;
    another MPI may deliver the message)."""
    cdef int q, call_differs = -1, bytes_differ = -1
    cdef bint sizes_differ = False
    cdef cxl_ctrl *line
    cdef uint64_t pairs = 0, word
    for q in range(st.size):
        line = ctrl(st, q)
        if st.sw and q != st.rank:
            cxl_flush(line.sig, LINE_NBYTES, 1)
        if line.sig[0][st.step & 1] != st.sig[0] and call_differs < 0:
            call_differs = q
        word = line.sig[1][st.step & 1]
        if word != st.sig[1] and bytes_differ < 0:
            bytes_differ = q
        if (word ^ st.sig[1]) & SIG_NBYTES_MASK:
            sizes_differ = True
        pairs += line.sig[2][st.step & 1]
    if call_differs < 0 and sizes_differ and st.sig[0] >> 48 == KIND_BCAST:
        return ERR_PASSED
    if call_differs >= 0 or bytes_differ >= 0:
        st.failed_rank = call_differs if call_differs >= 0 else bytes_differ
        st.failed_code = ERR_MISMATCH
        return ERR_MISMATCH
    if pairs != 0:
        st.failed_rank = -1
        st.failed_code = ERR_MISMATCH
        return ERR_MISMATCH
    return OK

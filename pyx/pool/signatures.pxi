# What signs a call (its kind, the checksums of its blocks), and the check
# that follows its first step: do the ranks' calls match?
# (part of cxlmpi._pool: included by pyx/_pool.pyx)

# A call's kind (its collective's name) and the block checksums it carries.

KIND_NAMES = {}   # kind code -> the name it was made from (error messages)


cdef dict KIND_CODES = {}


cdef uint64_t kind_code(str what):
    """A stable 16-bit code of a collective's name (the same in every
    process: no salted hash)."""
    code = KIND_CODES.get(what)
    if code is None:
        code = zlib.crc32(what.encode()) & 0xFFFF
        KIND_CODES[what] = code
        KIND_NAMES[code] = what
    return code


cdef inline uint64_t mix64(uint64_t x) noexcept nogil:
    """splitmix64's finalizer: a well-spread 64-bit hash of x."""
    x += <uint64_t>0x9E3779B97F4A7C15
    x = (x ^ (x >> 30)) * <uint64_t>0xBF58476D1CE4E5B9
    x = (x ^ (x >> 27)) * <uint64_t>0x94D049BB133111EB
    return x ^ (x >> 31)


cdef uint64_t counts_hash(const size_t *counts, int n) noexcept nogil:
    cdef uint64_t h = mix64(n)
    cdef int i
    for i in range(n):
        h = mix64(h ^ counts[i])
    return h


def pair_hash(uint64_t src, uint64_t dst, uint64_t nbytes):
    """The checksum term of a block of `nbytes` from rank src to rank dst:
    the sender adds it, the receiver subtracts it, so that the ranks' terms
    sum to zero exactly when every block is received as sent."""
    return mix64(mix64((src << 32) ^ dst) ^ nbytes)


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

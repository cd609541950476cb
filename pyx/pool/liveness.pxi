# Liveness the kernel tells, and whose memory a partition is.
# (part of cxlmpi._pool: included by pyx/_pool.pyx)
#
# Each rank holds a lock on the first byte of its control line in the
# pool's backing file (pyx/cxl_lock.h) from before it says it is attached
# until it lets go of the pool: a waiter on this kernel whose peer is in
# another pid namespace asks the kernel whether that lock is still held --
# a peer that is stopped (SIGSTOP, a paused container, a debugger) holds it,
# a peer that is gone does not -- instead of judging its heartbeat by a
# clock.  Only where the peer runs on another kernel is the heartbeat the
# witness, and a rank judged gone there because it only stood still finds
# out when it resumes: the reclaimer wiped the partition's token
# (cxlmpi.memory.backends), which every rank compares with its own before a call,
# at its steps and after it (`revoked`).

cdef extern from "cxl_lock.h" nogil:
    int cxl_ofd_hold(int fd, uint64_t at)
    void cxl_ofd_drop(int fd, uint64_t at)
    int cxl_ofd_held(int fd, uint64_t at)
    int cxl_ofd_free_means_gone(int fd)


cdef inline uint64_t lock_at(state_t *st, const cxl_ctrl *line) noexcept nogil:
    """The byte of the backing file that the owner of control line `line`
    locks: the line's first."""
    return st.file_offset + <uint64_t>(<const char *>line - st.base)


cdef inline int lock_gone(state_t *st, const cxl_ctrl *line) noexcept nogil:
    """1: the peer of `line` runs on this kernel and holds its lock no more
    (it let go of the pool, or is gone); 0: it holds it (alive, perhaps
    stopped); -1: the kernel cannot tell (another kernel's peer, a file
    without locks, or a device, which the peer may reach through a node
    of its own: cxl_ofd_free_means_gone)."""
    cdef int held
    if line.host >> 32 != host_id >> 32 or st.lock_fd < 0:
        return -1
    held = cxl_ofd_held(st.lock_fd, lock_at(st, line))
    if held < 0 or (held == 0 and not st.lock_sure):
        return -1
    return held == 0


cdef inline bint revoked(state_t *st) noexcept nogil:
    """Whether the memory of this pool, or of the node heap whose arrays
    its calls use in place, is no longer its job's: the token in its
    header is not the one it was set up with (a partition reclaimed while
    this rank stood still past its lease; shm pools: token 0)."""
    cdef cxl_header *h = <cxl_header *>st.base
    if st.heap_token != 0:
        if st.sw:
            cxl_flush_meta(st.heap_token_at, 8, 1)
        if cxl_load_acquire(st.heap_token_at) != st.heap_token:
            return True
    if st.token == 0:
        return False
    if st.sw:
        cxl_flush_meta(&h.token, 8, 1)
    return cxl_load_acquire(&h.token) != st.token


cdef int arena_revoked(void *st) noexcept nogil:
    """The arena allocator's check before it hands a block out (revoked)."""
    cdef state_t *s = <state_t *>st
    return s.base == NULL or revoked(s)


cdef void leave_line(state_t *st) noexcept nogil:
    """This rank lets go of the pool: its line's heartbeat stops first,
    always (the mapping goes next: the beat thread must not touch it, nor
    flush the token it watches -- a revoked pool's line still registered
    crashed the process at exit with SIGSEGV), and the line says the rank
    left unless the memory is another job's now (nothing is written there)."""
    cdef cxl_ctrl *line = ctrl(st, st.rank)
    cxl_beat_remove(&line.beat)
    if revoked(st):
        return
    # (released: a peer that sees 0 sees every step this rank published,
    # see wait_all)
    cxl_store_release(&line.attached, 0)
    cxl_flush_meta(line, CTRL_NBYTES, 0)


cdef int hold_line(state_t *st, int fd) noexcept nogil:
    """Lock this rank's byte through `fd` (its own open file description of
    the backing file, kept until the pool is let go of): 0 or an errno."""
    st.lock_fd = fd
    st.lock_sure = cxl_ofd_free_means_gone(fd)
    return cxl_ofd_hold(fd, lock_at(st, ctrl(st, st.rank)))


cdef int setup_liveness(state_t *st, int fd, size_t file_offset, uint64_t token) noexcept nogil:
    """Note where this rank's mapping starts in the backing file and whose
    memory it is (`token`), and lock this rank's byte through `fd` (its
    own open file description of the file, kept until the pool is let go
    of; -1: none): 0 or an errno."""
    st.file_offset = file_offset
    st.token = token
    st.still_s = st.lease_s = 0
    st.lock_fd = fd
    st.lock_sure = cxl_ofd_free_means_gone(fd)
    return cxl_ofd_hold(fd, lock_at(st, ctrl(st, st.rank))) if fd >= 0 else 0


cdef void let_go_line(state_t *st) noexcept nogil:
    """Drop this rank's lock (closing a description of its own drops it
    too; a dup of the device's does not)."""
    if st.lock_fd >= 0 and st.size > 0:
        cxl_ofd_drop(st.lock_fd, st.file_offset + HEADER_NBYTES
                     + <uint64_t>st.rank * CTRL_NBYTES)
    st.lock_fd = -1


def own_description(int fd):
    """A descriptor of `fd`'s file with an open file description of its own
    (its locks are this pool's alone): reopened through /proc/self/fd, else
    a dup."""
    try:
        return os.open(f"/proc/self/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return os.dup(fd)

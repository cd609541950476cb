# Reserving the memory behind a pool, and what a shortage of it becomes: a
# fallback (private arrays, MPI), never a SIGBUS or an abort.  The data
# halves of a communicator's pool are reserved only when it first carries
# data (`ready_step`): a communicator whose calls all go to MPI costs a few
# pages of /dev/shm, not CXLMPI_POOL_SIZE.
# (part of cxlmpi._pool: included by pyx/_pool.pyx)

from libc.errno cimport EFBIG, ENOMEM, ENOSPC

# Pool memory is reserved before it is used (fallocate on the backing file):
# tmpfs allocates pages only at first touch, and a full /dev/shm (a
# container's 64 MiB) would otherwise kill the process with SIGBUS.  What
# cannot be reserved -- nor mapped, for want of address space (ulimit -v) --
# falls back: private memory for arrays, MPI for a pool that cannot be
# created, and the process says so once (cxl_no_space).
NO_SPACE = "not enough shared memory"

cdef extern from *:
    """
    #include <stdio.h>
    static int cxl_warned_no_space = 0;
    static int cxl_first_no_space(void)
    {
        return !__atomic_exchange_n(&cxl_warned_no_space, 1, __ATOMIC_ACQ_REL);
    }
    static void cxl_no_space(const char *what, size_t nbytes)
    {
        if (!cxl_first_no_space()) return;
        fprintf(stderr, "cxlmpi: warning: not enough shared memory (/dev/shm or the "
                "pool file is full, or the address space is limited: ulimit -v) for "
                "%zu more bytes of %s. Give the job more (e.g. docker run "
                "--shm-size=1g) or lower CXLMPI_POOL_SIZE / CXLMPI_ARENA_SIZE; this "
                "warning is not repeated.\\n", nbytes, what);
        fflush(stderr);
    }
    """
    void cxl_no_space(const char *what, size_t nbytes) nogil
    int cxl_first_no_space() nogil


cdef extern from "cxl_alloc.h" nogil:
    # what the pool itself uses of the header's includes (fallocate, errno)
    int cxl_fallocate(int fd, off_t offset, off_t length)
    uint64_t cxl_reserve_refused
    int EOPNOTSUPP, ENODEV, ENOSYS, ESPIPE


class PoolNoSpace(MemoryError):
    """The memory behind the pool (/dev/shm, the pool file) cannot hold more."""


cdef const char *ARENA_WHAT = (b"pool-resident arrays (cxlmpi.empty & co. return private "
                               b"arrays now)")
cdef const char *READY_WHAT = (b"a communicator's pool (its calls go to MPI; a new "
                               b"communicator asks again)")


def warn_no_space(str what, size_t nbytes, object free_nbytes=None, str where=""):
    """Say, once per process, that `nbytes` of pool memory for `what` could
    not be had (later calls stay silent).  With `free_nbytes`, the free
    space found in `where` (for a communicator's pool): name the
    CXLMPI_POOL_SIZE that fits (`no_space_message`)."""
    if free_nbytes is None:
        cxl_no_space(what.encode(), nbytes)
    elif cxl_first_no_space():
        sys.stderr.write(no_space_message(what, nbytes, free_nbytes, where) + "\n")
        sys.stderr.flush()


# The smallest pool size suggested: below it a pool holds too little to
# beat MPI (a data half of a few pages per rank).
MIN_POOL_SUGGESTED = 1 << 20


def pool_size_that_fits(size_t free_nbytes):
    """The CXLMPI_POOL_SIZE (bytes) that `free_nbytes` of free shared memory
    holds: the largest power of two no larger, so that a pool of it fits
    with room to spare (for pool arrays, another communicator's pool); 0
    where less than MIN_POOL_SUGGESTED is free."""
    if free_nbytes < MIN_POOL_SUGGESTED:
        return 0
    return 1 << (free_nbytes.bit_length() - 1)


def _size_text(size_t nbytes):
    """'32M', '512K': a size as CXLMPI_POOL_SIZE takes it (a power of two)."""
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if nbytes and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift}{unit}"
    return str(nbytes)


def no_space_message(str what, size_t nbytes, size_t free_nbytes, str where):
    """The warning for a communicator's pool that did not fit in the
    `free_nbytes` free in `where`: what it needed, the pool size that fits
    (`pool_size_that_fits`) as the setting and the option that set it."""
    fits = pool_size_that_fits(free_nbytes)
    head = (f"cxlmpi: warning: not enough shared memory for {what}: it needs {nbytes} "
            f"more bytes, and {where} has {free_nbytes} free "
            f"({free_nbytes / (1 << 20):.1f} MiB). ")
    if fits:
        advice = (f"CXLMPI_POOL_SIZE={_size_text(fits)} fits (python -m cxlmpi --pool-size "
                  f"{_size_text(fits)}), or give the job more shared memory (e.g. docker "
                  f"run --shm-size=1g)")
    else:
        advice = ("No pool fits there: give the job more shared memory (e.g. docker run "
                  "--shm-size=1g), or free some")
    return head + advice + "; this warning is not repeated."


def free_space(int fd):
    """(bytes free, where) on the filesystem of `fd`: "/dev/shm" when that
    is it, else "the pool file's filesystem"; (None, "") where it cannot be
    told."""
    try:
        here = os.fstatvfs(fd)
    except OSError:
        return None, ""
    try:
        shm = os.statvfs(SHM_DIR)
        where = SHM_DIR if shm.f_fsid == here.f_fsid else "the pool file's filesystem"
    except OSError:
        where = "the pool file's filesystem"
    return here.f_bavail * here.f_frsize, where


cdef str shortage(int err):
    """The start of the message of a failed ftruncate/mmap/fallocate whose
    errno `err` says the memory or address space is short (NO_SPACE: the
    caller falls back to MPI), else ""."""
    if err == ENOMEM:
        return f"{NO_SPACE} or address space (ulimit -v): "
    if err == ENOSPC or err == EFBIG:
        return f"{NO_SPACE}: "
    return ""


cdef int reserve_file(int fd, size_t offset, size_t nbytes) noexcept nogil:
    """Back [offset, offset + nbytes) of `fd` with memory now; 0, or the
    errno (0 too where the file cannot reserve: devdax needs no reserving;
    ENOSPC at once where a tmpfs has not the room: cxl_fallocate)."""
    cdef int rc = cxl_fallocate(fd, <off_t>offset, <off_t>nbytes)
    if rc == 0 or errno == EOPNOTSUPP or errno == ENODEV or errno == ENOSYS \
            or errno == ESPIPE:
        return 0
    return errno


def reserve(int fd, size_t offset, size_t nbytes):
    """`reserve_file` for cxlmpi.memory.backends (a pool file's partition table):
    0, or the errno."""
    return reserve_file(fd, offset, nbytes)


cdef int reserve_heads(int fd, size_t offset, size_t slot_offset, size_t half,
                       int nranks) noexcept nogil:
    """Reserve what a pool uses before it carries data: the header and
    control lines ([0, slot_offset) of the segment at `offset` of `fd`),
    and the first page of every data half, which header steps write (see
    agree_max).  0, or the errno."""
    cdef int err = reserve_file(fd, offset, slot_offset)
    cdef int k
    for k in range(2 * nranks):
        if err:
            break
        err = reserve_file(fd, offset + slot_offset + <size_t>k * half, PAGE_NBYTES)
    return err


cdef void prefault_heads(char *base, size_t slot_offset, size_t half,
                         int nranks) noexcept nogil:
    """`prefault` the pages `reserve_heads` reserved in the data halves."""
    cdef int k
    for k in range(2 * nranks):
        prefault(base, slot_offset + <size_t>k * half,
                 slot_offset + <size_t>k * half + PAGE_NBYTES)


cdef int ready_step(state_t *st, int fd, size_t offset, size_t nbytes,
                    bint *reserved) noexcept nogil:
    """The first step of the first call that moves data through a pool
    whose data halves are not reserved yet: the pool's rank 0 reserves them
    all (the `nbytes` after the control lines of the segment at `offset` of
    `fd`: one file, which every rank maps), then all learn whether it could
    (a header step: a rank that could not publishes 0) -- `reserved`, the
    same on every rank, so that all go on in the pool or all go to MPI.
    One rank only: a tmpfs reports pages fallocated but not yet written as
    holes, so a rank after the first, checking for room, found the range
    it needs to be all holes and refused it where /dev/shm had no room for
    it a second time (cxl_no_room).  The call's signature rides on the step
    (the caller set it): a peer that sent the call to MPI, or calls that do
    not match, stop it as they would the call's own first step.  OK, or the
    step's error."""
    global ready_steps
    ready_steps += 1
    cdef int err = reserve_file(fd, offset + st.slot_offset, nbytes) if st.rank == 0 else 0
    cdef uint64_t agreed = 0
    cdef uint64_t extra[2]
    cdef uint64_t most[2]
    extra[0] = extra[1] = 0
    cdef int rc = agree_max(st, 0 if err else 1, 0, extra, &agreed, most)
    reserved[0] = rc == OK and agreed != 0
    return rc


# The ready steps this process has run (each one reserving data halves):
# one per pool that carries data, and one more where spares were let go;
# never one per call (reserve_counts).
cdef uint64_t ready_steps = 0


def reserve_counts():
    """{"ready_steps": ready steps run (reservations of a pool's data
    halves), "refused": reservations refused before fallocate because a
    tmpfs had not the room} of this process."""
    return {"ready_steps": ready_steps, "refused": cxl_reserve_refused}


cdef int ready_halves(state_t *st, int fd, size_t offset, size_t nbytes,
                      bint *reserved) except -9:
    """`ready_step`; where no rank found room, `let_go_and_agree` and, if
    any rank let spares go, one more `ready_step` (every rank alike).  OK,
    or the steps' error; `reserved` the same on every rank."""
    cdef bint again = False
    cdef int rc
    with nogil:
        rc = ready_step(st, fd, offset, nbytes, reserved)
    if rc == OK and not reserved[0]:
        rc = let_go_and_agree(st, &again)
    if rc == OK and again:
        with nogil:
            rc = ready_step(st, fd, offset, nbytes, reserved)
    return rc


_let_go = None   # what frees memory the process keeps (see on_short)


def on_short(fn):
    """Install `fn()`, which lets go of pool memory the process keeps (the
    pools of freed communicators, cxlmpi.pools.state) and says whether it had
    any: a pool whose data halves cannot be had calls it on every rank."""
    global _let_go
    _let_go = fn


cdef int let_go_and_agree(state_t *st, bint *again) except -9:
    """After a `ready_step` that found no room (every rank alike): let go
    of kept memory (`on_short`); `again` when any rank had some (a header
    step), and all try once more.  OK, or the step's error."""
    cdef bint freed = bool(_let_go()) if _let_go is not None else False
    cdef uint64_t agreed = 0
    cdef uint64_t extra[2]
    cdef uint64_t most[2]
    extra[0] = extra[1] = 0
    cdef int rc
    with nogil:
        rc = agree_max(st, 1 + freed, 0, extra, &agreed, most)
    again[0] = rc == OK and agreed > 1
    return rc

# Per-collective counters (cxlmpi.stats()), indexed by the collective
# codes of pyx/cxl_codes.h; the clock; what a call tells the pool when it
# goes to MPI (to_mpi, passed) or ran in the pool (pooled); the C library's
# malloc kept adapting as under stock MPI.
# (part of cxlmpi._shim: included by pyx/_shim.pyx)


cdef double stat_pool[NCOLL]
cdef double stat_pass[NCOLL]
cdef double stat_bytes[NCOLL]
cdef double stat_seconds[NCOLL]
cdef double stat_learn[NCOLL]   # calls that timed a path (adaptive selection)
cdef double stat_zc[NCOLL]      # pool calls that used the ranks' buffers in place


cdef inline double now() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + 1e-9 * ts.tv_nsec


cdef inline bint within(int which, Py_ssize_t nbytes) noexcept:
    return lo[which] <= nbytes < hi[which]


cdef inline double start() noexcept:
    return now() if time_all else 0.0


cdef inline void passed(int which, double t0) noexcept:
    stat_pass[which] += 1
    if time_all:
        stat_seconds[which] += now() - t0
    if _run_routes != NULL:   # a call of a timed run that `skip` sent to MPI
        timed_pass(which)


# The pool of the communicator the last call was made on (see `sized`), and
# its pass marker: a Pool's is its C function and state (Pool.pass_marker),
# called without a Python call; a Hierarchy's, its note_pass method.
ctypedef void (*mark_fn)(void *) noexcept nogil
cdef object _marked_pool = None   # keeps the Pool (and its state) alive
cdef mark_fn _marked_fn = NULL
cdef void *_marked_state = NULL


cdef inline int to_mpi(object comm) except -1:
    """This rank is about to send a call to stock MPI: tell the pool (if
    `comm` has one), so that peers that took the call to the pool follow
    (ranks that disagree on a size may disagree on the path, too)."""
    sized(comm)
    if _marked_fn != NULL:
        _marked_fn(_marked_state)
    elif _marked_pool is not None:
        _marked_pool.note_pass()
    return 0


cdef inline void pooled(int which, double nbytes, double t0) noexcept:
    stat_pool[which] += 1
    stat_bytes[which] += nbytes
    stat_seconds[which] += now() - t0
    if nbytes > malloc_seen:
        malloc_like_mpi(nbytes)


# The largest message a pool call has moved in this process (see below).
cdef double malloc_seen = 0


cdef void malloc_like_mpi(double nbytes) noexcept:
    """Allocate and free a block of `nbytes`, as stock MPI does for its
    temporary buffers (a reduction's, a pipeline's), so that the C library
    adapts to the program's large blocks as it would under stock MPI.
    glibc's malloc serves blocks of its mmap threshold (128 KiB at first)
    and more with fresh mmaps, paid in page faults at first touch; freeing
    such a block raises the threshold to its size (up to 32 MiB).  Under
    stock MPI a program's first large collective does that, and from then
    on NumPy's large temporaries come from the heap, reused; the pool path
    allocates nothing, and a training loop kept mapping its temporaries
    afresh: 124,000 more page faults in 150 steps, that rank's gradient 30 %
    slower.  Once per new largest size: one malloc and free, untouched (no
    page is faulted in); elsewhere than glibc, a no-op in effect."""
    global malloc_seen
    malloc_seen = nbytes
    if nbytes > 32 << 20:
        return
    cdef void *block = PyMem_RawMalloc(<size_t>nbytes)
    PyMem_RawFree(block)


def stats_rows():
    """{name: (pool_calls, passthrough_calls, nbytes, seconds, learning
    calls, zero-copy calls)} of every intercepted collective, called or
    not."""
    return {COLLECTIVES[i]: (int(stat_pool[i]), int(stat_pass[i]),
                             int(stat_bytes[i]), stat_seconds[i], int(stat_learn[i]),
                             int(stat_zc[i]))
            for i in range(NCOLL)}


def stats_reset():
    """Zero every counter."""
    for i in range(NCOLL):
        stat_pool[i] = stat_pass[i] = stat_bytes[i] = stat_seconds[i] = stat_learn[i] = 0
        stat_zc[i] = 0

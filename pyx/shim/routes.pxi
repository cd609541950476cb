# The compiled route table of adaptive selection (cxlmpi.select): per
# collective x size class x placement, the path a call takes and until
# when.  Every index Python hands it is checked here before it touches
# the table (a size class comes from a cache file, too: cxlmpi.cache).
# (part of cxlmpi._shim: included by pyx/_shim.pyx)


DEF NCLASS = 64
# A path code (cxlmpi.select): 0 stock MPI, 1 + variant flags the pool.
# FOLLOW: MPI, where every rank already knows it (a header step said so:
# no pass mark, which would count the call twice).
DEF FOLLOW = -1
DEF SLOW = -1
# A class no call has met yet (cxlmpi.select.NEW): its first call opens a
# timed run on MPI without a header step, its `due` the run's length.
DEF NEW = -2


# The mpi4py method of each collective, as errors name it ("Allreduce").
METHODS = tuple(name.capitalize() for name in COLLECTIVES)


cdef inline int size_class(Py_ssize_t nbytes) noexcept nogil:
    return 0 if nbytes <= 1 else 63 - __builtin_clzll(<unsigned long long>nbytes)


# The largest path code: the pool with every variant flag.
from ._pool import VARIANT_FLAGS  # noqa: E402
cdef int MAX_CODE = 1 + sum(VARIANT_FLAGS.values())


cdef int check_class(int which, int sc, int pl) except -1:
    """Raise unless (which, sc, pl) is a class of the table: the indices
    come from Python (a selector; size classes from a cache file too), and
    the table is written with no other check."""
    if 0 <= which < NCOLL and 0 <= sc < NCLASS and 0 <= pl < 2:
        return 0
    from .errors import CXLMPIError

    raise CXLMPIError(
        f"adaptive selection: class (collective {which}, size class {sc}, placement "
        f"{pl}) is outside the route table ({NCOLL} x {NCLASS} x 2); remove the "
        f"selection cache (CXLMPI_CACHE) if it was hand-made")


cdef class Routes:
    """A communicator's settled choices, per collective x size class x
    placement (0 private, 1 pool: what the class's last pool call found),
    each valid until the pool's call counter reaches its re-check; kept by
    a cxlmpi.select.Selector (`selector`), read here without Python."""
    cdef signed char choice[NCOLL][NCLASS][2]
    cdef unsigned char where[NCOLL][NCLASS]
    cdef uint64_t due[NCOLL][NCLASS][2]
    cdef int first_skip[NCLASS]   # run_skip of a class's first run (NEW), by size class
    cdef const uint64_t *ops_ptr
    cdef object pool              # keeps the call counter (and the arenas) alive
    cdef public object selector
    cdef uintptr_t arena_lo, arena_hi   # this rank's mapping of the arenas
    cdef Py_ssize_t zc_min              # CXLMPI_ZEROCOPY_THRESHOLD of the pool
    # The timed run in flight (at most one): its class (run_which -1: none),
    # path, and this rank's time and count of its calls so far.  A run of
    # several calls is timed end to end (run_span): from the end of one of
    # its calls to the end of the next, when no other call of the
    # communicator came between (the call counter then moved by one), so
    # that everything a call costs counts -- message parsing, the Python
    # around it, its effect on the program's work between calls -- not
    # only the collective (the pool path's parsing, outside the collective,
    # made it look 0.2-0.3 us faster than it is at 4 KiB).  A single call
    # (a warm-up; large messages) times the collective.
    cdef int run_which, run_sc, run_pl, run_code
    # This rank's time in the last header step and the selector's
    # bookkeeping around it (the next header step carries it: all learn the
    # largest, what a learning call costs beyond its path)
    cdef uint64_t spent_ns
    cdef bint run_span
    cdef bint run_new     # opened by a class's first call, no header step (NEW)
    # Calls of the run after its opening one whose end only restarts the
    # timing: where the run opens with the class's cold first call, the
    # first half of the run (cxlmpi.select.untimed_half: a class's first
    # run, NEW, or the selector's first try of a class).  MPI warms up over
    # a class's first calls, and ranks leave a cold call apart (a 1 MiB
    # Scatter's first under MPICH, 2 ranks: the root 0.4-0.6 ms after the
    # other, which waits that long in the next call): counted, MPI's first
    # look came out 3-5x its later calls' time (350 against 70-100 us),
    # and the class dropped it after one look.
    cdef int run_skip
    cdef double run_seconds, run_last
    cdef uint64_t run_last_ops
    cdef long run_calls

    def __cinit__(self, pool):
        self.pool = pool
        self.ops_ptr = <const uint64_t *><uintptr_t>pool.ops_address()
        self.arena_lo, self.arena_hi = pool.arena_span()
        self.zc_min = pool.zerocopy_min_nbytes
        memset(self.choice, SLOW, sizeof(self.choice))
        memset(self.where, 0, sizeof(self.where))
        memset(self.due, 0, sizeof(self.due))
        memset(self.first_skip, 0, sizeof(self.first_skip))
        self.run_which = -1

    def set(self, int which, int sc, int pl, int code, uint64_t due):
        """Class (which, sc, pl) takes path `code` (SLOW: ask the selector)
        until the call counter reaches `due`."""
        check_class(which, sc, pl)
        if not NEW <= code <= MAX_CODE:
            from .errors import CXLMPIError

            raise CXLMPIError(f"adaptive selection: path code {code} is none of "
                              f"{NEW}..{MAX_CODE} (cxlmpi.select's codes)")
        self.choice[which][sc][pl] = code
        self.due[which][sc][pl] = due

    def first_runs(self, calls, skips):
        """Every class of size class sc whose entry is still untouched
        opens with a run of calls[sc] calls on MPI, without a header step
        (0: with one; see `take`), the first skips[sc] after its opening
        one untimed (`run_skip`)."""
        cdef int which, sc, pl
        if len(calls) != NCLASS or len(skips) != NCLASS:
            from .errors import CXLMPIError

            raise CXLMPIError(f"adaptive selection: first runs for {len(calls)} and "
                              f"{len(skips)} size classes; the route table has {NCLASS}")
        for sc in range(NCLASS):
            self.first_skip[sc] = skips[sc]
            if calls[sc] > 0:
                for which in range(NCOLL):
                    for pl in range(2):
                        if self.choice[which][sc][pl] == SLOW and not self.due[which][sc][pl]:
                            self.choice[which][sc][pl] = NEW
                            self.due[which][sc][pl] = calls[sc]

    def start_run(self, int which, int sc, int pl, int code, uint64_t due, int skip=0):
        """Time the calls of class (which, sc, pl), on path `code`, until the
        call counter reaches `due` (or the next header step): a run; the
        first `skip` calls after its opening one only restart the timing
        (`run_skip`)."""
        self.set(which, sc, pl, code, due)
        self.run_which, self.run_sc, self.run_pl, self.run_code = which, sc, pl, code
        self.run_span = due > self.ops_ptr[0] + 1
        self.run_new = False
        self.run_skip = skip
        self.run_seconds = self.run_last = 0.0
        self.run_calls = 0

    def peek_run(self):
        """The run in flight: (which, sc, pl, code, this rank's seconds,
        calls timed, whether it is still in its untimed first calls), or
        None when there is none.  It goes on until
        `finish_run`: a header step that ends with some rank gone to MPI
        reports nothing, and the ranks that took it must keep the run as
        the others do, or they would part at the next class's first call
        (see `take`)."""
        if self.run_which < 0:
            return None
        return (self.run_which, self.run_sc, self.run_pl, self.run_code, self.run_seconds,
                self.run_calls, self.run_skip > 0)

    def finish_run(self):
        """End the run in flight (after a header step every rank completed)."""
        self.run_which = -1

    def break_run(self):
        """The next call of a run timed end to end starts its timing afresh
        (the communicator changed in between: a freed one's pool taken
        over; the same on every rank)."""
        self.run_last = 0.0

    def placement(self, int which, int sc):
        check_class(which, sc, 0)
        return self.where[which][sc]

    def ops(self):
        """The pool's call counter (the same on every rank at a call)."""
        return self.ops_ptr[0]

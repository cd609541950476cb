# The compiled half of path selection (the policy is cxlmpi.select's): the
# route table of adaptive selection (Routes: per collective x size class x
# placement, the path a call takes and until when; every index Python
# hands it is checked before it touches the table, a size class comes from
# a cache file too: cxlmpi.select.cache), and the timing rules every call
# follows: `skip` (a settled MPI class before any parsing), `take` (the
# path, asking the selector in a header step where unsettled), `took`
# (what the call found, and its time for a run in flight).
# (part of cxlmpi._shim: included by pyx/_shim.pyx)


# The mpi4py method of each collective, as errors name it ("Allreduce").
METHODS = tuple(name.capitalize() for name in COLLECTIVES)


cdef int check_class(int which, int sc, int pl) except -1:
    """Raise unless (which, sc, pl) is a class of the table: the indices
    come from Python (a selector; size classes from a cache file too), and
    the table is written with no other check."""
    if 0 <= which < NCOLL and 0 <= sc < CXL_NCLASSES and 0 <= pl < 2:
        return 0
    from .errors import CXLMPIError

    raise CXLMPIError(
        f"adaptive selection: class (collective {which}, size class {sc}, placement "
        f"{pl}) is outside the route table ({NCOLL} x {CXL_NCLASSES} x 2); remove the "
        f"selection cache (CXLMPI_CACHE) if it was hand-made")


cdef int unsettled_path(Routes r, int which, int sc, int pl) except -1:
    """The path a posted call of class (which, sc, pl) takes where the class
    has settled none (a posted call cannot time paths: its ranks do not
    meet): the selector's likeliest pool path for the class, the same on
    every rank, asked once per class."""
    cdef int code = r.likely[which][sc][pl]
    if code == 0:
        code = r.selector.likely(which, sc, pl) if r.selector is not None else 1
        r.likely[which][sc][pl] = code
    return code


DEF RUN_SPANS = 128   # spans a run keeps (a class's first run: at most 100)


cdef class Routes:
    """A communicator's settled choices, per collective x size class x
    placement (0 private, 1 pool: what the class's last pool call found),
    each valid until the pool's call counter reaches its re-check; kept by
    a cxlmpi.select.Selector (`selector`), read here without Python."""
    cdef signed char choice[NCOLL][CXL_NCLASSES][2]
    cdef unsigned char where[NCOLL][CXL_NCLASSES]
    cdef uint64_t due[NCOLL][CXL_NCLASSES][2]
    cdef int first_skip[CXL_NCLASSES]   # run_skip of a class's first run (NEW), by size class
    # What the policy set for each class (`set`), never a timed run's
    # candidate (`start_run`): the path posted calls take, which cannot
    # time one (CXL_PATH_SLOW, or NEW: none settled, see unsettled_path)
    cdef signed char posted[NCOLL][CXL_NCLASSES][2]
    # The path a posted call takes where its class has settled none (0: not
    # asked yet; see unsettled_path)
    cdef signed char likely[NCOLL][CXL_NCLASSES][2]
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
    # Counted calls per call of the run (run_ended_call's "no other call
    # between"): 2 for a pool run of a collective whose every call opens
    # with a header step (`settled_by_header`), else 1
    cdef int run_step
    cdef double run_seconds, run_last
    cdef uint64_t run_last_ops
    cdef long run_calls
    # The spans of a run timed end to end, each call's (the first RUN_SPANS):
    # its figure is their middle half's mean (`middle_mean`)
    cdef double run_spans[RUN_SPANS]

    def __cinit__(self, pool):
        self.pool = pool
        self.ops_ptr = <const uint64_t *><uintptr_t>pool.ops_address()
        self.arena_lo, self.arena_hi = pool.arena_span()
        self.zc_min = pool.zerocopy_min_nbytes
        memset(self.choice, CXL_PATH_SLOW, sizeof(self.choice))
        memset(self.where, 0, sizeof(self.where))
        memset(self.due, 0, sizeof(self.due))
        memset(self.first_skip, 0, sizeof(self.first_skip))
        memset(self.likely, 0, sizeof(self.likely))
        memset(self.posted, CXL_PATH_SLOW, sizeof(self.posted))
        self.run_which = -1

    def set(self, int which, int sc, int pl, int code, uint64_t due):
        """Class (which, sc, pl) takes path `code` (CXL_PATH_SLOW: ask the selector)
        until the call counter reaches `due`; so do its posted calls."""
        self._put(which, sc, pl, code, due)
        self.posted[which][sc][pl] = code

    cdef _put(self, int which, int sc, int pl, int code, uint64_t due):
        check_class(which, sc, pl)
        if not CXL_PATH_NEW <= code <= CXL_PATH_MAX:
            from .errors import CXLMPIError

            raise CXLMPIError(f"adaptive selection: path code {code} is none of "
                              f"{CXL_PATH_NEW}..{CXL_PATH_MAX} (cxlmpi.select's codes)")
        self.choice[which][sc][pl] = code
        self.due[which][sc][pl] = due

    def first_runs(self, calls, skips):
        """Every class of size class sc whose entry is still untouched
        opens with a run of calls[sc] calls on MPI, without a header step
        (0: with one; see `take`), the first skips[sc] after its opening
        one untimed (`run_skip`)."""
        cdef int which, sc, pl
        if len(calls) != CXL_NCLASSES or len(skips) != CXL_NCLASSES:
            from .errors import CXLMPIError

            raise CXLMPIError(f"adaptive selection: first runs for {len(calls)} and "
                              f"{len(skips)} size classes; the route table has {CXL_NCLASSES}")
        for sc in range(CXL_NCLASSES):
            self.first_skip[sc] = skips[sc]
            if calls[sc] > 0:
                for which in range(NCOLL):
                    for pl in range(2):
                        if self.choice[which][sc][pl] == CXL_PATH_SLOW and \
                                not self.due[which][sc][pl]:
                            self.choice[which][sc][pl] = CXL_PATH_NEW
                            self.due[which][sc][pl] = calls[sc]

    def start_run(self, int which, int sc, int pl, int code, uint64_t due, int skip=0):
        """Time the calls of class (which, sc, pl), on path `code`, until the
        call counter reaches `due` (or the next header step): a run; the
        first `skip` calls after its opening one only restart the timing
        (`run_skip`).  Posted calls keep what `set` gave them."""
        cdef uint64_t ops = self.ops_ptr[0]
        self.run_span = due > ops + 1
        self.run_step = 2 if code > 0 and settled_by_header(which) else 1
        if due > ops:   # (`due - ops` calls of the class, counted as they count)
            due = ops + (due - ops) * self.run_step
        self._put(which, sc, pl, code, due)
        self.run_which, self.run_sc, self.run_pl, self.run_code = which, sc, pl, code
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
        cdef double seconds = self.run_seconds
        if self.run_span and 0 < self.run_calls <= RUN_SPANS:
            seconds = middle_mean(self.run_spans, <int>self.run_calls) * self.run_calls
        return (self.run_which, self.run_sc, self.run_pl, self.run_code, seconds,
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


# Per thread (threads may each call on a communicator of their own at
# once): whether the current call times its path for the selector, and the
# routes of a call `skip` sent to MPI for a run -- a reference of its own
# (set_run_routes): a call whose MPI raised leaves it set until the next,
# and the communicator may be freed meanwhile.
cdef extern from *:
    """
    static __thread int cxl_learning;
    static __thread PyObject *cxl_run_routes;
    """
    bint learning "cxl_learning"
    PyObject *_run_routes "cxl_run_routes"


cdef inline void set_run_routes(PyObject *routes) noexcept:
    """Hold `routes` (NULL: none) as this thread's run routes; the routes
    held before are let go last (their release may run Python code)."""
    global _run_routes
    cdef PyObject *held = _run_routes
    Py_XINCREF(routes)
    _run_routes = routes
    Py_XDECREF(held)


cdef double middle_mean(const double *spans, int n) noexcept:
    """The mean of the middle half of `n` spans (of three, the median; of
    one or two, their mean):
    a run's figure per call.  A span that held something else -- the
    program's other work between two calls of a run, a rank descheduled --
    is the run's outlier, not its cost: one span of 3 ms among seven of
    20 us (a benchmark's batch of stock calls between two of the run's)
    made a Scatter path's figure 400 us, its sum's mean."""
    cdef double v[RUN_SPANS]
    cdef double x, total = 0.0
    cdef int i, j, cut
    n = min(n, RUN_SPANS)
    for i in range(n):   # (insertion sort: a run holds at most a hundred)
        x = spans[i]
        j = i - 1
        while j >= 0 and v[j] > x:
            v[j + 1] = v[j]
            j -= 1
        v[j + 1] = x
    cut = max(1, n // 4) if n >= 3 else 0
    for i in range(cut, n - cut):
        total += v[i]
    return total / (n - 2 * cut)


def run_figure(spans) -> float:
    """`middle_mean` of a list of spans (for the tests)."""
    cdef double v[RUN_SPANS]
    cdef int i, n = min(len(spans), RUN_SPANS)
    if n == 0:
        raise ValueError("a run's figure needs a span")
    for i in range(n):
        v[i] = spans[i]
    return middle_mean(v, n)


cdef inline bint settled_by_header(int which) noexcept:
    """Whether every call of `which` that may take the pool settles its
    path in a header step of its own (run.pxi `settle`): only some ranks
    know its sizes."""
    return which == GATHER or which == SCATTER or which == GATHERV or \
        which == SCATTERV or which == ALLTOALLV


cdef inline bint run_goes_on(Routes r, int which) noexcept:
    """Whether the header step of a call of `which` about to start (`settle`)
    is one of the run in flight, not its last: that step carries no
    report and leaves the run going, so that a run of a collective whose
    every call has a header step is timed end to end as the others' are
    (a step ended it after one call, timed alone: a 256 KiB Scatter's
    streaming path, which lets the root write and go, read 16 us where
    back to back it takes 25, and MPI's call, which waits for both, 30
    where it takes 19 -- the class kept the path at 0.7x of stock).  From
    what every rank holds alike: the run, the call counter."""
    return r.run_which == which and r.run_span and \
        r.ops_ptr[0] + 1 < r.due[which][r.run_sc][r.run_pl]


cdef inline void run_ended_call(Routes r) noexcept:
    """A call of a run timed end to end has ended (see Routes.run_span)."""
    cdef double end = now()
    if r.run_last > 0:   # (not the run's opening call)
        if r.run_skip > 0:   # still in the untimed half, back to back or not
            r.run_skip -= 1
        elif r.ops_ptr[0] == r.run_last_ops + r.run_step:
            r.run_seconds += end - r.run_last
            if 0 <= r.run_calls < RUN_SPANS:
                r.run_spans[r.run_calls] = end - r.run_last
            r.run_calls += 1
    r.run_last = end
    r.run_last_ops = r.ops_ptr[0]


cdef void timed_pass(int which) noexcept:
    """`passed` for a call of an MPI run that `skip` let through."""
    global learning
    learning = False
    cdef Routes r = <Routes>_run_routes
    set_run_routes(NULL)
    # (the same collective: a call whose stock MPI raised never got here,
    # and must not lend its mark to the next one)
    if r.run_which == which and r.run_span:
        stat_learn[which] += 1
        run_ended_call(r)


cdef inline bint in_arenas(Routes r, uintptr_t address, Py_ssize_t nbytes) noexcept:
    return r.arena_lo <= address and address + <size_t>nbytes <= r.arena_hi


cdef int take(object comm, object state, int which, Py_ssize_t nbytes, int root,
              uintptr_t a=0, Py_ssize_t an=0, uintptr_t b=0, Py_ssize_t bn=0) except -9:
    """The path of a call of `nbytes` (all blocks together) that the pool
    could take: 0 MPI, FOLLOW MPI without a pass mark, > 0 a pool code.
    Settled classes decide here; the others ask the selector after a
    header step (see cxlmpi.select).

    [a, a + an) and [b, b + bn): this rank's buffers when the call could
    run zero-copy if every rank's were in the pool (0: it could not).  A
    class settled on MPI for private buffers never runs the pool, so it
    would never see that the program now uses pool arrays: a rank whose
    buffers are in the arenas asks in a header step instead, where all
    learn whether every rank's are (then the class's placement is `pool`,
    alike on every rank); where some rank's are not, that rank goes to MPI
    at once and the others follow it there."""
    global learning
    learning = False
    if hosts_apart and which != BARRIER and not within(which, nbytes):
        return 0   # outside the windows of the pool this call set up
    cdef Routes r = state.routes
    if r is None:   # pinned
        return 1 if not adaptive or which == BARRIER or \
            blo[which] <= nbytes < bhi[which] else 0
    cdef int sc = cxl_size_class(nbytes)
    cdef int pl = r.where[which][sc]
    cdef int code = r.choice[which][sc][pl]
    if code == CXL_PATH_NEW and (r.run_which < 0 or r.run_new):
        # The class's first call: MPI, the reference, opens its first run,
        # as the selector would open it, without the header step's cost
        # (every rank meets the class at the same call).  The run's time
        # goes out with the next header step.  It takes the place of a run
        # another class's first call opened (that class has no learner
        # yet: its next call after the run asks in a header step, which
        # opens its run again), not of a run the selector waits for.
        r.start_run(which, sc, pl, 0, r.ops_ptr[0] + r.due[which][sc][pl],
                    r.first_skip[sc])
        r.run_new = True
        learning = True
        return 0
    cdef bint resident = (a != 0 and nbytes >= r.zc_min and in_arenas(r, a, an)
                          and (b == 0 or in_arenas(r, b, bn)))
    if code >= 0 and r.ops_ptr[0] < r.due[which][sc][pl] and (code or pl or not resident):
        learning = which == r.run_which and sc == r.run_sc and pl == r.run_pl
        return code
    cdef double t0 = now()
    sel = r.selector
    report, mine = sel.report()
    try:
        agreed, most, spent = state.pool.header(
            2 * (1 + nbytes) + (not resident), METHODS[which], root, 0, report, mine,
            r.spent_ns)
    except PoolFailure as exc:
        if exc.passed:   # a peer sent the call to MPI: all follow, none learns
            return FOLLOW
        raise run_failed(comm, exc) from None
    sel.delivered(most, spent)
    if not agreed & 1:   # every rank's buffers are in the arenas
        r.where[which][cxl_size_class((agreed >> 1) - 1)] = 1
    code, learning = sel.pick(which, (agreed >> 1) - 1, r.ops_ptr[0])
    r.spent_ns = <uint64_t>((now() - t0) * 1e9)
    return code if code != 0 else FOLLOW   # every rank knows: no pass mark


cdef int take_agreed(object state, int which, Py_ssize_t nbytes) except -9:
    """`take` after a header step that already ran this call (the
    v-collectives' settle): no second one."""
    global learning
    learning = False
    cdef Routes r = state.routes
    if r is None:
        return 1 if not adaptive or blo[which] <= nbytes < bhi[which] else 0
    cdef int sc = cxl_size_class(nbytes)
    cdef int pl = r.where[which][sc]
    cdef int code = r.choice[which][sc][pl]
    if code >= 0 and r.ops_ptr[0] < r.due[which][sc][pl]:
        learning = which == r.run_which and sc == r.run_sc and pl == r.run_pl
        return code
    code, learning = r.selector.pick(which, nbytes, r.ops_ptr[0])
    return code if code != 0 else FOLLOW


cdef inline bint skip(object comm, int which, object obj, Py_ssize_t scale=1) except -1:
    """Whether a bare numpy array `obj` (its bytes are the call's, all
    blocks together) is below `lo[which]` (CXLMPI_THRESHOLD), or its class settled on MPI --
    decided before any message parsing, from what every rank holds alike
    (the size, the routes), so that a call adaptive selection sends to MPI
    costs the pass-through's price.  Not when the residency hint could
    apply (pool-sized messages on a pool with arenas: the buffers' place
    counts).  A call of a run timed on MPI passes too, and `passed` times
    it (`learning`)."""
    global learning
    learning = False
    set_run_routes(NULL)
    if not bare_array(obj):
        return False
    cdef Py_ssize_t nbytes = obj.nbytes * scale
    if nbytes < lo[which]:
        return True
    if not adaptive:
        return False
    state = comm_state(comm)
    return state is not None and settled_on_mpi(state, which, nbytes)


cdef inline bint bare_array(object obj) noexcept:
    global _ndarray
    if _ndarray is None:
        numpy = sys.modules.get("numpy")
        if numpy is None:
            return False
        _ndarray = numpy.ndarray
    return type(obj) is _ndarray


cdef bint rooted_skip(object comm, int which, object whole, object own, bint at_root,
                      int size) except -1:
    """`skip` for Gather and Scatter (`whole`: the root's message of every
    block, `own`: this rank's block): where this rank's buffers are bare
    numpy arrays whose blocks are alike and the call's class is settled on
    MPI, it goes there before any parsing, as `settle` decides after
    parsing both messages and the block checksum (1-2 us a call: 0.9x of
    stock at 64 KiB); a peer whose blocks differ asks in a header step and
    follows this rank's pass.  Only where `settle` takes that shortcut too:
    a pool already set up (the first call sets it up on every rank alike),
    in one group."""
    global learning
    learning = False
    set_run_routes(NULL)
    if disabled or not adaptive or not bare_array(own) or \
            at_root and not bare_array(whole):
        return False
    cdef Py_ssize_t nbytes = own.nbytes * size
    if nbytes < lo[which] or at_root and whole.nbytes != nbytes:
        return False
    state = comm_state(comm)
    return state is not None and state.only is None and \
        settled_on_mpi(state, which, nbytes)


cdef bint settled_on_mpi(object state, int which, Py_ssize_t nbytes,
                         tuple messages=None) except -1:
    """Whether the class of a call of `nbytes` (all blocks together) is
    settled on MPI, its re-check not yet due -- from what every rank holds
    alike, the size and the routes.  Not where the residency hint applies:
    pool-sized messages that may lie in the pool's arenas (`messages`, this
    rank's, each None or parsed; None: not parsed yet) ask in a header step
    whether every rank's do (see `take`).  A call of a run
    timed on MPI is one too: it takes the path a settled class takes (a
    run through `take` would count parsing MPI never pays then), and
    `passed` times it (`learning`)."""
    global learning
    if not adaptive:
        return False
    routes = state.routes
    if routes is None:
        return False
    cdef Routes r = <Routes>routes
    cdef Message m
    if nbytes >= r.zc_min and r.arena_hi:
        if messages is None:
            return False
        for m in messages:
            if m is not None and not in_arenas(r, m.address, <Py_ssize_t>(m.hi - m.lo)):
                break
        else:
            return False   # (every one in the arenas)
    cdef int sc = cxl_size_class(nbytes)
    cdef int pl = r.where[which][sc]
    if r.choice[which][sc][pl] != 0 or r.ops_ptr[0] >= r.due[which][sc][pl]:
        return False
    if which == r.run_which and sc == r.run_sc and pl == r.run_pl:
        learning = True
        set_run_routes(<PyObject *>r)
    return True


cdef inline double clock() noexcept:
    return now() if learning or time_all else 0.0


cdef int took(object state, int which, Py_ssize_t nbytes, int code, int zc,
              double t) except -1:
    """After a call that `take` routed: the placement the pool found (zc:
    1 zero-copy, 0 copied, -1 it followed a peer to MPI), and the time of
    a call of the run in flight (the next header step reports it)."""
    cdef Routes r
    if state is None:
        return 0
    r = state.routes
    if r is None:
        return 0
    if zc >= 0 and code > 0:
        r.where[which][cxl_size_class(nbytes)] = zc
    if learning and zc >= 0 and r.run_which >= 0:
        stat_learn[which] += 1
        if code > 0 and zc != r.run_pl:
            r.run_calls = -(1 << 40)   # it did not run as the run's class: no sample
        elif r.run_span:
            run_ended_call(r)
        else:
            r.run_seconds += now() - t
            r.run_calls += 1
    return 0

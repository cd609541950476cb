# The settings the hot path reads (cxlmpi.config calls `configure`): the
# windows of message sizes that go through the pool, per collective and per
# kind of pool (one host, several); whether selection is adaptive; the
# settings check on COMM_WORLD's first collective.
# (part of cxlmpi._shim: included by pyx/_shim.pyx)


from . import config as _config
from . import spec as _spec

# Per collective, the message sizes (bytes, all blocks together) that go
# through the pool: lo <= nbytes < hi (cxlmpi.config.windows()).  Two
# tables: for a pool on one host (lo1/hi1; small messages pass through:
# MPI reaches those peers through shared memory) and for a pool whose
# ranks run on several hosts (lo2/hi2; MPI would cross the network).
# `lo`/`hi` point at the table of the communicator of the call (`sized`):
# lo1/hi1 unless `hosts_apart` (a file: or dax: pool, which may span
# hosts, and the tables differ), where a communicator without a pool yet
# reads lo2/hi2 (the lower: its first call sets the pool up) and one with
# a pool its own; `take` then checks against the table of the pool found.
#
# `lo`/`hi` are the calling thread's own (threads may each call on a
# communicator of their own at once): set by `enter` at every call where
# the tables differ, so that another thread's call never changes the table
# one call reads.
cdef extern from *:
    """
    static Py_ssize_t cxl_lo1[CXL_NCOLL], cxl_hi1[CXL_NCOLL], cxl_lo2[CXL_NCOLL],
                      cxl_hi2[CXL_NCOLL];
    static __thread Py_ssize_t *cxl_lo = cxl_lo1, *cxl_hi = cxl_hi1;
    """
    Py_ssize_t lo1 "cxl_lo1" [NCOLL]
    Py_ssize_t hi1 "cxl_hi1" [NCOLL]
    Py_ssize_t lo2 "cxl_lo2" [NCOLL]
    Py_ssize_t hi2 "cxl_hi2" [NCOLL]
    Py_ssize_t *lo "cxl_lo"
    Py_ssize_t *hi "cxl_hi"
cdef bint hosts_apart = False
# CXLMPI_TUNING=adaptive: lo/hi are [CXLMPI_THRESHOLD, -) and each
# communicator's Routes choose (a Pool's or a Hierarchy's); where it has
# none, the builtin windows (blo/bhi) decide.
cdef bint adaptive = False
cdef Py_ssize_t blo[NCOLL]
cdef Py_ssize_t bhi[NCOLL]
cdef Py_ssize_t NEVER = PY_SSIZE_T_MAX
cdef bint disabled = False
cdef bint configured = False
# Calls that pass through go straight to the MPI library (shim/direct.pxi):
# its functions were `found`, and CXLMPI_DISABLE is off.
cdef bint found = False
cdef bint straight = False
# Time passed-through calls too (CXLMPI_STATS=1); otherwise only pool calls
# are timed, which keeps two clock reads off the small-message path.
cdef bint time_all = False
# How long the MPI barrier that ends a pool collective (CXLMPI_ORDERING)
# waits for a peer (CXLMPI_TIMEOUT; 0: for ever).
cdef double order_timeout_s = 0


cdef void set_windows(Py_ssize_t *los, Py_ssize_t *his, dict windows):
    for i, name in enumerate(COLLECTIVES):
        window = windows.get(name)
        if window is None:
            los[i] = his[i] = NEVER
        else:
            los[i] = min(window[0], NEVER)
            his[i] = NEVER if window[1] is None else min(window[1], NEVER)


def configure(cfg):
    """Take the settings the hot path needs (called by cxlmpi.config)."""
    global disabled, configured, time_all, adaptive, hosts_apart, lo, hi, _sized_comm, straight
    global order_timeout_s
    set_windows(lo1, hi1, cfg.windows())
    set_windows(lo2, hi2, cfg.windows(hosts=True))
    hosts_apart = _spec.parse_spec(cfg.pool).shared_file and (
        memcmp(lo1, lo2, sizeof(lo1)) != 0 or memcmp(hi1, hi2, sizeof(hi1)) != 0)
    lo, hi = lo1, hi1
    _sized_comm = None
    adaptive = cfg.adaptive
    set_windows(blo, bhi, _config.Config(dict(
        CXLMPI_TUNING="builtin", CXLMPI_THRESHOLD=str(cfg.threshold))).windows())
    disabled = cfg.disable
    straight = found and not disabled
    time_all = cfg.stats
    order_timeout_s = cfg.timeout
    configure_nonblocking(cfg.nonblocking and not disabled, cfg.nonblocking_threshold,
                          cfg.tuning == "pool")
    configured = True


# Messages refused while their call decides its path (messages.pxi: a count
# or block outside the buffer), by thread: `run` and `planned` refuse the
# call where it would take the pool (its peers are told, and raise too); a
# call that goes to MPI gets the message as given, as under stock MPI; the
# next call forgets it.
cdef dict _refusals = {}


cdef inline int note_refusal(object err) except -1:
    """Record `err` for the current call (its first refusal is kept)."""
    _refusals.setdefault(PyThread_get_thread_ident(), err)
    return 0


cdef inline object take_refusal():
    """The current call's refusal (forgotten here), or None."""
    if not _refusals:
        return None
    return _refusals.pop(PyThread_get_thread_ident(), None)


cdef inline int enter(object comm) except -1:
    """At the start of every intercepted blocking call: `enter_posting`,
    and the calls posted on `comm`'s pool end first (shim/nonblocking.pxi).
    A communicator's first one sets its pool up, whatever its size: a
    decision every rank holds alike (the order of the calls), where its
    size is not (a Bcast whose receivers name more bytes than the root
    sends: the receivers would wait in the set-up, the root in MPI).  And
    it reserves the data halves that posted calls found missing
    (`ready_wanted`)."""
    enter_posting(comm)
    if world_check is not None:
        check_world(comm)
    if _live:
        settle_posted(comm)
    if not disabled:
        state = first_state(comm)
        if state.wanted:
            ready_wanted(comm, state)
    return 0


cdef inline object first_state(object comm):
    """`comm`'s pool state, set up here if this is its first blocking
    collective or *_init (collective then), whatever the call's size."""
    if comm_state(comm) is None:
        state_of(comm, BARRIER)
    return comm_state(comm)


cdef inline int enter_init(object comm) except -1:
    """At the start of a persistent collective's *_init, which MPI makes
    nonlocal (it may wait for the peers, and every rank makes it):
    `enter_posting`, and the pool set up as by a blocking call (`enter`),
    whatever the call's size; `init_plan` then reserves its data halves
    where some rank's plan wants them, so that the plan made once can take
    the pool (a plan never waits for the peers: its size is not the same
    on every rank of an erroneous program, see `enter`)."""
    enter_posting(comm)
    if world_check is not None:
        check_world(comm)
    if not disabled:
        first_state(comm)
    return 0


cdef inline int enter_posting(object comm) except -1:
    """At the start of every intercepted call: the settings are read on the
    first one, not at import, so that a malformed variable is reported
    where it matters, once; the windows are those of `comm`'s pool."""
    if not configured:
        _config.get()
    if _refusals:
        take_refusal()
    if hosts_apart:
        sized(comm)
        set_table(_sized_state)   # (this thread's: see lo1)
    return 0


# cxlmpi.wrap(COMM_WORLD) leaves the settings check (a collective step) to
# the first collective on COMM_WORLD: made by every rank at the same point
# of its calls, disabled ranks included (wrap itself may be called by some
# ranks only, or before a point-to-point exchange).
cdef object world_check = None
cdef object _world_handle = MPI.COMM_WORLD.handle


def check_world_first(check):
    """Run `check()` (collective) on the next intercepted blocking
    collective or *_init on COMM_WORLD: not on a posted call, which never
    waits for its peers -- nor takes the pool where no blocking call set
    one up, so no setting chose its path yet."""
    global world_check
    world_check = check


cdef int check_world(object comm) except -1:
    global world_check
    if comm.handle == _world_handle:
        check, world_check = world_check, None
        check()
    return 0

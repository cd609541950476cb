# Nonblocking and persistent collectives: what every family's I-methods and
# *_init methods share (the methods themselves, and the plans that parse
# their messages, live beside the blocking form in each family's file).  A
# plan is made from what every rank holds alike -- the message sizes, the
# op and type, the root, the communicator's settled routes, never a timing
# or a count of calls -- and either the call passes to stock MPI or it is
# posted to the pool's worker (pyx/pool/worker.pxi) behind a generalized
# request, a real MPI.Request (cxlmpi.communicator.requests).  The worker
# runs the same algorithms as the blocking calls, in the order the calls
# were posted, and completes the request; a blocking call on the
# communicator lets it finish first (`settle_posted`, from `enter`).
#
# What goes to MPI, always: pools across hosts or pool groups, and every
# call where MPI was not started with MPI_THREAD_MULTIPLE (the worker
# completes requests from its own thread).  The forms whose sizes only some
# ranks know (Igatherv, Iscatterv, Ialltoallv) take the pool only under
# CXLMPI_TUNING=pool, whatever their size (no size decides their path
# alike on every rank; the worker learns the largest block first).
# A message the pool cannot read in place (a derived datatype, a device
# array) is staged as for a blocking call: copied in when the call is
# posted, out when its request completes (its query, which runs with the
# GIL) -- never sent to MPI on its own, which its peers would not follow.
# (part of cxlmpi._shim: included by pyx/_shim.pyx)


# Per collective: calls posted to the pool, passed to MPI, their bytes, the
# seconds their Wait (CXLMPI's own request method) waited, and the posted
# calls that ran zero-copy (counted as they end in the pool).
cdef double nb_pool[NCOLL]
cdef double nb_pass[NCOLL]
cdef double nb_bytes[NCOLL]
cdef double nb_waited[NCOLL]
cdef uint64_t nb_zc[NCOLL]    # (counted without the GIL: atomically)

# cxlmpi.communicator.requests' PoolRequest (the class of a posted call's
# request), persistent(comm, plan) (a persistent call's request)
cdef object _request_class = None
cdef object _persistent = None
# CXLMPI_NONBLOCKING, MPI_THREAD_MULTIPLE, and MPI_Grequest_complete found
cdef bint nb_on = False
cdef Py_ssize_t nb_floor = 0     # CXLMPI_NONBLOCKING_THRESHOLD
# Ialltoall, Igather and Iscatter take the pool only under
# CXLMPI_TUNING=pool: run by the worker they were slower than stock's at
# some sizes, with private buffers and pool ones alike (bench --overlap at 2
# ranks: results/2026-12-06-vm-2ranks-posted, -rooted), while the blocking
# forms' own selection keeps MPI where MPI wins.
cdef bint nb_every = False


def configure_nonblocking(bint on, Py_ssize_t threshold, bint everything=False):
    """(cxlmpi.config) CXLMPI_NONBLOCKING, where this MPI can host it, and
    CXLMPI_NONBLOCKING_THRESHOLD; `everything` (CXLMPI_TUNING=pool): every
    posted form the pool serves takes it, Ialltoall too."""
    global nb_on, nb_floor, nb_every
    nb_floor = threshold
    nb_every = everything
    path = getattr(MPI, "__file__", None)
    nb_on = (on and found and path is not None and MPI.Is_initialized()
             and MPI.Query_thread() == MPI.THREAD_MULTIPLE
             and greq_setup(path.encode()))


cdef class Plan:
    """A nonblocking call the pool takes: the state, the collective, its
    bytes, and how to post it (`post(*args, flags=flags)`, a
    Pool.post_<family>); `keep` holds its messages' buffers."""
    cdef readonly object state, post, args, keep
    cdef readonly int which, flags       # flags: the variant of the path (V_*)
    cdef tuple fills, drains             # staged messages: copied in at post, out at the end
    cdef readonly Py_ssize_t nbytes
    cdef bint persistent                 # started many times: its Op is made once
    cdef object op                       # ... (the last Start's, rearmed at the next)
    cdef Py_ssize_t starts               # how many times it was posted


cdef inline bint posted_small(object obj, int which) except -1:
    """A bare numpy array `obj` (its bytes are the call's, all blocks
    together) below the smallest posted call the pool takes: MPI, decided
    before any parsing from what every rank holds alike, as `planned`
    would decide after it -- a small posted call costs the pass-through's
    price (parsing its messages cost ~0.5 us a call)."""
    return nb_on and not disabled and bare_array(obj) \
        and <Py_ssize_t>obj.nbytes < max(lo[which], nb_floor)


cdef object posted_state(object comm, int which):
    """`state_of` for a plan: None where the communicator has no pool state
    yet (setting one up waits for the peers)."""
    state = _states.get(comm.handle)
    if state is None:
        return None
    if state.error is not None:
        raise state.error
    if state.pool is None or (state.only is not None and not state.only[which]):
        return None
    return state


cdef int ready_wanted(object comm, object state, bint agree=False) except -1:
    """(`enter`, `init_plan`: a call every rank makes at the same point)
    Reserve the data halves of `comm`'s pool that a posted call found
    missing (`state.wanted`): the next posted calls take the pool.
    `agree`: only where some rank wants them (a header step; `wanted` is
    this rank's own)."""
    wanted = state.wanted
    state.wanted = False
    pool = state.pool
    if type(pool) is not Pool or state.hosts > 1 or pool.ready or pool.short:
        return 0
    pool.drain()
    try:
        if not agree or pool.agree(1 + wanted, "posted calls") > 1:
            pool.prepare("posted calls")
    except PoolFailure as exc:
        raise run_failed(comm, exc)
    return 0


cdef Plan init_plan(object comm, object planner):
    """The plan of a persistent collective's *_init (`planner()`: the
    family's nb_plan_*), which MPI makes nonlocal (every rank makes it, at
    the same point of its calls).  Where the communicator's pool holds no
    data memory yet, its ranks first agree whether any rank's plan wants
    it (or an earlier posted call did), and only then reserve it and plan
    again: a call below CXLMPI_NONBLOCKING_THRESHOLD on every rank
    reserves nothing (64 MiB of /dev/shm by default, before).  Every
    condition read before that step is the same on every rank."""
    state = comm_state(comm)
    plan = planner()
    if state is None or not nb_on or type(state.pool) is not Pool or state.hosts > 1 \
            or state.pool.ready or state.pool.short:
        return plan
    ready_wanted(comm, state, True)
    return planner() if state.pool.ready else plan


cdef Plan planned(object comm, int which, Py_ssize_t nbytes, str method, tuple args,
                  tuple fills, tuple drains, bint any_size=False):
    """The Plan of a call of `nbytes` that the pool could take, or None
    (MPI): the communicator's pool on one host and ready, and its routes'
    settled path for the class.  A plan never waits for its peers (MPI
    requires an I-form to return at once: a rank may post it, then send
    what a peer receives before posting it): where the communicator has no
    pool yet, or its data halves are not reserved, the call goes to MPI,
    and the next blocking collective sets them up (`enter`); a persistent
    *_init sets the pool up before it plans (`enter_init`), and the halves
    where a rank's plan wants them (`init_plan`).  Where the class
    has settled no path, where it has settled none, the builtin
    windows decide, as for a communicator without routes (a posted call
    cannot time its paths), and the pool path is the likeliest variant of
    the class (`unsettled_path`).
    `any_size`: a call whose size differs between ranks (Igatherv,
    Iscatterv, Ialltoallv, this rank's bytes), which no window or route
    decides: the pool's default path."""
    if not any_size and (not within(which, nbytes) or nbytes < nb_floor):
        return None
    state = posted_state(comm, which)
    if state is None or state.hosts > 1 or type(state.pool) is not Pool:
        return None
    pool = state.pool
    exc = pool.failure()
    if exc is not None:   # (an earlier posted call broke the pool)
        raise run_failed(comm, exc)
    if not pool.ready:
        if not pool.short:   # (the next blocking call reserves them: `enter`)
            state.wanted = True
        return None
    cdef int code, sc, pl
    cdef Routes r = state.routes
    if any_size:
        code = 1
    elif r is None:
        code = 1 if not adaptive or blo[which] <= nbytes < bhi[which] else 0
    else:
        sc = cxl_size_class(nbytes)
        pl = r.where[which][sc]
        code = r.posted[which][sc][pl]   # (never a timed run's candidate)
        if code < 0:   # (settled none: the builtin windows, as with no routes)
            code = unsettled_path(r, which, sc, pl) if blo[which] <= nbytes < bhi[which] \
                else 0
    if code <= 0:
        return None
    if _refusals:
        err = take_refusal()
        if err is not None:   # (before the worker touches a byte of it)
            raise _refuse(comm, state, err)
    cdef Plan p = Plan.__new__(Plan)
    p.state, p.which, p.nbytes, p.keep = state, which, nbytes, fills + drains
    p.fills, p.drains = fills, drains
    p.post = getattr(pool, method)
    p.args, p.flags = args, code - 1
    return p


cdef Plan refused_here(object comm, int which, Py_ssize_t nbytes, object why,
                       bint any_size=False):
    """A posted call that its peers decide from what every rank holds alike
    (its size -- `nbytes`, as the peers count it -- or, `any_size`, none),
    whose message this rank's pool cannot take as given (`why`: a reason,
    or the exception its parsing raised, which this rank raises).  Not MPI alone: its
    peers' workers would wait for its step for ever.  Where the peers'
    decision is MPI, MPI takes it on every rank (None); where it is the
    pool, this rank refuses it there and every rank raises, naming it."""
    if isinstance(why, str):
        from .errors import CXLMPIMessageError

        why = CXLMPIMessageError(
            f"message: {why}: the pool cannot take this rank's message, and its peers "
            f"post the call to the pool")
    note_refusal(why)
    try:
        return planned(comm, which, nbytes, "", (), (), (), any_size)
    finally:
        take_refusal()   # (taken by planned where it refused)


def nonblocking_rows():
    """{name: (posted to the pool, passed to MPI, bytes posted, seconds
    waited, 0 (no posted call learns), posted calls that ran zero-copy)}
    of every collective."""
    return {COLLECTIVES[i]: (int(nb_pool[i]), int(nb_pass[i]), int(nb_bytes[i]),
                             nb_waited[i], 0, nb_zc[i]) for i in range(NCOLL)}


def nonblocking_reset():
    for i in range(NCOLL):
        nb_pool[i] = nb_pass[i] = nb_bytes[i] = nb_waited[i] = nb_zc[i] = 0


cdef object nb_request(object comm, Plan plan, int which, object stock, tuple args,
                       bint persistent):
    """The request of a nonblocking (or, `persistent`, a persistent) call:
    `plan`'s, or stock's `stock(comm, *args)`, counted as passed.  A
    persistent one's ranks agree first, in one allreduce (*_init is
    nonlocal): where any rank's plan is MPI, every rank's is -- a plan
    decided from sizes one rank holds alone (a Bcast_init whose root sends
    fewer bytes than its receivers name) would start the pool on some
    ranks and MPI on others."""
    if persistent and nb_on and not disabled and comm_size(comm) > 1:
        votes = array("i", [plan is not None, plan is None])
        MPI.Intracomm(comm).Allreduce(MPI.IN_PLACE, [votes, MPI.INT], MPI.MAX)
        if votes[0] and votes[1]:
            plan = None
    if plan is None:
        nb_pass[which] += 1
        return stock(comm, *args)
    if persistent:
        plan.persistent = True
        return _persistent(comm, plan)
    request = _request_class()
    request._record = post(comm, plan, request)
    return request


# The stock methods, which every form not planned for the pool calls.
cdef object _I = MPI.Intracomm


# The posted forms the pool takes, those it takes only under
# CXLMPI_TUNING=pool (the others count their calls and go to MPI); the
# reference's pool table reads them.
POSTED_TO_POOL = (
    "Ibcast", "Ireduce", "Iallreduce", "Iscan", "Iexscan", "Iallgather",
    "Iallgatherv", "Ireduce_scatter_block", "Ireduce_scatter", "Bcast_init",
    "Reduce_init", "Allreduce_init", "Scan_init", "Exscan_init", "Allgather_init",
    "Allgatherv_init", "Reduce_scatter_block_init", "Reduce_scatter_init")
POSTED_UNDER_TUNING_POOL = (
    "Ialltoall", "Igather", "Iscatter", "Alltoall_init", "Gather_init", "Scatter_init",
    "Igatherv", "Iscatterv", "Ialltoallv", "Gatherv_init", "Scatterv_init", "Alltoallv_init")
NONBLOCKING_METHODS = (
    "Ibarrier", "Ibcast", "Ireduce", "Iallreduce", "Iscan", "Iexscan", "Iallgather",
    "Ialltoall", "Ireduce_scatter_block", "Iallgatherv", "Igather", "Igatherv", "Iscatter",
    "Iscatterv", "Ialltoallv", "Ireduce_scatter", "Barrier_init", "Bcast_init",
    "Reduce_init", "Allreduce_init", "Scan_init", "Exscan_init", "Allgather_init",
    "Allgatherv_init", "Gather_init", "Gatherv_init", "Scatter_init", "Scatterv_init",
    "Alltoall_init", "Alltoallv_init", "Reduce_scatter_block_init", "Reduce_scatter_init")

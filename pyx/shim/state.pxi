# Communicator state: the cxlmpi.pools.state object of each communicator (its
# pool, its routes), and the rank, size and pool of the communicator the
# last call was made on, read once per run of calls on it (`sized`).
# (part of cxlmpi._shim: included by pyx/_shim.pyx)


# communicator handle -> state object (cxlmpi.pools.state._State), filled by
# the set-up cxlmpi.pools.state binds (`bind`), emptied by the MPI attribute
# delete callback.
states = {}
cdef dict _states = states
cdef object _state_for = None
cdef object _fail = None
cdef object _refuse = None
cdef object _order_failed = None


# The communicator the last call was made on, its rank, size, pool state
# (None: none yet) and its pool's pass marker (see to_mpi): a run of calls
# on one communicator asks mpi4py and the states once (rank and size never
# change while a communicator lives; the reference keeps the object from
# being another's; setting a state up forgets it, see state_of; a pool
# closed since is told nothing: note_pass on a closed pool does nothing).
cdef object _sized_comm = None
cdef object _sized_state = None
cdef int _sized_rank = 0, _sized_size = 0
cdef const void *_sized_where = NULL   # where mpi4py keeps its handle (see comm_handle)


cdef inline int sized(object comm) except -1:
    global _sized_comm, _sized_rank, _sized_size, _sized_state, _marked_pool, _marked_fn, \
        _marked_state, _sized_where
    if comm is _sized_comm:
        return 0
    # Everything into locals first: this may run Python code (a finalizer
    # of an object freed on the way), where another thread may call on its
    # own communicator and set these.  Then all of them at once, with no
    # Python code between (the objects they held are kept alive till after:
    # their release could run a finalizer in the middle), so that a call
    # reads one communicator's set, never a mix.
    cdef int rank = comm.Get_rank(), size = comm.Get_size()
    cdef const void *where = <const void *><uintptr_t>_addressof(comm)
    cdef mark_fn fn_c = NULL
    cdef void *st_c = NULL
    state = _states.get(comm.handle)
    pool = state.pool if state is not None else None
    marker = getattr(pool, "pass_marker", None)
    if marker is not None:
        fn, st = marker()
        fn_c = <mark_fn><uintptr_t>fn
        st_c = <void *><uintptr_t>st
    cdef object _held_comm = _sized_comm
    cdef object _held_state = _sized_state
    cdef object _held_pool = _marked_pool
    _sized_rank = rank
    _sized_size = size
    _sized_where = where
    _sized_state = state
    _marked_pool = pool
    _marked_fn = fn_c
    _marked_state = st_c
    _sized_comm = comm
    if hosts_apart:
        set_table(state)   # (this thread's: see lo1)
    return 0


cdef inline void set_table(object state):
    """`lo`/`hi`: the windows of `state`'s pool (see lo1)."""
    global lo, hi
    if state is None or state.hosts > 1:
        lo, hi = lo2, hi2
    else:
        lo, hi = lo1, hi1


cdef inline object comm_state(object comm):
    sized(comm)
    return _sized_state


cdef inline int comm_rank(object comm) except -1:
    sized(comm)
    return _sized_rank


cdef inline int comm_size(object comm) except -1:
    sized(comm)
    return _sized_size


def bind(state_for, fail, order_failed, refuse):
    """Install cxlmpi.pools.state's state set-up and failure reporting (of the
    algorithms, of the MPI barrier that ends a pool collective, of a
    message this rank refused)."""
    global _state_for, _fail, _order_failed, _refuse
    _state_for = state_for
    _fail = fail
    _order_failed = order_failed
    _refuse = refuse


cpdef object pool_of(object comm, int which=-1):
    """The pool of `comm` for collective `which` (-1: the object
    collectives), set up on first use (collective then: every rank must
    call it at the same point); None when its ranks share no pool or their
    pool hierarchy does not run that collective.  Raises the error that
    broke the pool, if one did."""
    global _sized_comm
    if _live:
        settle_posted(comm)
    state = _states.get(comm.handle)
    if state is None:
        _sized_comm = None
        state = _state_for(comm)
    if state.error is not None:
        raise state.error
    if state.only is not None and (which < 0 or not state.only[which]):
        return None
    return state.pool


cdef object state_of(object comm, int which):
    """`pool_of`, returning the communicator's state (None: no pool for
    this collective): its pool and its routes."""
    global _sized_comm
    if _states.get(comm.handle) is None:
        _sized_comm = None
        _state_for(comm)
        sized(comm)   # (the windows of the pool just set up: see `take`)
    return posted_state(comm, which)


def ready_posted(object comm):
    """(the blocking object collectives, cxlmpi.communicator.objects: the
    same call on every rank) `ready_wanted`, where a posted call found
    `comm`'s data halves missing."""
    if disabled:
        return
    state = _states.get(comm.handle)
    if state is not None and state.wanted:
        ready_wanted(comm, state)

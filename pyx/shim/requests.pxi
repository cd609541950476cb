# The requests of posted calls (pyx/shim/nonblocking.pxi plans them): a
# posted call's generalized request, started here with C callbacks, the
# record that keeps its messages until it has ended (`Posted`), and the
# methods of cxlmpi.communicator.requests' request classes that run on
# every call -- Wait, wait, Test, and a persistent request's Start --
# compiled, so that a posted call costs little more than the blocking one
# (a Python class's methods are interpreted: ~0.2 us a frame).
# (part of cxlmpi._shim: included by pyx/_shim.pyx)


cdef extern from "cxl_mpi.h" nogil:
    int cxl_mpi_resolve_greq(const char *module)
    int cxl_mpi_resolve_greq_start(const char *module, const int *at, const int *any,
                                   intptr_t byte)
    int cxl_mpi_greq_start(void *query, void *free_fn, void *cancel, void *extra,
                           intptr_t *request)
    void cxl_mpi_status_empty(void *status)
    void cxl_count(uint64_t *counter)
    int cxl_mpi_int
    void cxl_mpi_complete(Py_ssize_t request)
    int cxl_mpi_order(cxl_h c, double timeout_s, int *ierr)

cdef extern from "Python.h":
    int Py_IsInitialized() nogil

cdef extern from "<sched.h>" nogil:
    int sched_yield()


# A posted call's generalized request, started here with C callbacks: its
# MPI_Wait (MPI_Test, MPI_Waitall, ...) costs no Python where the call ran
# and staged no message, the usual case (mpi4py's MPI.Grequest.Start calls
# three Python functions per request: 1.1 us a call here).
ctypedef struct nb_greq:
    PyObject *record     # the call's record (cxlmpi.communicator.requests), held
    intptr_t handle      # the MPI request
    int rc               # the call's outcome, set before MPI_Grequest_complete
    int which            # the collective
    int python           # its end needs Python: staged receive messages to copy back

cdef int nb_err_request = 0   # MPI_ERR_REQUEST, MPI_ERR_OTHER (this MPI's codes)
cdef int nb_err_other = 0


cdef void nb_complete(uintptr_t request, uintptr_t order, int *rc, int zc) noexcept nogil:
    """The worker's completion of a posted call that ran (`*rc`: OK, or
    the pool's error code; `request`: its nb_greq): the MPI barrier that
    ends a pool collective (CXLMPI_ORDERING; `order`: the private
    communicator, 0: none) -- late or failed, the call fails as a timeout
    (the peer that did not come raised, or stands still), as a blocking
    call's `order` does -- then MPI_Grequest_complete."""
    cdef int ierr = 0
    cdef nb_greq *g = <nb_greq *>request
    if order and rc[0] == 0:
        if cxl_mpi_order(<cxl_h>order, order_timeout_s, &ierr) or ierr:
            rc[0] = -1   # (ERR_TIMEOUT of pyx/pool/layout.pxi)
    g.rc = rc[0]
    if rc[0] == 0 and zc:
        cxl_count(&nb_zc[g.which])
    cdef intptr_t handle = g.handle   # (`g` may be freed once it is complete)
    cxl_mpi_complete(<Py_ssize_t>handle)


cdef int nb_query(void *extra, void *status) noexcept nogil:
    """MPI's query of a posted call's request, once complete: an empty
    status; Python only where the call failed (its error) or staged a
    message (copied back into the user's)."""
    cdef nb_greq *g = <nb_greq *>extra
    cxl_mpi_status_empty(status)
    if g.rc == 0 and not g.python:
        return 0
    if not Py_IsInitialized():
        return nb_err_other
    with gil:
        return nb_query_python(<object>g.record, g.rc)


cdef int nb_query_python(object record, int rc) noexcept:
    """The query's Python part (requests.query); an error is printed and
    returned as its MPI code, as mpi4py does in a callback of its own."""
    try:
        _query_python(record, rc)
        return 0
    except BaseException as exc:
        import traceback

        traceback.print_exception(type(exc), exc, exc.__traceback__)
        return exc.Get_error_code() if isinstance(exc, MPI.Exception) else nb_err_other


cdef int nb_free(void *extra) noexcept nogil:
    """MPI frees a posted call's request: its record is let go (the program
    has completed the request)."""
    cdef nb_greq *g = <nb_greq *>extra
    if Py_IsInitialized():
        with gil:
            (<Posted>g.record).freed = True
            Py_XDECREF(g.record)
    free(g)
    return 0


cdef int nb_cancel(void *extra, int complete) noexcept nogil:
    # MPI: cancelling a nonblocking collective's request is erroneous;
    # stock MPICH fails it, as does this.
    return nb_err_request


cdef bint greq_setup(bytes path) except -1:
    """Find MPI's generalized requests and where MPI_Status keeps its
    source, tag and error (through mpi4py's setters: unique marks); False
    where something is missing (the posted calls then go to MPI)."""
    global nb_err_request, nb_err_other
    if not cxl_mpi_resolve_greq(path):
        return False
    import ctypes

    status = MPI.Status()
    marks = (0x5A3C1E0F, 0x4B2D1F0E, 0x3C1E0F7D)
    status.Set_source(marks[0])
    status.Set_tag(marks[1])
    status.Set_error(marks[2])
    raw = ctypes.string_at(MPI._addressof(status), MPI._sizeof(MPI.Status))
    cdef int at[3]
    cdef int any_[2]
    for i, mark in enumerate(marks):
        word = mark.to_bytes(4, sys.byteorder)
        where = raw.find(word)
        if where < 0 or where % 4 or raw.find(word, where + 1) >= 0:
            return False
        at[i] = where
    any_[0], any_[1] = MPI.ANY_SOURCE, MPI.ANY_TAG
    nb_err_request, nb_err_other = MPI.ERR_REQUEST, MPI.ERR_OTHER
    return cxl_mpi_resolve_greq_start(path, at, any_, <intptr_t>MPI.BYTE.handle)


# Posted calls whose end this process has not seen yet (their records).
cdef list _live = []
cdef object _query_python = None   # requests.query(record, rc): a failed or staged call's end
cdef object _arm = None            # requests._arm(): what the first post sets up
cdef object _persistent_class = None   # requests.PersistentRequest


cdef class Posted:
    """One posted call: its communicator, plan (which holds the messages'
    buffers) and Op; kept (`live`) until the call has ended, and by its
    generalized request until MPI frees it."""
    cdef readonly object comm, op
    cdef readonly Plan plan
    cdef public object error      # its error, made once (`failure`)
    cdef public bint raised       # cxlmpi's Wait raised the error itself
    cdef public bint freed        # the program completed its request: MPI freed it
    cdef Py_ssize_t start         # which Start of its plan (a persistent call's: see `over`)

    def failure(self):
        """The error the user sees where the call failed in the pool, made
        once (it closes the communicator's pool, as a blocking call's)."""
        if self.error is None:
            exc = self.op.error()
            if exc is not None:
                self.error = run_failed(self.comm, exc)
        return self.error


cdef Posted post(object comm, Plan plan, object request):
    """Post `plan`'s call with `request` (an inactive mpi4py request) as
    its generalized request; its record."""
    global _arm
    if _arm is not None:
        arm, _arm = _arm, None
        try:
            arm()
        except BaseException:
            _arm = arm   # (tried again at the next post)
            raise
    cdef Posted record = Posted.__new__(Posted)
    record.comm, record.plan = comm, plan
    start_call(plan, record, request)
    return record


cdef start_call(Plan plan, Posted record, object request):
    """Post `plan`'s call (a Pool.post_<family> Op, counted as posted) for
    `record` (the Op is set here), start its
    generalized request with C callbacks into `request` (an inactive
    mpi4py request: its handle is written where mpi4py keeps it), and hand
    the call to its pool's worker, which completes the request once the
    call has run -- after the MPI barrier on the state's private
    communicator that ends a pool collective under CXLMPI_ORDERING."""
    for m in plan.fills:
        fill(m)
    op = plan.op
    if op is None or not op.rearm():   # (a persistent call's Op is made once)
        op = plan.post(*plan.args, flags=plan.flags)
        if plan.persistent:
            plan.op = op
    record.op = op
    plan.starts += 1
    record.start = plan.starts
    nb_pool[plan.which] += 1
    nb_bytes[plan.which] += plan.nbytes
    state = plan.state
    cdef uintptr_t order = 0
    if state.order is not None and state.order_at:
        order = <uintptr_t>cxl_mpi_read(<const void *><uintptr_t>state.order_at)
    cdef uintptr_t where = MPI._addressof(request)
    op.admit()   # (may raise: before a request exists that only the worker completes)
    cdef nb_greq *g = <nb_greq *>calloc(1, sizeof(nb_greq))
    if g == NULL:
        raise MemoryError()
    g.which, g.python = plan.which, len(plan.drains) > 0
    cdef int rc
    with nogil:   # (never call MPI holding the GIL: MPI may call nb_free, which takes it)
        rc = cxl_mpi_greq_start(<void *>nb_query, <void *>nb_free, <void *>nb_cancel,
                                g, &g.handle)
    if rc:
        free(g)
        raise MPI.Exception(rc)
    Py_XINCREF(<PyObject *>record)
    g.record = <PyObject *>record
    if cxl_mpi_int:
        (<int *>where)[0] = <int>g.handle
    else:
        (<intptr_t *>where)[0] = g.handle
    try:
        op.submit(<uintptr_t>&nb_complete, <uintptr_t>g, order)
    except BaseException:
        # (admitted, but the GIL was let go for MPI: another thread closed
        # the pool.  The request, which the program never gets, ends as
        # failed, and MPI frees it: nb_free lets the record go.)
        g.rc = -1
        with nogil:
            cxl_mpi_complete(<Py_ssize_t>g.handle)
        MPI.Request.Free(request)
        raise
    live(record)


def finish(Plan plan):
    """After a posted call ran (its request's query, in the thread that
    completes it): copy staged receive messages back into the user's."""
    for m in plan.drains:
        drain(m)


cdef int settle_posted(object comm) except -1:
    """Before a call runs anything on `comm`'s pool in this thread: let its
    worker end the calls posted before, and forget the records of every
    ended call."""
    global _live
    state = _states.get(comm.handle)
    if state is not None:
        pool = state.pool
        if type(pool) is Pool:
            if pool.posted:
                pool.drain()
            exc = pool.failure()
            if exc is not None:   # (a posted call broke the pool: closed first)
                raise run_failed(comm, exc)
    _live = [r for r in _live if not over(r)]
    return 0


def finish_posted():
    """MPI_Finalize has begun: let every pool's worker end the calls posted
    to it (they still progress MPI and complete their requests); returns
    how many the program had not completed (Wait, Test: MPI freed their
    request) -- not how many the worker had not ended yet, which depends
    on timing."""
    global _live
    pending = sum(1 for r in _live if not r.freed)
    for state in list(_states.values()):
        pool = state.pool
        if type(pool) is Pool and pool.posted:
            pool.drain()
    _live = []
    return pending


cdef inline bint over(Posted r) except -1:
    """Whether `r`'s call has ended (a persistent call's later Start reuses
    its Op: then it has -- `persistent_Start` waits for the call it ran
    before it starts the next)."""
    return r.start != r.plan.starts or r.op.done


cdef live(record):
    """Keep `record` (its messages) until its call has ended (forgotten at
    the next blocking call, or here once many are kept)."""
    global _live
    if len(_live) >= 64:
        _live = [r for r in _live if not over(r)]
    _live.append(record)


# The methods of cxlmpi.communicator.requests' classes that every posted
# call runs (bound there: `Wait = _shim.request_Wait`); `_mpi`, the class's
# MPI request class (MPI.Grequest, MPI.Prequest), completes the request.

cdef Posted record_of(object request):
    """The record of a list's request, where it is cxlmpi's and has one (a
    copy, PoolRequest(r), has none)."""
    if type(request) is not _request_class and type(request) is not _persistent_class:
        return None
    return getattr(request, "_record", None)


cdef int end_call(Posted r) except -1:
    """Sleep until the worker has run the call (instead of spinning in
    MPI's progress loop: the worker may need this core), or run it here
    where the worker has not taken it yet; counted as waited."""
    cdef double t0 = now()
    r.op.wait()
    nb_waited[r.plan.which] += now() - t0
    return 0


cdef int ran(object request, object mpi) except -1:
    """End `request`'s call (`end_call`); raise cxlmpi's error where it
    failed in the pool, once MPI has completed the request."""
    cdef Posted r = getattr(request, "_record", None)   # (its own method: no type check)
    if r is None:
        return 0
    end_call(r)
    request._record = None
    error = r.failure()
    if error is not None:
        r.raised = True
        mpi.Wait(request)
        raise error
    return 0


def request_Wait(self, status=None):
    """Wait for the call to end (MPI_Wait)."""
    mpi = type(self)._mpi
    ran(self, mpi)
    return mpi.Wait(self, status)


def request_wait(self, status=None):
    """Wait for the call to end (mpi4py's `wait`: the message, here None)."""
    mpi = type(self)._mpi
    ran(self, mpi)
    return mpi.wait(self, status)


def request_Test(self, status=None):
    """Whether the call has ended (MPI_Test); where not, the core is offered
    to the worker that runs it (a loop of Tests would keep it from a worker
    that shares the core: 3-5x stock's time per call, before)."""
    mpi = type(self)._mpi
    cdef Posted r = getattr(self, "_record", None)
    if r is not None and not r.op.done:
        with nogil:
            sched_yield()
        return False
    ran(self, mpi)
    return mpi.Test(self, status)


def persistent_Start(self):
    """Post the persistent call's plan again (MPI_Start)."""
    if self._freed or self != MPI.REQUEST_NULL:
        raise MPI.Exception(MPI.ERR_REQUEST)   # (freed, or still active)
    record = self._record
    if record is not None:
        (<Posted>record).op.wait()   # (completed by MPI: its worker is ending it)
    cdef Plan plan = self._plan
    comm = self._comm
    state = _states.get(comm.handle)
    if state is not None and state is plan.state and state.error is not None:
        raise state.error   # (an earlier call failed: the pool is closed)
    if state is None or state is not plan.state or state.pool is None:
        raise MPI.Exception(MPI.ERR_COMM)   # (its communicator was freed)
    self._record = post(comm, plan, self)


cdef object _stock_waitall = MPI.Request.Waitall   # (mpi4py's, before any routing)
cdef object _stock_waitall_obj = MPI.Request.waitall
cdef object _stock_waitany = MPI.Request.Waitany
cdef object _stock_waitsome = MPI.Request.Waitsome
cdef object _stock_waitany_obj = MPI.Request.waitany
cdef object _stock_waitsome_obj = MPI.Request.waitsome
cdef object _stock_testall = MPI.Request.Testall
cdef object _stock_testany = MPI.Request.Testany
cdef object _stock_testsome = MPI.Request.Testsome
cdef object _stock_testall_obj = MPI.Request.testall
cdef object _stock_testany_obj = MPI.Request.testany
cdef object _stock_testsome_obj = MPI.Request.testsome


cdef int requests_end(object requests) except -1:
    """Let the calls of the list's pool requests end -- sleep until the
    worker has run each, or run it here -- before MPI waits for the list
    (MPI completes their requests, failures included, as before)."""
    cdef Posted r
    for request in requests:
        r = record_of(request)
        if r is not None:
            end_call(r)
    return 0


cdef bint running(object requests) except -1:
    """Whether the list holds a pool call that has not ended."""
    cdef Posted r
    for request in requests:
        r = record_of(request)
        if r is not None and not r.op.done:
            return True
    return False


cdef int offer_core(object requests) except -1:
    """Where the list holds a pool call that has not ended, let the
    scheduler run another thread -- the worker, where it shares this core
    -- before MPI tests the list: a loop of tests never sleeps, and would
    keep the worker off the core (MPI_Test/Testall loops took 3-5x stock's
    time per call)."""
    if running(requests):
        with nogil:
            sched_yield()
    return 0


# MPI.Request's list functions, once the pool has taken a posted call
# (cxlmpi.communicator.requests routes them): MPI's own wait may spin
# without yielding the core (Open MPI's does; MPICH's yields only now and
# then) to the worker that must end the list's pool calls, and a test
# loop always does.  Waitany and Waitsome, which return as soon as any
# request ends, test the list and yield the core in turn while a pool call
# of it runs (2.5x stock's time per call, before), then wait in MPI.

def routed_Waitany(cls, requests, status=None):
    """Wait for any request of the list to complete (MPI_Waitany)."""
    while running(requests):
        index, done = _stock_testany(requests, status)
        if done:
            return index
        with nogil:
            sched_yield()
    return _stock_waitany(requests, status)


def routed_waitany(cls, requests, status=None):
    """mpi4py's waitany: (index, its message)."""
    while running(requests):
        index, done, message = _stock_testany_obj(requests, status)
        if done:
            return index, message
        with nogil:
            sched_yield()
    return _stock_waitany_obj(requests, status)


def routed_Waitsome(cls, requests, statuses=None):
    """Wait for some requests of the list to complete (MPI_Waitsome)."""
    while running(requests):
        indices = _stock_testsome(requests, statuses)
        if indices is None or indices:
            return indices
        with nogil:
            sched_yield()
    return _stock_waitsome(requests, statuses)


def routed_waitsome(cls, requests, statuses=None):
    """mpi4py's waitsome: (the indices complete, their messages)."""
    while running(requests):
        indices, messages = _stock_testsome_obj(requests, statuses)
        if indices is None or indices:
            return indices, messages
        with nogil:
            sched_yield()
    return _stock_waitsome_obj(requests, statuses)


def routed_Testall(cls, requests, statuses=None):
    """Test whether every request of the list is complete (MPI_Testall)."""
    offer_core(requests)
    return _stock_testall(requests, statuses)


def routed_Testany(cls, requests, status=None):
    """Test whether any request of the list is complete (MPI_Testany)."""
    offer_core(requests)
    return _stock_testany(requests, status)


def routed_Testsome(cls, requests, statuses=None):
    """Test which requests of the list are complete (MPI_Testsome)."""
    offer_core(requests)
    return _stock_testsome(requests, statuses)


def routed_testall(cls, requests, statuses=None):
    """mpi4py's testall: (whether all are complete, their messages)."""
    offer_core(requests)
    return _stock_testall_obj(requests, statuses)


def routed_testany(cls, requests, status=None):
    """mpi4py's testany: (index, whether complete, its message)."""
    offer_core(requests)
    return _stock_testany_obj(requests, status)


def routed_testsome(cls, requests, statuses=None):
    """mpi4py's testsome: (the indices complete, their messages)."""
    offer_core(requests)
    return _stock_testsome_obj(requests, statuses)


def routed_Waitall(cls, requests, statuses=None):
    """Wait for every request of the list (MPI_Waitall)."""
    requests_end(requests)
    return _stock_waitall(requests, statuses)


def routed_waitall(cls, requests, statuses=None):
    """Wait for every request of the list (mpi4py's waitall: their messages)."""
    requests_end(requests)
    return _stock_waitall_obj(requests, statuses)


def bind_requests(request_class, persistent_class, persistent, query, arm):
    """Install cxlmpi.communicator.requests' request classes and persistent
    request maker, the Python end of a failed or staged call, and what the
    first post arms."""
    global _request_class, _persistent_class, _persistent, _query_python, _arm
    _request_class, _persistent_class, _persistent = request_class, persistent_class, persistent
    _query_python, _arm = query, arm


def request_ran(self):
    """(Free) Let the call end, as Wait does, without completing the request."""
    ran(self, type(self)._mpi)

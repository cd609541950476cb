# Barrier and Bcast, as CXLComm intercepts them: parse the message, let
# `take` name the path, run Pool.barrier / Pool.bcast (pyx/pool/bcast.pxi)
# or pass the call to stock MPI.  Module-level functions, bound as methods
# of CommBase in pyx/_shim.pyx; their nonblocking and persistent forms end
# the file.
# (part of cxlmpi._shim: included by pyx/_shim.pyx)


def Barrier(self):
    """Barrier synchronization (in the pool once the pool exists, with
    CXLMPI_ORDERING=0; with ordering, stock MPI's own barrier does its work)."""
    enter(self)
    cdef double t0 = start(), t
    state = comm_state(self)
    cdef int code = 0, zc = 0
    # (with CXLMPI_ORDERING a pool Barrier would end in an MPI barrier:
    # the stock one alone does the same)
    if not disabled and state is not None and state.pool is not None \
            and state.order is None:
        code = take(self, state, BARRIER, 0, -1)
    if code <= 0:
        if code == 0:
            to_mpi(self)
        t = clock()
        pass_barrier(self)
        passed(BARRIER, t0)
    else:
        t = t0 = now()
        zc = run(self, BARRIER, code, _stock_barrier, (self,), state.pool.barrier, ())
        if zc >= 0:
            pooled(BARRIER, 0, t0)
    took(state, BARRIER, 0, code, zc, t)


def Bcast(self, buf, int root=0):
    """Broadcast data from one process to all other processes."""
    enter(self)
    cdef double t0 = start(), t
    cdef Message msg = None, parsed = None
    cdef int code = 0, zc = 0
    if not disabled and not skip(self, BCAST, buf) and 0 <= root < comm_size(self):
        msg = parsed = message(buf, root != comm_rank(self), 0, lo[BCAST])
        if msg is not None and not within(BCAST, msg.nbytes):
            msg = None
    state = state_of(self, BCAST) if msg is not None else None
    if state is not None:
        code = take(self, state, BCAST, msg.nbytes, root, msg.address, msg.nbytes)
    if code <= 0:
        if code == 0:
            to_mpi(self)
        t = clock()
        pass_bcast(self, buf, root, parsed, parsed is not None)
        passed(BCAST, t0)
    else:
        t = now()
        if not time_all:
            t0 = t
        if root == comm_rank(self):
            fill(msg)
        zc = run(self, BCAST, code, _stock_bcast, (self, buf, root,), state.pool.bcast,
                 (msg.address, msg.nbytes, root))
        if zc >= 0:
            if root != comm_rank(self):
                drain(msg)
            pooled(BCAST, msg.nbytes, t0)
    if state is not None:
        took(state, BCAST, msg.nbytes, code, zc, t)


# ------------------------------------------------ nonblocking and persistent
# The I-forms post the call the plan names (shim/nonblocking.pxi) or pass it
# to stock MPI, counted; the persistent forms plan once, at *_init, and
# every Start posts the same plan.


cdef Plan nb_plan_bcast(object comm, object buf, int root):
    if not nb_on or disabled or not 0 <= root < comm_size(comm):
        return None
    cdef bint rooted = root == comm_rank(comm)
    cdef Message m = message(buf, not rooted, 0, lo[BCAST], STAGE_ANY)
    if m is None:
        return None
    return planned(comm, BCAST, m.nbytes, "post_bcast", (m.address, m.nbytes, root),
                   (m,) if rooted else (), () if rooted else (m,))


def Ibarrier(self):
    """Nonblocking Barrier: always MPI's (posting one costs more than the
    pool's barrier saves; with CXLMPI_ORDERING, MPI's barrier does its
    work anyway)."""
    enter_posting(self)
    return nb_request(self, None, BARRIER, _I.Ibarrier, (), False)


def Ibcast(self, buf, int root=0):
    """Nonblocking Broadcast."""
    enter_posting(self)
    plan = None if posted_small(buf, BCAST) else nb_plan_bcast(self, buf, root)
    return nb_request(self, plan, BCAST, _I.Ibcast, (buf, root), False)


def Barrier_init(self, info=MPI.INFO_NULL):
    """Persistent Barrier: always MPI's, as `Ibarrier`."""
    enter_init(self)
    return nb_request(self, None, BARRIER, _I.Barrier_init, (info,), True)


def Bcast_init(self, buf, int root=0, info=MPI.INFO_NULL):
    """Persistent Broadcast."""
    enter_init(self)
    plan = init_plan(self, lambda: nb_plan_bcast(self, buf, root))
    return nb_request(self, plan, BCAST, _I.Bcast_init, (buf, root, info), True)

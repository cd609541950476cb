# Nonblocking collectives: the Pool (the blocking collectives of
# pool/pool.pxi, plus `post_<family>` entries that return an Op), and the
# worker that runs the posted calls: one thread per pool, started at its
# first posted call, that takes the calls in the order they were posted
# (the order every rank posts them in, as MPI requires) and runs each with
# its family's run_<family> -- the same algorithms, variants and waits as a
# blocking call, in another thread.  It sleeps on a condition variable (a
# futex) while nothing is posted, and inside a call it waits as a blocking
# call does (spin, then sleep on the awaited peer's word), so an idle
# worker costs its rank's core nothing.  It sleeps as SCHED_BATCH: woken
# by a post, it does not preempt the thread that posted; it runs at once
# on a spare core where there is one, else as soon as its rank's thread
# sleeps (in Wait, a blocking call) -- and a Wait that comes first runs
# the call itself, in line, with no switch to the worker and back (a
# posted call waited for at once costs about what the blocking call
# does).  It runs each call as an ordinary thread (SCHED_OTHER: woken by a
# peer inside the call, it preempts).  Where the rank's thread keeps the
# core instead -- it computes, or spins inside MPI (Open MPI's waits do,
# MPICH's yield) -- a batch worker would run only when the scheduler's
# time slice ends, milliseconds later: a call it finds waiting at the head
# of the queue that long (STARVED_S) keeps it an ordinary thread until it
# is idle again EAGER_S later (each rank's worker on its own clock).
# When a call ends, the worker
# calls the completion function it was given (MPI_Grequest_complete on the
# call's generalized request: cxlmpi._shim).  A caller that waits for a
# call the worker has not taken yet runs it itself (`claim_or_wait`).
#
# The caller's side (cxlmpi._shim) keeps to two rules: it posts a call
# only from what every rank holds alike (so each rank's worker meets the
# same calls in the same order), and it lets the worker finish a pool's
# calls (`drain`) before it runs anything else on that pool itself.
# (part of cxlmpi._pool: included by pyx/_pool.pyx)


cdef extern from "<pthread.h>" nogil:
    ctypedef unsigned long pthread_t
    ctypedef struct pthread_mutex_t:
        pass
    ctypedef struct pthread_cond_t:
        pass
    int pthread_create(pthread_t *thread, const void *attr,
                       void *(*start)(void *) noexcept nogil, void *arg)
    int pthread_join(pthread_t thread, void **ret)
    int pthread_mutex_init(pthread_mutex_t *m, const void *attr)
    int pthread_mutex_destroy(pthread_mutex_t *m)
    int pthread_mutex_lock(pthread_mutex_t *m)
    int pthread_mutex_unlock(pthread_mutex_t *m)
    int pthread_cond_init(pthread_cond_t *c, const void *attr)
    int pthread_cond_destroy(pthread_cond_t *c)
    int pthread_cond_wait(pthread_cond_t *c, pthread_mutex_t *m)
    int pthread_cond_broadcast(pthread_cond_t *c)

cdef extern from "<signal.h>" nogil:
    ctypedef struct sigset_t:
        pass
    int sigfillset(sigset_t *s)
    int pthread_sigmask(int how, const sigset_t *s, sigset_t *old)
    int SIG_SETMASK

cdef extern from "<sched.h>" nogil:
    struct sched_param:
        int sched_priority
    int sched_setscheduler(int pid, int policy, const sched_param *param)
    int sched_getscheduler(int pid)
    int SCHED_BATCH, SCHED_OTHER

# A worker that finds a call at the head of its queue for longer than this
# (seconds) was kept off the core by its rank's thread, and stays an
# ordinary thread for the next EAGER_S (see worker_main).
cdef double STARVED_S = 0.001
cdef double EAGER_S = 1.0


# The families a worker runs (the run_<family> entries).
cdef enum:
    F_BCAST, F_REDUCE, F_SCAN, F_GATHER, F_EXCHANGE, F_REDUCE_SCATTER

# An Op's state.
cdef enum:
    QUEUED, RUNNING, DONE

ctypedef void (*cxl_complete_fn)(uintptr_t, uintptr_t, int *, int) noexcept nogil


cdef struct cxl_op:
    int family
    uint64_t kind                 # the signature (see sign_call)
    int root, op, tcode, flags
    uint64_t sig_nbytes, pairs
    char *a                       # the send buffer (Bcast: the buffer)
    char *b                       # the receive buffer
    size_t count, itemsize, n, max_nbytes   # count (gathers, exchanges): see largest_block
    cxl_reduce_fn fn
    int option                    # Scan: exclusive; Reduce_scatter: in place
    char **addrs                  # Gather: receive blocks; exchanges: send blocks
    size_t *sizes
    char **addrs2                 # exchanges: receive blocks
    size_t *sizes2
    cxl_complete_fn complete      # called with (request, after, &rc, zc) once the call ran
    uintptr_t request, after
    int state                     # QUEUED, RUNNING, DONE (under the worker's lock)
    int rc, failed_rank, zc
    double still_s, lease_s
    cxl_op *next


cdef struct cxl_worker:
    pthread_t thread
    pthread_mutex_t mu
    pthread_cond_t work           # the thread waits here for calls
    pthread_cond_t ended          # callers wait here for a call to end
    cxl_op *head                  # the calls in posting order; head: running or next
    cxl_op *tail
    state_t *st
    int stopping
    int broken_rc                 # a call failed where the ranks are out of step (else OK)
    int broken_rank
    double head_s                 # when the head call became the head (monotonic)
    int batch                     # the thread runs as SCHED_BATCH (see worker_main)
    int fixed                     # ... never: the job chose its own policy
    double eager_until            # ... not before then: it was starved


cdef int largest_block(state_t *st, cxl_op *o) noexcept nogil:
    """A posted v-collective whose ranks do not know the largest block
    (`max_nbytes` MAX_VARIES; `count`: this rank's largest): a header step
    first, whose maximum every rank then runs the call with.  Its first
    step checks the call's signature, block checksum included, before any
    data moves.  Other calls: nothing."""
    if o.max_nbytes != CXL_MAX_VARIES:
        return OK
    cdef uint64_t extra[2]
    cdef uint64_t agreed = 0
    extra[0] = extra[1] = 0
    cdef int rc = agree_max(st, 1 + o.count, 0, extra, &agreed, extra)
    if rc == OK:
        o.max_nbytes = agreed - 1
    return rc


cdef int run_op(state_t *st, cxl_op *o) noexcept nogil:
    """Run posted call `o` in the pool, as the blocking entry of its family
    would (Pool._expect, run_<family>, Pool._done)."""
    cdef int rc = OK
    if revoked(st):
        st.failed_rank = st.rank
        return ERR_REVOKED
    sign_call(st, o.kind, o.root, o.op, o.tcode, o.sig_nbytes, o.pairs, o.flags)
    if o.family == F_BCAST:
        rc = run_bcast(st, o.a, o.n, o.root, o.flags)
    elif o.family == F_REDUCE:
        rc = run_reduce(st, o.a, o.b, o.count, o.itemsize, o.fn, o.root, o.flags)
    elif o.family == F_SCAN:
        rc = run_scan(st, o.a, o.b, o.count, o.itemsize, o.fn, o.option, o.flags)
    elif o.family == F_GATHER:
        rc = largest_block(st, o)
        if rc == OK:
            rc = run_gather(st, o.a, o.n, o.addrs, o.sizes, o.root, o.max_nbytes, o.flags)
    elif o.family == F_EXCHANGE:
        rc = largest_block(st, o)
        if rc == OK:
            rc = run_exchange(st, <const char **>o.addrs, o.sizes, o.addrs2, o.sizes2,
                              o.max_nbytes, o.flags)
    elif o.family == F_REDUCE_SCATTER:
        rc = run_reduce_scatter(st, <const char **>o.addrs, o.sizes, o.b, o.itemsize, o.fn,
                                o.option, o.flags)
    if rc == OK and revoked(st):
        st.failed_rank = st.rank
        rc = ERR_REVOKED
    return rc


cdef void run_posted(cxl_worker *w, cxl_op *o) noexcept nogil:
    """Run `o`, the head of `w`'s calls, claimed (RUNNING) by this thread --
    the worker's, or a caller's that waits for it (`claim_or_wait`) -- and
    complete it; the lock is not held.  Once the worker is stopping, or a
    call before broke the pool, it ends with ERR_CLOSED."""
    cdef int rc
    if w.stopping or w.broken_rc != OK:
        rc = ERR_CLOSED
        w.st.failed_rank = w.st.rank
    else:
        rc = run_op(w.st, o)
    o.failed_rank = w.st.failed_rank
    o.zc = w.st.took_zc
    o.still_s, o.lease_s = w.st.still_s, w.st.lease_s
    if o.complete != NULL:   # (before DONE: a drained pool's caller may use MPI next)
        o.complete(o.request, o.after, &rc, o.zc)   # (an ordering barrier late: rc)
    o.rc = rc
    pthread_mutex_lock(&w.mu)
    if rc != OK and rc != ERR_MISMATCH and rc != ERR_CLOSED and w.broken_rc == OK:
        w.broken_rc, w.broken_rank = rc, o.failed_rank
    w.head = o.next
    w.head_s = cxl_now_s()
    if w.head == NULL:
        w.tail = NULL
    o.state = DONE          # (the op may be freed from here on)
    pthread_cond_broadcast(&w.ended)
    if w.head != NULL or w.stopping:
        pthread_cond_broadcast(&w.work)   # (the next call, where a caller ran this one)


cdef void claim_or_wait(cxl_worker *w) noexcept nogil:
    """(lock held) A caller waits for a posted call to end: where the
    worker has not taken the head call yet, the caller runs it itself, in
    its own thread (the calls still run one at a time, in posting order),
    so that a call waited for at once pays no hand-over to the worker and
    back; else it sleeps until a call ends."""
    cdef cxl_op *o = w.head
    if o != NULL and o.state == QUEUED:
        o.state = RUNNING
        pthread_mutex_unlock(&w.mu)
        run_posted(w, o)    # (takes the lock back)
    else:
        pthread_cond_wait(&w.ended, &w.mu)


cdef void *worker_main(void *arg) noexcept nogil:
    """The worker's thread: run the posted calls in order; sleep while
    there is none (or while a caller runs the head one); once stopping,
    end the calls still queued with ERR_CLOSED (their requests complete:
    no Wait is left hanging), as after a call that failed where the ranks
    are out of step (a timeout, a peer gone: `broken_rc`; the caller
    closes the pool next)."""
    cdef cxl_worker *w = <cxl_worker *>arg
    cdef cxl_op *o
    cdef sched_param policy
    policy.sched_priority = 0
    # (only from the ordinary policy: a job run under a real-time one, or
    # as SCHED_IDLE, keeps what it chose)
    w.batch = sched_getscheduler(0) == SCHED_OTHER \
        and sched_setscheduler(0, SCHED_BATCH, &policy) == 0
    w.fixed = not w.batch
    pthread_mutex_lock(&w.mu)
    while True:
        o = w.head
        if o == NULL and w.stopping:
            break
        if o == NULL or o.state != QUEUED:
            if not w.batch and not w.fixed and cxl_now_s() >= w.eager_until:
                # (idle: the next post must not preempt)
                w.batch = sched_setscheduler(0, SCHED_BATCH, &policy) == 0
            pthread_cond_wait(&w.work, &w.mu)
            continue
        if not w.fixed and cxl_now_s() - w.head_s > STARVED_S:
            # (the call waited this long at the head of the queue, and its
            # rank's thread did not run it: that thread computes, or spins
            # inside MPI -- Open MPI's Waitany does, for ever, on a request
            # only this thread completes.  For the next EAGER_S the worker
            # preempts it as soon as it is woken, and again after the next
            # such wait: not for good, where one delay -- another process
            # on the core, a page fault -- would make every later post
            # preempt its thread, a switch to the worker and back: 2.5x a
            # small call's time.)
            w.eager_until = cxl_now_s() + EAGER_S
        if w.batch and sched_setscheduler(0, SCHED_OTHER, &policy) == 0:
            w.batch = 0   # (running a call: woken by a peer, it preempts)
        o.state = RUNNING
        pthread_mutex_unlock(&w.mu)
        run_posted(w, o)    # (takes the lock back)
    pthread_mutex_unlock(&w.mu)
    return NULL


cdef class Op:
    """A collective posted to a pool's worker: created by Pool.post_<family>,
    started by `submit`; its memory (the C call, the block arrays, the
    Python objects given as `keep`) lives until the Op is gone, which its
    owner lets happen only once it is `done`."""
    cdef cxl_op *c
    cdef Pool pool
    cdef readonly str what
    cdef object keep
    cdef bint submitted
    cdef cxl_op made              # the call as post_<family> made it (`rearm`)

    def __cinit__(self):
        self.c = <cxl_op *>calloc(1, sizeof(cxl_op))
        if self.c == NULL:
            raise MemoryError()

    def __dealloc__(self):
        if self.c != NULL and (not self.submitted or self.c.state == DONE):
            free(self.c)
        # (else the worker still holds it: leaked, never written after free)

    def admit(self):
        """Raise where `submit` would: the pool closed, its worker not
        startable.  (Its caller then starts what only the worker ends.)"""
        self.pool._admit()

    def submit(self, uintptr_t complete=0, uintptr_t request=0, uintptr_t after=0):
        """Queue the call on its pool's worker; `complete(request, after,
        &rc, zerocopy)` (a C function's address, 0: none) is called once
        it ran, before the call counts as ended."""
        if self.submitted:
            raise ValueError("a posted collective is submitted once (rearm it first)")
        self.made = self.c[0]
        self.c.complete = <cxl_complete_fn>complete
        self.c.request, self.c.after = request, after
        self.pool._submit(self)
        self.submitted = True

    def rearm(self):
        """Make the call, once it has ended, ready to be submitted again as
        post_<family> made it (a persistent collective's next Start: its
        plan, and the buffers `keep` holds, are the same); False where it
        has not ended."""
        if not self.done:
            return False
        self.c[0] = self.made   # (what running it changed: its outcome, a header step's maximum)
        self.submitted = False
        return True

    @property
    def done(self):
        """Whether the call has ended (in the pool, or failed)."""
        return self.submitted and self.pool._ended(self.c)

    def wait(self):
        """Wait (without the GIL, asleep) until the call has ended."""
        if self.submitted:
            self.pool._wait(self.c)

    @property
    def flags(self):
        """The variant (V_*) the call runs with."""
        return self.c.flags

    @property
    def zerocopy(self):
        return self.c.zc != 0

    def error(self, int rc=OK):
        """None when the call ran, else the PoolFailure that ended it.
        `rc`: the code its completion function was given, where the call
        may not count as ended yet (its other figures are set before)."""
        if rc == OK:
            if not self.done or self.c.rc == OK:
                return None
            rc = self.c.rc
        return PoolFailure(rc, self.c.failed_rank, self.what, self.c.still_s, self.c.lease_s)


cdef class Pool(_Collectives):
    """One mapped segment and this rank's view of it (one per communicator).
    Create with `Pool.create(...)` on the group leader, send `locator` to
    the others, `Pool.attach(locator, ...)` there, then `unlink()` on the
    leader once every rank has attached.  The segment has no name at all
    where it can (an O_TMPFILE file on /dev/shm, which the others open
    through the leader's /proc/PID/fd): a job killed at any moment leaves
    nothing behind.  Where a rank cannot reach it so (another pid
    namespace, no /proc), `publish` gives it a name for the others to open
    by, and `unlink` removes it once all have.

    The blocking collectives (barrier, bcast, reduce, ...) run in the
    calling thread; `post_<family>` makes the nonblocking form of each (an
    Op), which `Op.submit` hands to the pool's worker.
    """
    cdef cxl_worker *worker

    def __dealloc__(self):
        self._stop()

    def close(self):
        self._stop()
        _Collectives.close(self)

    def detach(self):
        self._stop()
        _Collectives.detach(self)

    cdef _stop(self):
        """End the worker: calls queued are ended with ERR_CLOSED, a call
        running ends at its next wait (st.quit); then its thread is
        joined (the pool is not unmapped under it)."""
        cdef cxl_worker *w = self.worker
        if w == NULL:
            return
        if self.pid != this_pid:
            self.worker = NULL
            return   # (a child made by fork(): the thread is the parent's)
        with nogil:
            pthread_mutex_lock(&w.mu)
            w.stopping = 1
            if w.head != NULL:
                self.st.quit = 1
            pthread_cond_broadcast(&w.work)
            pthread_mutex_unlock(&w.mu)
            pthread_join(w.thread, NULL)
        self.worker = NULL
        with nogil:
            pthread_cond_destroy(&w.work)
            pthread_cond_destroy(&w.ended)
            pthread_mutex_destroy(&w.mu)
        free(w)
        self.st.quit = 0

    cdef _start(self):
        """Start the worker (its thread blocks every signal: they are the
        main thread's)."""
        cdef cxl_worker *w = <cxl_worker *>calloc(1, sizeof(cxl_worker))
        if w == NULL:
            raise MemoryError()
        cdef sigset_t every, old
        w.st = &self.st
        pthread_mutex_init(&w.mu, NULL)
        pthread_cond_init(&w.work, NULL)
        pthread_cond_init(&w.ended, NULL)
        sigfillset(&every)
        pthread_sigmask(SIG_SETMASK, &every, &old)
        cdef int rc = pthread_create(&w.thread, NULL, worker_main, w)
        pthread_sigmask(SIG_SETMASK, &old, NULL)
        if rc != 0:
            pthread_cond_destroy(&w.work)
            pthread_cond_destroy(&w.ended)
            pthread_mutex_destroy(&w.mu)
            free(w)
            raise OSError(rc, "cxlmpi: cannot start the pool's worker thread")
        self.worker = w

    cdef cxl_worker *_live_worker(self):
        """The worker, or NULL (none; or a child made by fork())."""
        return self.worker if self.pid == this_pid else NULL

    def failure(self):
        """The PoolFailure of a posted call that failed where the ranks are
        out of step (a timeout, a peer gone; the pool must be closed before
        anything else runs on it), or None."""
        cdef cxl_worker *w = self._live_worker()
        if w == NULL or w.broken_rc == OK:
            return None
        return PoolFailure(w.broken_rc, w.broken_rank, "a nonblocking call")

    cdef _admit(self):
        self._check()
        if self.worker == NULL:
            self._start()

    cdef _submit(self, Op o):
        self._admit()
        cdef cxl_worker *w = self.worker
        cdef cxl_op *c = o.c
        c.state = QUEUED
        c.next = NULL
        # (the GIL held throughout: no other thread can stop the worker and
        # free `w` between the unlock and the wake-up.  The wake-up after
        # the unlock: a worker woken while the lock is still held may run
        # at once, only to sleep on the lock -- two switches for nothing)
        pthread_mutex_lock(&w.mu)
        if w.tail == NULL:
            w.head = c
            w.head_s = cxl_now_s()
        else:
            w.tail.next = c
        w.tail = c
        pthread_mutex_unlock(&w.mu)
        pthread_cond_broadcast(&w.work)

    cdef bint _ended(self, cxl_op *c):
        cdef cxl_worker *w = self._live_worker()
        if w == NULL:
            return True   # (stopped: every call it had has ended)
        pthread_mutex_lock(&w.mu)
        cdef bint ended = c.state == DONE
        pthread_mutex_unlock(&w.mu)
        return ended

    cdef _wait(self, cxl_op *c):
        cdef cxl_worker *w = self._live_worker()
        if w == NULL:
            return
        with nogil:
            pthread_mutex_lock(&w.mu)
            while c.state != DONE:
                claim_or_wait(w)
            pthread_mutex_unlock(&w.mu)

    def drain(self):
        """Wait until the worker has ended every call posted so far (before
        this rank runs anything else on the pool itself)."""
        cdef cxl_worker *w = self._live_worker()
        if w == NULL:
            return
        with nogil:
            pthread_mutex_lock(&w.mu)
            while w.head != NULL:
                claim_or_wait(w)
            pthread_mutex_unlock(&w.mu)

    @property
    def ready(self):
        """Whether calls can be posted: the data halves are reserved
        (else `prepare()` first, collective) and the pool is not short."""
        return not self.lazy_nbytes and not self.short

    @property
    def posted(self):
        """Whether calls posted to the worker have not ended yet."""
        cdef cxl_worker *w = self._live_worker()
        if w == NULL:
            return False
        pthread_mutex_lock(&w.mu)
        cdef bint busy = w.head != NULL
        pthread_mutex_unlock(&w.mu)
        return busy

    cdef Op _op(self, int family, str what, int root, int op, int tcode, uint64_t nbytes,
                uint64_t pairs, int flags):
        """A new Op of `family` signed as `what` (see sign_call)."""
        self._check()
        if self.lazy_nbytes or self.short:
            raise ValueError(f"{what}: the pool's data halves are not ready (prepare())")
        cdef Op o = Op.__new__(Op)
        o.pool = self
        o.what = what
        o.c.family = family
        o.c.kind = kind_code(what)
        o.c.root, o.c.op, o.c.tcode, o.c.flags = root, op, tcode, flags
        o.c.sig_nbytes, o.c.pairs = nbytes, pairs
        return o

    def post_bcast(self, uintptr_t address, size_t nbytes, int root, int flags=0,
                   str what="Ibcast"):
        """Pool.bcast, posted."""
        cdef Op o = self._op(F_BCAST, what, root, -1, -1, nbytes, 0, flags)
        o.c.a, o.c.n = <char *>address, nbytes
        return o

    def post_reduce(self, uintptr_t sendaddr, uintptr_t recvaddr, size_t count,
                    size_t itemsize, int op, int tcode, int root, int flags=0, str what=""):
        """Pool.reduce, posted."""
        what = what or ("Iallreduce" if root < 0 else "Ireduce")
        cdef Op o = self._op(F_REDUCE, what, root, op, tcode, count * itemsize, 0, flags)
        o.c.a, o.c.b = <char *>sendaddr, <char *>recvaddr
        o.c.count, o.c.itemsize, o.c.fn = count, itemsize, reducer(op, tcode)
        return o

    def post_scan(self, uintptr_t sendaddr, uintptr_t recvaddr, size_t count,
                  size_t itemsize, int op, int tcode, bint exclusive, int flags=0):
        """Pool.scan, posted."""
        what = "Iexscan" if exclusive else "Iscan"
        cdef Op o = self._op(F_SCAN, what, -1, op, tcode, count * itemsize, 0, flags)
        o.c.a, o.c.b = <char *>sendaddr, <char *>recvaddr
        o.c.count, o.c.itemsize, o.c.fn = count, itemsize, reducer(op, tcode)
        o.c.option = exclusive
        return o

    def post_gather(self, uintptr_t sendaddr, size_t send_nbytes, recv_addrs, recv_nbytes,
                    int root, size_t max_nbytes, str what, uint64_t pairs=0,
                    size_t largest=0, int flags=0):
        """Pool.gather, posted; `max_nbytes` MAX_VARIES: unknown to the
        ranks, this rank's largest block `largest` (see largest_block)."""
        cdef Op o = self._op(F_GATHER, what, root, -1, -1, max_nbytes, pairs, flags)
        cdef _Arrays recv = _Arrays(recv_addrs, recv_nbytes)
        o.keep = recv
        o.c.a, o.c.n, o.c.max_nbytes = <char *>sendaddr, send_nbytes, max_nbytes
        o.c.addrs, o.c.sizes, o.c.count = recv.addr, recv.nbytes, largest
        return o

    def post_exchange(self, send_addrs, send_nbytes, recv_addrs, recv_nbytes,
                      size_t max_nbytes, str what, int root=-1, uint64_t pairs=0,
                      size_t largest=0, int flags=0):
        """Pool.exchange, posted (`max_nbytes`, `largest`: as post_gather)."""
        cdef Op o = self._op(F_EXCHANGE, what, root, -1, -1, max_nbytes, pairs, flags)
        cdef _Arrays send = _Arrays(send_addrs, send_nbytes)
        cdef _Arrays recv = _Arrays(recv_addrs, recv_nbytes)
        o.keep = (send, recv)
        o.c.addrs, o.c.sizes, o.c.addrs2, o.c.sizes2 = send.addr, send.nbytes, recv.addr, \
            recv.nbytes
        o.c.max_nbytes, o.c.count = max_nbytes, largest
        return o

    def post_reduce_scatter(self, send_addrs, counts, uintptr_t recvaddr, size_t itemsize,
                            int op, int tcode, bint inplace, str what, int flags=0):
        """Pool.reduce_scatter, posted."""
        cdef _Arrays send = _Arrays(send_addrs, counts)   # nbytes: the counts
        cdef Op o = self._op(
            F_REDUCE_SCATTER, what, -1, op, tcode,
            (counts_hash(send.nbytes, self.st.size) ^ itemsize) & ((1 << 56) - 1), 0, flags)
        o.keep = send
        o.c.addrs, o.c.sizes, o.c.b = send.addr, send.nbytes, <char *>recvaddr
        o.c.itemsize, o.c.fn, o.c.option = itemsize, reducer(op, tcode), inplace
        return o

# The Pool: a segment (pool/segment.pxi) with its arenas (pool/arenas.pxi),
# and one entry per collective that marshals its arguments, signs the call
# and runs its family's run_<family> without the GIL; the tunables, the
# progress hooks, signatures and what a test inspects.
# (part of cxlmpi._pool: included by pyx/_pool.pyx)


cdef inline void sign_call(state_t *st, uint64_t kind, int root, int op, int tcode,
                           uint64_t nbytes, uint64_t pairs, int flags) noexcept nogil:
    """Count the call about to start and set its signature (Pool._expect;
    the worker's calls: pool/worker.pxi)."""
    st.still_s = st.lease_s = 0
    st.passed_from = st.pool_ops + 1
    st.ops += 1
    st.pool_ops = st.ops
    st.stream = flags & V_STREAM
    st.took_zc = 0
    nbytes ^= (<uint64_t>flags & 0xFF) << 56
    st.sig[0] = ((kind << 48)
                 | (st.ops & 0xFFFF) << 32
                 | (<uint64_t>(op + 1) & 0xFF) << 24
                 | (<uint64_t>(tcode + 1) & 0xFF) << 16
                 | (<uint64_t>(root + 1) & 0xFFFF))
    st.sig[1] = nbytes
    st.sig[2] = pairs
    st.sig_pending = 1


cdef class _Collectives(_Arenas):
    """The blocking collectives of a Pool (pool/worker.pxi adds the
    nonblocking ones): the base of Pool, which see."""

    def tune(self, size_t chunk_nbytes, size_t rsag_min_nbytes, size_t zerocopy_min_nbytes):
        """Set the tunables, alike on every rank: the bytes a rank publishes
        per step (CXLMPI_CHUNK_SIZE; at most a half is used), the smallest
        reduction that runs reduce-scatter + allgather
        (CXLMPI_RSAG_THRESHOLD), the smallest collective that first asks
        where the buffers live (CXLMPI_ZEROCOPY_THRESHOLD).  cxlmpi.pools.group
        tunes every pool it makes from the configuration, their one source;
        an untuned pool (zeros) still runs every collective correctly, one
        element a step."""
        self.st.chunk_nbytes = chunk_nbytes
        self.st.rsag_min_nbytes = rsag_min_nbytes
        self.st.zerocopy_min_nbytes = zerocopy_min_nbytes

    @property
    def chunk_nbytes(self):
        return self.st.chunk_nbytes

    @property
    def rsag_min_nbytes(self):
        return self.st.rsag_min_nbytes

    @property
    def zerocopy_min_nbytes(self):
        return self.st.zerocopy_min_nbytes

    property rsag_min_ranks:
        def __get__(self):
            return self.st.rsag_min_ranks

        def __set__(self, int value):
            self.st.rsag_min_ranks = value

    @property
    def rank(self):
        return self.st.rank

    @property
    def size(self):
        return self.st.size

    @property
    def step(self):
        return self.st.step

    @property
    def half_nbytes(self):
        return self.st.half_nbytes

    @property
    def total_nbytes(self):
        return self.nbytes

    property timeout_s:
        def __get__(self):
            return self.st.timeout_s

        def __set__(self, double value):
            self.st.timeout_s = value

    property spin:
        def __get__(self):
            return bool(self.st.spin)

        def __set__(self, bint value):
            self.st.spin = value

    property software_coherence:
        def __get__(self):
            return bool(self.st.sw)

        def __set__(self, bint value):
            self.st.sw = value

    def seqs(self):
        """Every rank's published step, read from the control lines."""
        self._check()
        if self.st.sw:
            for q in range(self.st.size):
                if q != self.st.rank:
                    cxl_flush_meta(ctrl(&self.st, q), 8, 1)
        return [cxl_load_acquire(&ctrl(&self.st, q).seq) for q in range(self.st.size)]

    def missing_ranks(self):
        """Ranks that have not yet published this rank's current step."""
        return [q for q, s in enumerate(self.seqs()) if s < self.st.step]

    cdef _ready(self, str what):
        """(after a call's `_expect`: first data through a lazily reserved
        pool) `ready_halves`: the data halves reserved on every rank, or
        PoolFailure `passed` on every rank, with one warning (all go to MPI)
        -- and the pool `short` on every rank (the verdict is agreed): its
        later calls go to MPI with no step, never reserving again."""
        if not self.lazy_nbytes:
            return
        if self.short:
            raise PoolFailure(ERR_PASSED, -1, what)
        cdef bint reserved = False
        cdef int rc = ready_halves(&self.st, self.fd, self.file_offset, self.lazy_nbytes,
                                   &reserved)
        if rc != OK:
            self._raise(rc, what)
        if not reserved:
            self.short = True
            free_nbytes, where = free_space(self.fd)
            warn_no_space(READY_WHAT.decode(), self.lazy_nbytes, free_nbytes, where)
            raise PoolFailure(ERR_PASSED, -1, what)
        with nogil:
            prefault(self.st.base, self.st.slot_offset, self.st.slot_offset + self.lazy_nbytes)
        self.lazy_nbytes = 0

    def prepare(self, str what="call"):
        """Collective, before a call that cannot go to MPI half way (the
        object collectives, once their header step sent every rank here):
        `_ready` in a call of its own; False on every rank where the data
        halves cannot be had (the call goes to MPI)."""
        if not self.lazy_nbytes:
            return True
        self._check()
        self._expect(what + " ready", -1, -1, -1, 0, 0)
        try:
            self._ready(what)
        except PoolFailure as exc:
            if not exc.passed:
                raise
            return False
        return True

    cdef _raise(self, int rc, str what):
        raise PoolFailure(rc, self.st.failed_rank, what, self.st.still_s, self.st.lease_s)

    cdef _done(self, int rc, str what):
        """Raise unless the call `what` ended OK with its memory still this
        job's (pool/liveness.pxi)."""
        if rc == OK and revoked(&self.st):
            self.st.failed_rank, rc = self.st.rank, ERR_REVOKED
        if rc != OK:
            self._raise(rc, what)

    cdef _expect(self, str what, int root, int op, int tcode, uint64_t nbytes,
                 uint64_t pairs, int flags=0):
        """The signature of the call about to start (published with its
        first step, compared by every rank: see check_signatures); the
        variant's `flags` ride in the top byte of the bytes word, so that
        ranks that picked different variants stop with a mismatch."""
        self._done(OK, what)          # (before this call writes anything)
        sign_call(&self.st, kind_code(what), root, op, tcode, nbytes, pairs, flags)

    def set_progress(self, uintptr_t iprobe, uintptr_t comm, int any_source,
                     int any_tag, bint comm_is_int):
        """Keep MPI progressing while this rank waits in the pool: `iprobe`
        is the address of MPI_Iprobe, `comm` the handle of a communicator
        nothing is ever sent to (see cxlmpi.pools.progress)."""
        self.st.progress.iprobe = <void *>iprobe
        self.st.progress.comm = <intptr_t>comm
        self.st.progress.any_source = any_source
        self.st.progress.any_tag = any_tag
        self.st.progress.comm_is_int = comm_is_int

    @property
    def progress_calls(self):
        """MPI progress calls made by this pool's waits."""
        return self.st.progress.calls

    def ops_address(self):
        """The address of this rank's call counter (pool calls and passed
        ones, numbered alike on every rank), for cxlmpi._shim's routes,
        which keep this Pool alive while they hold it."""
        return <uintptr_t>&self.st.ops

    def note_pass(self):
        """This rank sends its current call to MPI: peers that took it to
        the pool see that and follow (a mismatch, or a rank that cannot use
        the pool for this call, must not leave them waiting here)."""
        mark_passed(&self.st)

    def pass_marker(self):
        """(address of a C function, its argument): note_pass without a
        Python call, for the pass-through hot path (cxlmpi._shim), which
        keeps this Pool alive while it holds them."""
        return <uintptr_t>&mark_passed, <uintptr_t>&self.st

    def signatures(self):
        """Every rank's signature of its last call's first step, decoded:
        [(what, root, op, tcode, nbytes, variant)] (root/op/tcode -1 when
        none; `variant` the V_* flags that `_expect` keeps apart from the
        bytes)."""
        self._check()
        out = []
        cdef cxl_ctrl *line
        cdef uint64_t a, b
        for q in range(self.st.size):
            line = ctrl(&self.st, q)
            if self.st.sw:
                cxl_flush(line.sig, LINE_NBYTES, 1)
            a = line.sig[0][self.st.step & 1]
            b = line.sig[1][self.st.step & 1]
            out.append((KIND_NAMES.get(a >> 48, f"call {a >> 48:#x}"),
                        <int>(a & 0xFFFF) - 1, <int>((a >> 24) & 0xFF) - 1,
                        <int>((a >> 16) & 0xFF) - 1, b & ((<uint64_t>1 << 56) - 1), b >> 56))
        return out

    def out_of_step(self):
        """The ranks that found the ranks' calls out of step (`broken`:
        a peer's step of a call they made no step of), in rank order."""
        self._check()
        cdef cxl_ctrl *line
        out = []
        for q in range(self.st.size):
            line = ctrl(&self.st, q)
            if self.st.sw:
                cxl_flush(line.sig, LINE_NBYTES, 1)
            if cxl_load_acquire(&line.broken):
                out.append(q)
        return out

    def refused(self):
        """The ranks that refused their message of a call (`refuse`)."""
        return [q for q, _ in self.refusers()]

    def refusers(self):
        """(rank, whom it relays) of each rank that refused a message
        (`refuse`), in rank order: whom it relays is -1 where the rank
        refused its own."""
        self._check()
        cdef cxl_ctrl *line
        cdef uint64_t broken
        out = []
        for q in range(self.st.size):
            line = ctrl(&self.st, q)
            if self.st.sw:
                cxl_flush(line.sig, LINE_NBYTES, 1)
            broken = cxl_load_acquire(&line.broken)
            if broken >> 63:
                out.append((q, <int>((broken >> 48) & 0x7FFF) - 1))
        return out

    def refuse(self, int relay=-1):
        """This rank refuses its message of the call its peers run in the
        pool (a count or block outside its buffer): it takes no step of it,
        and its peers, waiting for its step, raise (as for calls out of
        step) instead of waiting out their timeout.  `relay`: the rank
        (of a communicator spanning pool groups) that refused it, where
        this rank passes on another group's refusal."""
        self._check()
        cdef cxl_ctrl *mine = ctrl(&self.st, self.st.rank)
        cdef uint64_t who = <uint64_t>((relay + 1) & 0x7FFF) << 48
        cxl_store_release(&mine.broken, ((self.st.ops + 1) & ((<uint64_t>1 << 48) - 1))
                          | who | (<uint64_t>1 << 63))
        if self.st.sw:
            cxl_flush(mine.sig, LINE_NBYTES, 0)
        else:
            wake_sleepers(&self.st)

    def barrier(self, int flags=0):
        """All ranks of the pool meet (no data)."""
        self._check()
        cdef int rc
        self._expect("Barrier", -1, -1, -1, 0, 0)
        with nogil:
            rc = run_barrier(&self.st)
        self._done(rc, "Barrier")

    def bcast(self, uintptr_t address, size_t nbytes, int root, int flags=0):
        """Broadcast `nbytes` at `address` (this rank's buffer) from `root`,
        with the variant `flags` (V_*); True when it ran zero-copy (every
        rank alike)."""
        self._check()
        cdef int rc
        self._expect("Bcast", root, -1, -1, nbytes, 0, flags)
        self._ready("Bcast")
        with nogil:
            rc = run_bcast(&self.st, <char *>address, nbytes, root, flags)
        self._done(rc, "Bcast")
        return self.st.took_zc != 0

    def reduce(self, uintptr_t sendaddr, uintptr_t recvaddr, size_t count,
               size_t itemsize, int op, int tcode, int root, int flags=0):
        """Reduce `count` elements to `root` (every rank when root < 0).
        `sendaddr` may equal `recvaddr` (in place); `recvaddr` is ignored on
        non-root ranks of a rooted reduce.  `flags`: the variant (V_*);
        True when it ran zero-copy (every rank alike)."""
        self._check()
        cdef cxl_reduce_fn fn = reducer(op, tcode)
        cdef int rc
        what = "Allreduce" if root < 0 else "Reduce"
        self._expect(what, root, op, tcode, count * itemsize, 0, flags)
        self._ready(what)
        with nogil:
            rc = run_reduce(&self.st, <const char *>sendaddr, <char *>recvaddr, count,
                            itemsize, fn, root, flags)
        self._done(rc, what)
        return self.st.took_zc != 0

    def agree(self, uint64_t value, str what="header step", int root=-1,
              uint64_t pairs=0):
        """A header step of collective `what`: every rank publishes `value`;
        returns the maximum, or 0 when any rank published 0 ("not through
        the pool").  `pairs`: this rank's share of the block checksum
        (pair_hash), checked when no rank published 0."""
        return self.header(value, what, root, pairs)[0]

    def header(self, uint64_t value, str what="header step", int root=-1,
               uint64_t pairs=0, uint64_t report=0, uint64_t extra=0,
               uint64_t extra2=0):
        """`agree`, carrying a report of cxlmpi.select: `report` (its id,
        the same on every rank, or a mismatch) and `extra`, `extra2` (this
        rank's figures); returns (agreed value, the largest `extra`, the
        largest `extra2`)."""
        self._check()
        cdef uint64_t agreed = 0
        cdef uint64_t most[2]
        cdef uint64_t mine[2]
        mine[0], mine[1] = extra, extra2
        most[0] = most[1] = 0
        cdef int rc
        self._expect(what + " header", root, -1, -1, report, 0)
        with nogil:
            rc = agree_max(&self.st, value, pairs, mine, &agreed, most)
        self._done(rc, what)
        return agreed, most[0], most[1]

    def gather(self, uintptr_t sendaddr, size_t send_nbytes, recv_addrs,
               recv_nbytes, int root, size_t max_nbytes, str what, uint64_t pairs=0,
               int flags=0):
        """Allgather(v) (root < 0) and Gather(v).  `recv_addrs`/`recv_nbytes`:
        where each rank's block goes (ignored off the root of a Gather);
        `max_nbytes`: the largest block of any rank (the same everywhere);
        `pairs`: this rank's share of the block checksum (pair_hash);
        `flags`: the variant (V_*).  True when it ran zero-copy."""
        self._check()
        self._expect(what, root, -1, -1, max_nbytes, pairs, flags)
        self._ready(what)
        cdef _Arrays recv = _Arrays(recv_addrs, recv_nbytes)
        cdef int rc
        with nogil:
            rc = run_gather(&self.st, <const char *>sendaddr, send_nbytes, recv.addr,
                            recv.nbytes, root, max_nbytes, flags)
        self._done(rc, what)
        return self.st.took_zc != 0

    def exchange(self, send_addrs, send_nbytes, recv_addrs, recv_nbytes,
                 size_t max_nbytes, str what, int root=-1, uint64_t pairs=0,
                 int flags=0):
        """Alltoall(v) and Scatter(v) (from `root`): `send_*[d]` goes to
        rank d, `recv_*[q]` comes from rank q; `max_nbytes`: the largest
        block between any two ranks (the same everywhere); `pairs`: this
        rank's share of the block checksum (pair_hash); `flags`: the
        variant (V_*).  True when it ran zero-copy."""
        self._check()
        self._expect(what, root, -1, -1, max_nbytes, pairs, flags)
        self._ready(what)
        cdef _Arrays send = _Arrays(send_addrs, send_nbytes)
        cdef _Arrays recv = _Arrays(recv_addrs, recv_nbytes)
        cdef int rc
        with nogil:
            rc = run_exchange(&self.st, <const char **>send.addr, send.nbytes, recv.addr,
                              recv.nbytes, max_nbytes, flags)
        self._done(rc, what)
        return self.st.took_zc != 0

    def reduce_scatter(self, send_addrs, counts, uintptr_t recvaddr,
                       size_t itemsize, int op, int tcode, bint inplace, str what,
                       int flags=0):
        """Reduce_scatter(_block): `send_addrs[d]` is where this rank's piece
        for rank d starts, `counts[d]` its elements (the same on every rank);
        `inplace`: the pieces are in the receive buffer, whose start gets the
        result; `flags`: the variant (V_*).  True when it ran zero-copy."""
        self._check()
        cdef cxl_reduce_fn fn = reducer(op, tcode)
        cdef _Arrays send = _Arrays(send_addrs, counts)   # nbytes: the counts
        # every rank passes the same counts: their hash must agree
        self._expect(what, -1, op, tcode,
                     (counts_hash(send.nbytes, self.st.size) ^ itemsize) & ((1 << 56) - 1),
                     0, flags)
        self._ready(what)
        cdef int rc
        with nogil:
            rc = run_reduce_scatter(&self.st, <const char **>send.addr, send.nbytes,
                                    <char *>recvaddr, itemsize, fn, inplace, flags)
        self._done(rc, what)
        return self.st.took_zc != 0

    def scan(self, uintptr_t sendaddr, uintptr_t recvaddr, size_t count,
             size_t itemsize, int op, int tcode, bint exclusive, int flags=0):
        """Scan (inclusive) or Exscan of `count` elements: rank r folds the
        contributions of ranks 0 .. r (0 .. r-1); `flags`: the variant."""
        self._check()
        cdef cxl_reduce_fn fn = reducer(op, tcode)
        cdef int rc
        what = "Exscan" if exclusive else "Scan"
        self._expect(what, -1, op, tcode, count * itemsize, 0, flags)
        self._ready(what)
        with nogil:
            rc = run_scan(&self.st, <const char *>sendaddr, <char *>recvaddr, count,
                          itemsize, fn, exclusive, flags)
        self._done(rc, what)


cdef class _Arrays:
    """p addresses and p sizes as C arrays, from Python sequences."""
    cdef char **addr
    cdef size_t *nbytes
    cdef int n

    def __cinit__(self, addrs, sizes):
        self.n = len(addrs)
        self.addr = <char **>malloc(max(self.n, 1) * sizeof(char *))
        self.nbytes = <size_t *>malloc(max(self.n, 1) * sizeof(size_t))
        if self.addr == NULL or self.nbytes == NULL:
            raise MemoryError()
        for i in range(self.n):
            self.addr[i] = <char *><uintptr_t>addrs[i]
            self.nbytes[i] = sizes[i]

    def __dealloc__(self):
        free(self.addr)
        free(self.nbytes)

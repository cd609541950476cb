# Pool-resident memory: this rank's arena (allocate, give back), the node
# heap a pool without arenas shares, where an address lies in the heap, and
# the PoolBuffer that exports a block through the buffer protocol.
# (part of cxlmpi._pool: included by pyx/_pool.pyx)


from cxl_alloc cimport (CXL_ALLOC_FULL, CXL_ALLOC_NOSPACE, CXL_ALLOC_OK, CXL_ALLOC_REVOKED,
                        cxl_arena_alloc, cxl_arena_free, cxl_arena_free_bytes)


class PoolRevoked(PoolError):
    """The pool's memory was handed to another job (Pool.allocate)."""


REVOKED_HEAP = (
    "cxlmpi: the memory of this rank's pool-resident arrays was handed to another "
    "job: this process stood still (stopped, paused, in a debugger) for longer than "
    "its lease, CXLMPI_LEASE_BEATS x CXLMPI_HEARTBEAT, and a job on another host "
    "took it; the arrays it holds are that job's data now.  Raise "
    "CXLMPI_LEASE_BEATS above the longest pause")


cdef class _Arenas(_Segment):
    """The pool-resident memory of a segment: the base of Pool, which see."""

    def allocate(self, size_t nbytes, bint reserve=True):
        """A PoolBuffer of `nbytes` in this rank's arena (first fit, 64-byte
        aligned; 4 KiB for 64 KiB and more), its memory reserved in the
        backing file unless `reserve` is False.  MemoryError when the arena
        is full; PoolNoSpace (a MemoryError) when /dev/shm or the pool file
        cannot hold it; PoolRevoked when the arena's memory was handed to
        another job; ValueError when closed or in a forked child."""
        self._check()
        cdef size_t off = 0
        cdef int rc
        with nogil:   # a C allocator: no Python (no collection) inside
            rc = cxl_arena_alloc(&self.arena, nbytes, reserve, &off)
        if rc == CXL_ALLOC_OK:
            try:
                return PoolBuffer._new(self, off, nbytes, True, False)
            except BaseException:
                cxl_arena_free(&self.arena, off)
                raise
        if rc == CXL_ALLOC_REVOKED:
            raise PoolRevoked(REVOKED_HEAP)
        if rc == CXL_ALLOC_NOSPACE:
            raise PoolNoSpace(f"cxlmpi: {NO_SPACE} for {nbytes} bytes of pool-resident "
                              f"arrays (/dev/shm or the pool file is full)")
        if rc != CXL_ALLOC_FULL:
            self._check()
            raise ValueError("pool is closed")
        raise MemoryError(
            f"cxlmpi: no room for {nbytes} bytes among this rank's pool-resident "
            f"arrays ({self.arena.nbytes} bytes, {self.arena_free()} free); raise "
            f"CXLMPI_ARENA_SIZE")

    def share_heap(self, _Arenas heap):
        """From now on this pool's zero-copy paths read and write arrays of
        `heap`'s arenas (a node heap every rank of this pool has mapped at
        some address of its own: offsets are from its start, the same in
        every process); this pool, made without arenas, keeps `heap` mapped
        until it is closed."""
        if self.arena_nbytes() or heap.closed or heap.heap_pool is not None:
            raise ValueError("share_heap: a pool without arenas, a heap with them")
        self.st.heap = heap.st.base
        self.st.heap_token = heap.st.token
        self.st.heap_token_at = &(<cxl_header *>heap.st.base).token
        self.st.heap_lo = heap.st.heap_lo
        self.st.heap_hi = heap.st.heap_hi
        heap.live += 1
        self.heap_pool = heap

    @property
    def heap(self):
        """The pool whose arenas hold the arrays this pool uses in place:
        the node heap it shares, or itself."""
        return self if self.heap_pool is None else self.heap_pool

    cdef _give_back(self, size_t off):
        """Return a block to the arena (a no-op in a forked child)."""
        cxl_arena_free(&self.arena, off)

    def arena_address(self):
        """The address of this rank's arena allocator (cxl_alloc.h), for
        the NumPy hook (cxlmpi._alloc), which shares it: `keep` the pool
        first."""
        return <uintptr_t>&self.arena

    def keep(self):
        """Keep this pool's mapping, and its arena allocator, for as long as
        the process lives (the NumPy hook hands out its memory)."""
        self.live += 1

    def arena_free(self):
        """Free bytes in this rank's arena."""
        return cxl_arena_free_bytes(&self.arena)

    def arena_nbytes(self):
        """Bytes of each rank's arena (0: no pool-resident arrays)."""
        if self.st.base == NULL:
            return 0
        return (<cxl_header *>self.st.base).arena_nbytes

    def arena_span(self):
        """(first, last + 1) address of the arenas of its heap (its own or
        the node heap it shares), (0, 0) when it has none (for
        cxlmpi._shim's residency hint)."""
        if self.st.base == NULL or self.st.heap_lo >= self.st.heap_hi:
            return 0, 0
        return (<uintptr_t>self.st.heap + self.st.heap_lo,
                <uintptr_t>self.st.heap + self.st.heap_hi)

    def offset_of(self, uintptr_t address, size_t nbytes):
        """Offset in its heap of [address, address + nbytes) when it lies in
        the heap's arenas (any rank's), else -1."""
        cdef uint64_t at = resident(&self.st, <const char *>address, nbytes)
        return <int64_t>at - 1

    def view(self, size_t offset, size_t nbytes):
        """A read-only PoolBuffer on `nbytes` at `offset` of the arenas (a
        peer's array: Bcast_view); it keeps the mapping alive."""
        if self.heap_pool is not None:
            return self.heap_pool.view(offset, nbytes)
        self._check()
        if offset < self.st.heap_lo or offset + nbytes > self.st.heap_hi \
                or offset + nbytes < offset:
            raise ValueError(f"offset {offset} + {nbytes} bytes is outside the arenas")
        return PoolBuffer._new(self, offset, nbytes, False, True)


cdef char *BYTE_FORMAT = "B"


@cython.no_gc_clear   # a collected cycle holding it must still give its block back
cdef class PoolBuffer:
    """Memory in a pool's arenas, exported through the buffer protocol (what
    cxlmpi.empty wraps in a numpy array).  An allocation of this rank's
    arena goes back to it when the PoolBuffer is collected; every
    PoolBuffer keeps the pool mapped, even after its communicator is freed."""
    cdef _Arenas pool
    cdef readonly size_t offset
    cdef readonly size_t nbytes
    cdef bint owns_block          # an allocation of this rank's arena (not a view)
    cdef readonly bint readonly
    cdef Py_ssize_t shape[1]
    cdef Py_ssize_t strides[1]

    @staticmethod
    cdef PoolBuffer _new(_Arenas pool, size_t offset, size_t nbytes, bint owns_block,
                         bint readonly):
        cdef PoolBuffer b = PoolBuffer.__new__(PoolBuffer)
        b.pool = pool
        b.offset = offset
        b.nbytes = nbytes
        b.owns_block = owns_block
        b.readonly = readonly
        pool.live += 1
        return b

    @property
    def address(self):
        return <uintptr_t>(self.pool.st.base + self.offset)

    def __getbuffer__(self, Py_buffer *view, int flags):
        if self.readonly and (flags & PyBUF_WRITABLE):
            raise BufferError("a read-only view of another rank's pool array "
                              "(Bcast_view) cannot be written")
        self.shape[0] = self.nbytes
        self.strides[0] = 1
        view.buf = self.pool.st.base + self.offset
        view.obj = self
        view.len = self.nbytes
        view.readonly = self.readonly
        view.itemsize = 1
        view.format = BYTE_FORMAT if (flags & PyBUF_FORMAT) else NULL
        view.ndim = 1
        view.shape = self.shape
        view.strides = self.strides
        view.suboffsets = NULL
        view.internal = NULL

    def __releasebuffer__(self, Py_buffer *view):
        pass

    def __dealloc__(self):
        if self.pool is None:
            return
        if self.owns_block:
            self.pool._give_back(self.offset)
        self.pool._let_go()

# The Pool: one mapped segment and this rank's view of it (creation, attach,
# partitions, arenas, close), the collective entry points, pool-resident
# buffers.
# (part of cxlmpi._pool: included by pyx/_pool.pyx)


class PoolError(OSError):
    """A segment could not be created, opened or mapped."""


# Where POSIX shared memory lives (glibc's shm_open), and the start of the
# error of a rank that cannot open an unnamed segment (see Pool.attach).
SHM_DIR = "/dev/shm"

cdef extern from "<fcntl.h>" nogil:
    int AT_FDCWD
    int AT_SYMLINK_FOLLOW
    int linkat(int olddirfd, const char *oldpath, int newdirfd, const char *newpath,
               int flags)
UNREACHABLE = "cannot open the unnamed segment"


from cxl_alloc cimport (CXL_ALLOC_FULL, CXL_ALLOC_NOSPACE, CXL_ALLOC_OK, cxl_arena,
                        cxl_arena_alloc, cxl_arena_destroy, cxl_arena_free,
                        cxl_arena_free_bytes, cxl_arena_init, cxl_notice_fn)


cdef extern from "<pthread.h>" nogil:
    int pthread_atfork(void (*prepare)() noexcept nogil, void (*parent)() noexcept nogil,
                       void (*child)() noexcept nogil)


# The process this module runs in: a child made by fork() gets its own pid
# here, and leaves every pool it inherited alone (see Pool.inherited).
cdef int64_t this_pid = getpid()


cdef void after_fork_in_child() noexcept nogil:
    global this_pid, start_ticks
    this_pid = getpid()
    start_ticks = 0     # the parent's: this process started later


pthread_atfork(NULL, NULL, after_fork_in_child)


cdef class Pool:
    """One mapped segment and this rank's view of it (one per communicator).

    Create with `Pool.create(...)` on the group leader, send `locator` to
    the others, `Pool.attach(locator, ...)` there, then `unlink()` on the
    leader once every rank has attached.  The segment has no name at all
    where it can (an O_TMPFILE file on /dev/shm, which the others open
    through the leader's /proc/PID/fd): a job killed at any moment leaves
    nothing behind.  Where a rank cannot reach it so (another pid
    namespace, no /proc), `publish` gives it a name for the others to open
    by, and `unlink` removes it once all have.
    """
    cdef state_t st
    cdef size_t nbytes
    cdef readonly str name
    cdef readonly bint unlinked
    cdef readonly object locator   # what the others open: the name, or (path, name, inode)
    cdef public object release   # called once after close (frees a partition)
    cdef public int hosts        # hosts its ranks run on, as MPI sees them
    cdef cxl_arena arena         # this rank's arena (cxl_alloc.h: no Python inside)
    cdef size_t live             # PoolBuffers alive (they keep the mapping)
    cdef bint closing
    cdef bint detached           # exiting: line cleared, partition given back
    cdef readonly int fd         # the backing file, for reserving memory
    cdef readonly size_t file_offset  # where the mapping starts in it
    cdef int64_t pid             # the process that mapped the pool
    cdef readonly bint wipes     # a partition: memory handed out is zeroed first
    cdef readonly bint emulated  # seen through cxl_emulate.h (CXLMPI_COHERENCE=emulate)
    cdef Pool heap_pool          # the node heap this pool shares (None: its own arenas)
    cdef size_t lazy_nbytes      # data halves not reserved yet (0: they are; `_ready`)
    cdef readonly bint short     # ... and cannot be (agreed): its calls go to MPI

    def __cinit__(self):
        self.st.base = NULL
        self.nbytes = 0
        self.hosts = 1
        self.unlinked = True
        self.live = 0
        self.closing = False
        self.detached = False
        self.fd = self.st.lock_fd = -1
        self.file_offset = 0
        self.pid = this_pid
        self.emulated = False
        memset(&self.arena, 0, sizeof(cxl_arena))
        self.st.srcs = NULL

    def __dealloc__(self):
        self._unmap()
        cxl_arena_destroy(&self.arena)
        free(self.st.srcs)

    cdef _unmap(self):
        """Let go of the segment.  Only the process that mapped it clears its
        control line and removes the name; a forked child, and a process
        detached at exit (arrays may still be used), keep the mapping until
        they exit and touch nothing shared."""
        cdef char *shared
        cdef bint mine = self.pid == this_pid
        self.locator = None
        if self.st.base != NULL:
            if mine and not self.detached and self.st.size > 0:
                leave_line(&self.st)  # this rank is gone
            if mine and not self.detached:
                shared = cxl_emu_detach(self.st.base) if self.emulated else NULL
                munmap(self.st.base if shared == NULL else shared, self.nbytes)
            self.st.base = NULL
        if self.fd >= 0:
            if mine:
                let_go_line(&self.st)
            close(self.fd)
            self.fd = -1
        if not self.unlinked:
            if mine:
                shm_unlink(self.name.encode())
            self.unlinked = True

    @staticmethod
    def layout(int nranks, size_t pool_nbytes):
        """(slot_offset, half_nbytes) for a pool of `pool_nbytes` bytes."""
        cdef size_t slot_offset = HEADER_NBYTES + nranks * CTRL_NBYTES
        slot_offset = (slot_offset + PAGE_NBYTES - 1) // PAGE_NBYTES * PAGE_NBYTES
        if pool_nbytes <= slot_offset:
            return slot_offset, 0
        cdef size_t half = (pool_nbytes - slot_offset) // (2 * nranks)
        return slot_offset, half // PAGE_NBYTES * PAGE_NBYTES

    @staticmethod
    def halves_nbytes(int nranks, size_t pool_nbytes):
        """Bytes of the data halves of every rank of a pool."""
        slot_offset, half = Pool.layout(nranks, pool_nbytes)
        return 2 * nranks * half

    @staticmethod
    def mapping_nbytes(int nranks, size_t pool_nbytes, size_t arena_nbytes):
        """Bytes of a pool with `arena_nbytes` of pool-resident arrays per
        rank (the arenas start 2 MiB-aligned after the slots)."""
        if arena_nbytes == 0:
            return pool_nbytes
        return arena_start(pool_nbytes) + <size_t>nranks * arena_nbytes

    @staticmethod
    def create(int rank, int nranks, size_t pool_nbytes, str prefix="cxlmpi",
               int numa_node=-1, size_t arena_nbytes=0, bint emulate=False,
               bint unnamed=True, bint lazy=False):
        """Create, size and map a new POSIX shared-memory segment, mode
        0600: without a name (`unnamed`, where /dev/shm takes O_TMPFILE),
        else under an unguessable one (O_EXCL); returns the Pool of the
        creating rank.  With `numa_node` >= 0 the segment's pages are bound
        to that NUMA node (the policy is stored with the shared object, so
        every rank's page faults follow it).  `emulate`: this process sees
        the segment through caches without coherence (cxl_emulate.h).
        `lazy` (not with `emulate`; `attach` with the same): the data
        halves are reserved on the pool's first call that moves data."""
        check_layout(nranks, pool_nbytes)
        cdef size_t total = Pool.mapping_nbytes(nranks, pool_nbytes, arena_nbytes)
        name = f"/{prefix}-{os.getuid()}-{os.getpid()}-{secrets.token_hex(12)}"
        cdef bytes bname = name.encode()
        cdef int fd = -1
        cdef struct_stat sb
        if unnamed:
            try:
                fd = os.open(SHM_DIR, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
            except OSError:
                fd = -1   # (a kernel or file system without O_TMPFILE: named)
        cdef Pool pool = Pool.__new__(Pool)
        pool.name = name
        if fd >= 0:
            if fstat(fd, &sb) != 0:
                close(fd)
                raise PoolError(errno, f"fstat({name}): {strerror(errno).decode()}")
            pool.locator = (f"/proc/{os.getpid()}/fd/{fd}", name, sb.st_ino)
        else:
            fd = shm_open(bname, O_RDWR | O_CREAT | O_EXCL, 0o600)
            if fd < 0:
                raise PoolError(errno, f"shm_open({name}): {strerror(errno).decode()}")
            pool.unlinked = False
            pool.locator = name
        pool.fd = fd                # kept: arena blocks are reserved through it
        try:
            if ftruncate(fd, total) != 0:
                raise PoolError(errno, f"{shortage(errno)}ftruncate({name}, {total}): "
                                       f"{strerror(errno).decode()}")
            pool._map(fd, 0, total)
            if numa_node >= 0:
                bind_node(pool.st.base, total, numa_node)  # before any page exists
            pool._reserve_segment(pool_nbytes, nranks if lazy and not emulate else 0)
            if emulate:
                pool._emulate(nranks, pool_nbytes)
        except BaseException:
            pool._unmap()
            raise
        pool._format(nranks, 0, pool_nbytes, arena_nbytes)
        pool._setup(rank)
        return pool

    @staticmethod
    def attach(object locator, int rank, int nranks, size_t pool_nbytes,
               size_t arena_nbytes=0, bint emulate=False, bint lazy=False):
        """Map an existing segment created by `create` on another rank, by
        its `locator` (`emulate`: as in `create`).  An unnamed one is
        opened through its creator's /proc/PID/fd and must be the very file
        (its inode): PoolError(UNREACHABLE ...) where it cannot be opened
        so, and the creator then `publish`es a name."""
        cdef size_t total = Pool.mapping_nbytes(nranks, pool_nbytes, arena_nbytes)
        cdef int fd
        cdef object inode = None
        if isinstance(locator, tuple):
            path, name, inode = locator
            try:
                fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            except OSError as exc:
                raise PoolError(exc.errno, f"{UNREACHABLE} {name} through {path}: "
                                           f"{exc.strerror}") from None
        else:
            name = locator
            fd = shm_open(name.encode(), O_RDWR, 0)
            if fd < 0:
                raise PoolError(errno, f"shm_open({name}): {strerror(errno).decode()}")
        cdef struct_stat sb
        cdef Pool pool = Pool.__new__(Pool)
        pool.name = name
        pool.locator = locator
        pool.fd = fd                # kept: arena blocks are reserved through it
        try:
            if fstat(fd, &sb) != 0:
                raise PoolError(errno, f"fstat({name}): {strerror(errno).decode()}")
            if inode is not None and sb.st_ino != inode:
                raise PoolError(0, f"{UNREACHABLE} {name}: {locator[0]} is another file")
            if sb.st_uid != getuid() or (sb.st_mode & (S_IRWXG | S_IRWXO)):
                raise PoolError(0, f"{name}: not a private segment of this user")
            if <size_t>sb.st_size != total:
                raise PoolError(0, f"{name}: {sb.st_size} bytes, expected {total}")
            pool._map(fd, 0, total)
            if emulate:
                pool._emulate(nranks, pool_nbytes)
        except BaseException:
            pool._unmap()
            raise
        if lazy and not emulate:
            pool.lazy_nbytes = Pool.halves_nbytes(nranks, pool_nbytes)
        pool._verify(nranks, 0, pool_nbytes, arena_nbytes)
        pool._setup(rank)
        return pool

    @staticmethod
    def map_partition(int fd, size_t offset, size_t nbytes, int rank, int nranks,
                      bint create, uint64_t token, str name, size_t arena_nbytes=0,
                      bint wipe=True, bint emulate=False):
        """Map `nbytes` of an open file or device at `offset` (a partition
        claimed through the device's partition table, see
        cxlmpi.backends).  The creating rank formats the partition, wiping
        whatever an earlier job left in its control lines; the others check
        that it carries this job's `token`.  `wipe`: memory an earlier job
        may have left data in (a device whose freed partitions are not
        hole-punched, Device.wipes): the data halves are zeroed now (in the
        shared memory itself), each pool-resident block when first
        reserved.  `emulate`: as in `create`."""
        check_layout(nranks, nbytes)
        cdef Pool pool = Pool.__new__(Pool)
        pool.name = name
        pool.fd = own_description(fd)   # arena blocks are reserved, its lock held through it
        pool.file_offset = offset
        pool._map(fd, offset, Pool.mapping_nbytes(nranks, nbytes, arena_nbytes))
        pool.wipes = wipe           # an earlier job's data may lie there
        if create:
            pool._reserve_segment(nbytes)
            if wipe:
                pool._wipe_slots(nranks, nbytes)
        if emulate:
            try:
                pool._emulate(nranks, nbytes)
            except BaseException:
                pool._unmap()
                raise
        if create:
            pool._format(nranks, token, nbytes, arena_nbytes)
        else:
            pool._verify(nranks, token, nbytes, arena_nbytes)
        pool._setup(rank)
        return pool

    cdef _map(self, int fd, size_t offset, size_t nbytes):
        cdef void *addr = mmap(NULL, nbytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                               fd, <off_t>offset)
        if addr == MAP_FAILED:
            raise PoolError(errno, f"{shortage(errno)}mmap({self.name}, {nbytes} bytes "
                                   f"at {offset}): {strerror(errno).decode()}")
        self.st.base = <char *>addr
        self.nbytes = nbytes

    cdef _emulate(self, int nranks, size_t pool_nbytes):
        """From now on this process sees the mapping through a private image
        (cxl_emulate.h): the pool proper (header, control lines, halves) is
        loaded from memory now; lines reach the other processes only when
        written back, by a flush or an eviction."""
        slot_offset = Pool.layout(nranks, pool_nbytes)[0]
        cdef char *image = cxl_emu_attach(self.st.base, self.nbytes,
                                          min(pool_nbytes, self.nbytes), slot_offset)
        if image == NULL:
            raise PoolError(errno, f"emulating {self.name}: {strerror(errno).decode()}")
        self.st.base = image
        self.emulated = True

    cdef _reserve_segment(self, size_t nbytes, int lazy_ranks=0):
        """Back the header, control lines and slots (the first `nbytes`)
        with memory now, so that no collective ever meets a SIGBUS; the
        slots only as far as header steps use them when `lazy_ranks` (the
        pool's ranks) is set (the rest: `_ready`)."""
        cdef int err
        slot_offset, half = Pool.layout(max(lazy_ranks, 1), nbytes)
        cdef size_t lo = slot_offset, each = half
        with nogil:
            if lazy_ranks:
                err = reserve_heads(self.fd, self.file_offset, lo, each, lazy_ranks)
            else:
                err = reserve_file(self.fd, self.file_offset, nbytes)
        if lazy_ranks and not err:
            self.lazy_nbytes = Pool.halves_nbytes(lazy_ranks, nbytes)
        if err:
            raise PoolError(err, f"{NO_SPACE} for the pool {self.name} ({nbytes} bytes, "
                                 f"CXLMPI_POOL_SIZE): {strerror(err).decode()}")

    cdef _wipe_slots(self, int nranks, size_t pool_nbytes):
        """Zero the data halves of a new partition (the header and control
        lines are formatted anew): nothing an earlier job wrote there stays."""
        slot_offset, half = Pool.layout(nranks, pool_nbytes)
        cdef size_t lo = slot_offset, n = 2 * <size_t>nranks * <size_t>half
        with nogil:
            memset(self.st.base + lo, 0, n)

    cdef _format(self, int nranks, uint64_t token, size_t pool_nbytes,
                 size_t arena_nbytes):
        """Write the header of a new pool: control lines zeroed first (no
        stale step of an earlier user), the magic number last."""
        slot_offset, half = Pool.layout(nranks, pool_nbytes)
        cdef size_t ctrl_end = HEADER_NBYTES + <size_t>nranks * CTRL_NBYTES
        memset(self.st.base, 0, ctrl_end)
        cdef cxl_header *h = <cxl_header *>self.st.base
        h.version = CXL_LAYOUT_VERSION
        h.nranks = nranks
        h.total_nbytes = self.nbytes
        h.slot_offset = slot_offset
        h.half_nbytes = half
        h.token = token
        h.arena_offset = arena_start(pool_nbytes) if arena_nbytes else pool_nbytes
        h.arena_nbytes = arena_nbytes
        cxl_store_release(&h.magic, CXL_MAGIC)
        cxl_flush_meta(self.st.base, ctrl_end, 0)

    cdef _verify(self, int nranks, uint64_t token, size_t pool_nbytes,
                 size_t arena_nbytes):
        cdef cxl_header *h = <cxl_header *>self.st.base
        cxl_flush_meta(h, sizeof(cxl_header), 1)
        slot_offset, half = Pool.layout(nranks, pool_nbytes)
        if (cxl_load_acquire(&h.magic) != CXL_MAGIC or h.version != CXL_LAYOUT_VERSION
                or h.arena_nbytes != arena_nbytes
                or h.nranks != <uint32_t>nranks or h.total_nbytes != self.nbytes
                or h.slot_offset != slot_offset or h.half_nbytes != half
                or h.token != token):
            self._unmap()
            raise PoolError(0, f"{self.name}: header does not match this job's pool")

    cdef _setup(self, int rank):
        cdef cxl_header *h = <cxl_header *>self.st.base
        self.st.rank = rank
        self.st.size = h.nranks
        self.st.step = 0
        self.st.half_nbytes = h.half_nbytes
        self.st.slot_offset = h.slot_offset
        self.st.sw = 0
        self.st.spin = 1
        self.st.timeout_s = 0
        self.st.res = NULL
        self.st.srcs = <const char **>malloc(max(self.st.size, 1) * sizeof(char *))
        if self.st.srcs == NULL:
            raise MemoryError()
        memset(&self.st.progress, 0, sizeof(cxl_progress))
        self.st.ops = 0
        self.st.passed_from = self.st.pool_ops = 0
        self.st.sig_pending = 0
        self.st.stream = 0
        self.st.took_zc = 0
        self.st.rsag_min_ranks = 3
        self.st.heap = self.st.base      # its own arenas, until share_heap
        self.st.heap_lo = h.arena_offset
        self.st.heap_hi = self.nbytes
        if self.lazy_nbytes:
            prefault_heads(self.st.base, h.slot_offset, h.half_nbytes, h.nranks)
        else:
            prefault(self.st.base, h.slot_offset,
                     min(h.slot_offset + 2 * <size_t>h.nranks * h.half_nbytes, self.nbytes))
        if h.arena_nbytes:
            if not self.emulated:
                advise_huge(self.st.base, h.arena_offset, self.nbytes)
            cxl_arena_init(&self.arena, self.st.base,
                           h.arena_offset + <size_t>rank * h.arena_nbytes, h.arena_nbytes,
                           self.fd, self.file_offset, cxl_no_space, ARENA_WHAT)
            self.arena.wipe = self.wipes
        cdef cxl_ctrl *line = ctrl(&self.st, rank)
        cdef int rc = setup_liveness(&self.st, self.fd, self.file_offset, h.token)
        if rc != 0:
            self._unmap()
            raise PoolError(rc, f"cannot lock a byte of {self.name}: {strerror(rc).decode()}")
        line.pid = getpid()
        line.host = host_id
        line.attached = 1
        line.beat = 0
        line.beat_period_ns = cxl_beat_period_ns
        line.start = start_ticks
        cxl_store_release(&line.seq, 0)
        cxl_flush_meta(line, CTRL_NBYTES, 0)
        rc = cxl_beat_add(&line.beat, 1, &h.token, h.token)
        if rc != 0:
            self._unmap()
            raise PoolError(rc, f"cannot start the heartbeat: {strerror(rc).decode()}")

    def tune(self, size_t chunk_nbytes, size_t rsag_min_nbytes, size_t zerocopy_min_nbytes):
        """Set the tunables, alike on every rank: the bytes a rank publishes
        per step (CXLMPI_CHUNK_SIZE; at most a half is used), the smallest
        reduction that runs reduce-scatter + allgather
        (CXLMPI_RSAG_THRESHOLD), the smallest collective that first asks
        where the buffers live (CXLMPI_ZEROCOPY_THRESHOLD).  cxlmpi.group
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

    def unlink(self):
        """Remove the segment's name; the mappings stay valid."""
        if not self.unlinked:
            shm_unlink(self.name.encode())
            self.unlinked = True

    def publish(self):
        """Give an unnamed segment its name (for ranks that cannot open it
        through /proc), to be removed by `unlink` once they have; returns
        the new locator."""
        cdef bytes path = f"/proc/self/fd/{self.fd}".encode()
        cdef bytes target = (SHM_DIR + self.name).encode()
        if isinstance(self.locator, tuple):
            # (linkat follows the /proc link to the file; Python's os.link
            # links the link itself, which fails across file systems)
            if linkat(AT_FDCWD, path, AT_FDCWD, target, AT_SYMLINK_FOLLOW) != 0:
                raise PoolError(errno, f"naming {self.name}: {strerror(errno).decode()}")
            self.unlinked = False
            self.locator = self.name
        return self.locator

    def close(self):
        """No more collectives: unmap the segment (and unlink it if this rank
        still owns the name), then give a claimed partition back - once the
        last pool-resident array of this rank is gone, too."""
        self.closing = True
        if self.live == 0:
            self._finish_close()

    cdef _finish_close(self):
        self._unmap()
        heap, self.heap_pool = self.heap_pool, None
        if heap is not None:
            heap._let_go()
        release, self.release = self.release, None
        if release is not None and self.pid == this_pid:
            release()

    def detach(self):
        """The process is exiting: no more collectives or allocations; this
        rank's control line says it is gone and a claimed partition is given
        back now, while the device is still open.  Arrays still alive keep
        their memory mapped until the process ends (nothing of the pool is
        written again)."""
        self.closing = True
        self.arena.retired = 1
        if self.live == 0:
            self._finish_close()
            return
        if self.pid == this_pid and not self.detached and self.st.base != NULL \
                and self.st.size > 0:
            leave_line(&self.st)
        self.detached = True
        release, self.release = self.release, None
        if release is not None and self.pid == this_pid:
            release()

    @property
    def inherited(self):
        """True in a child made by fork(): the pool is its parent's, and the
        child may neither allocate from it nor run collectives in it."""
        return self.pid != this_pid

    # ------------------------------------------------ pool-resident memory

    def allocate(self, size_t nbytes, bint reserve=True):
        """A PoolBuffer of `nbytes` in this rank's arena (first fit, 64-byte
        aligned; 4 KiB for 64 KiB and more), its memory reserved in the
        backing file unless `reserve` is False.  MemoryError when the arena
        is full; PoolNoSpace (a MemoryError) when /dev/shm or the pool file
        cannot hold it; ValueError when closed or in a forked child."""
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

    cdef _let_go(self):
        """A PoolBuffer or a pool sharing this heap no longer needs the
        mapping: finish a close that waited for the last of them."""
        self.live -= 1
        if self.closing and self.live == 0:
            self._finish_close()

    def share_heap(self, Pool heap):
        """From now on this pool's zero-copy paths read and write arrays of
        `heap`'s arenas (a node heap every rank of this pool has mapped at
        some address of its own: offsets are from its start, the same in
        every process); this pool, made without arenas, keeps `heap` mapped
        until it is closed."""
        if self.arena_nbytes() or heap.closed or heap.heap_pool is not None:
            raise ValueError("share_heap: a pool without arenas, a heap with them")
        self.st.heap = heap.st.base
        self.st.heap_lo = heap.st.heap_lo
        self.st.heap_hi = heap.st.heap_hi
        heap.live += 1
        self.heap_pool = heap

    @property
    def heap(self):
        """The pool whose arenas hold the arrays this pool uses in place:
        the node heap it shares, or itself."""
        return self if self.heap_pool is None else self.heap_pool

    @property
    def identity(self):
        """What tells this mapping apart from every other (its segment's or
        partition's name and token): equal in every process that maps it."""
        if self.st.base == NULL:
            return None
        return self.name, (<cxl_header *>self.st.base).token

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

    @property
    def closed(self):
        return self.st.base == NULL or self.closing

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

    cdef _check(self):
        if self.pid != this_pid:
            raise ValueError("this pool belongs to the parent process: a child made "
                             "by fork() can neither allocate from it nor run "
                             "collectives in it")
        if self.st.base == NULL or self.closing:
            raise ValueError("pool is closed")

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
            cxl_no_space(READY_WHAT, self.lazy_nbytes)
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
        self.st.still_s = self.st.lease_s = 0
        self._done(OK, what)          # (before this call writes anything)
        self.st.passed_from = self.st.pool_ops + 1
        self.st.ops += 1
        self.st.pool_ops = self.st.ops
        self.st.stream = flags & V_STREAM
        self.st.took_zc = 0
        nbytes ^= (<uint64_t>flags & 0xFF) << 56
        self.st.sig[0] = ((<uint64_t>kind_code(what) << 48)
                          | (self.st.ops & 0xFFFF) << 32
                          | (<uint64_t>(op + 1) & 0xFF) << 24
                          | (<uint64_t>(tcode + 1) & 0xFF) << 16
                          | (<uint64_t>(root + 1) & 0xFFFF))
        self.st.sig[1] = nbytes
        self.st.sig[2] = pairs
        self.st.sig_pending = 1

    def set_progress(self, uintptr_t iprobe, uintptr_t comm, int any_source,
                     int any_tag, bint comm_is_int):
        """Keep MPI progressing while this rank waits in the pool: `iprobe`
        is the address of MPI_Iprobe, `comm` the handle of a communicator
        nothing is ever sent to (see cxlmpi.progress)."""
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


cdef char *BYTE_FORMAT = "B"


@cython.no_gc_clear   # a collected cycle holding it must still give its block back
cdef class PoolBuffer:
    """Memory in a pool's arenas, exported through the buffer protocol (what
    cxlmpi.empty wraps in a numpy array).  An allocation of this rank's
    arena goes back to it when the PoolBuffer is collected; every
    PoolBuffer keeps the pool mapped, even after its communicator is freed."""
    cdef Pool pool
    cdef readonly size_t offset
    cdef readonly size_t nbytes
    cdef bint owns_block          # an allocation of this rank's arena (not a view)
    cdef readonly bint readonly
    cdef Py_ssize_t shape[1]
    cdef Py_ssize_t strides[1]

    @staticmethod
    cdef PoolBuffer _new(Pool pool, size_t offset, size_t nbytes, bint owns_block,
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

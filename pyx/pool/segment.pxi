# The segment's life: create (or attach to, or map a partition of) one
# segment, format or check its header, set up this rank's control line,
# name it for ranks that cannot reach it unnamed, close, detach at exit, and
# what a forked child may not touch.  `_Segment` holds every field of a
# Pool; `_Arenas` (pool/arenas.pxi) and `Pool` (pool/pool.pxi) add methods.
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


from cxl_alloc cimport cxl_arena, cxl_arena_destroy, cxl_arena_init


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


cdef class _Segment:
    """One mapped segment and this rank's view of it (one per communicator):
    the base of Pool, which see."""
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
    cdef _Segment heap_pool      # the node heap this pool shares (None: its own arenas)
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
                # (no word of it may still beat, whichever way it was added)
                cxl_beat_remove_range(self.st.base, self.nbytes)
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
        cxlmpi.memory.backends).  The creating rank formats the partition, wiping
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
        self.st.heap_token = 0
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
            self.arena.revoked = arena_revoked
            self.arena.revoked_ctx = &self.st
        cdef cxl_ctrl *line = ctrl(&self.st, rank)
        cdef int rc = setup_liveness(&self.st, self.fd, self.file_offset, h.token)
        if rc != 0:
            self._unmap()
            raise PoolError(rc, f"cannot lock a byte of {self.name}: {strerror(rc).decode()}")
        line.pid = getpid()
        line.host = host_id
        line.attached = 1
        line.broken = 0
        line.beat = 0
        line.beat_period_ns = cxl_beat_period_ns
        line.start = start_ticks
        cxl_store_release(&line.seq, 0)
        cxl_flush_meta(line, CTRL_NBYTES, 0)
        rc = cxl_beat_add(&line.beat, 1, &h.token, h.token)
        if rc != 0:
            self._unmap()
            raise PoolError(rc, f"cannot start the heartbeat: {strerror(rc).decode()}")

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

    cdef _let_go(self):
        """A PoolBuffer or a pool sharing this heap no longer needs the
        mapping: finish a close that waited for the last of them."""
        self.live -= 1
        if self.closing and self.live == 0:
            self._finish_close()

    @property
    def identity(self):
        """What tells this mapping apart from every other (its segment's or
        partition's name and token): equal in every process that maps it."""
        if self.st.base == NULL:
            return None
        return self.name, (<cxl_header *>self.st.base).token

    @property
    def closed(self):
        return self.st.base == NULL or self.closing

    cdef _check(self):
        if self.pid != this_pid:
            raise ValueError("this pool belongs to the parent process: a child made "
                             "by fork() can neither allocate from it nor run "
                             "collectives in it")
        if self.st.base == NULL or self.closing:
            raise ValueError("pool is closed")

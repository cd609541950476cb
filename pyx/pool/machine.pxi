# What the machine offers the pool: CPU features, cache flushes, NUMA
# binding, the host's identity.
# (part of cxlmpi._pool: included by pyx/_pool.pyx)


cdef extern from "<sys/syscall.h>" nogil:
    long SYS_mbind
    long syscall(long number, ...)

cdef extern from "<sys/mman.h>" nogil:
    int madvise(void *addr, size_t length, int advice)

DEF MADV_POPULATE_WRITE = 23   # Linux 5.14
DEF MADV_HUGEPAGE = 14
DEF HUGE_NBYTES = 2 * 1024 * 1024


cdef void advise_huge(char *base, size_t start, size_t end) noexcept nogil:
    """Ask for transparent huge pages on [start, end) of a mapping (the
    arenas: pool arrays are computed on as much as communicated, and a
    4 KiB page per TLB entry slows that down); granted only where the
    kernel allows them for shared memory (`python -m cxlmpi --info`)."""
    start = (start + HUGE_NBYTES - 1) // HUGE_NBYTES * HUGE_NBYTES
    if end > start:
        madvise(base + start, end - start, MADV_HUGEPAGE)


cdef void prefault(char *base, size_t start, size_t end) noexcept nogil:
    """Map the pages of [start, end) of a mapping now, writable, without
    touching their contents: the halves every step reads and writes, so
    that no collective (and no timing of adaptive selection) pays for this
    process's first touches.  Older kernels: one read per page."""
    cdef size_t page = 4096, off
    start -= start % page
    if end <= start:
        return
    if madvise(base + start, end - start, MADV_POPULATE_WRITE) == 0:
        return
    cdef volatile char sink
    off = start
    while off < end:
        sink = (<volatile char *>(base + off))[0]
        off += page


def reducer_defined(int op, int tcode):
    """Whether the kernels define reduction `op` on type `tcode`."""
    return cxl_reducer(op, tcode) != NULL


def cpu_features():
    """CPU features the kernels use, detected at run time."""
    return {"cache_flush": bool(cxl_flush_available()),
            "clflushopt": bool(cxl_has_clflushopt()),
            "clwb": bool(cxl_has_clwb()),
            "avx2": bool(cxl_has_avx2()),
            "avx512f": bool(cxl_has_avx512f())}


def flush(uintptr_t address, size_t nbytes, bint invalidate, bint counted=False):
    """Write back (and with `invalidate`, drop) the cache lines of a range:
    how metadata outside a pool (the partition table) is shared between
    hosts without coherent caches.  `counted`: data moved by software
    coherence (flushed_lines counts it), not metadata."""
    if counted:
        cxl_flush(<const void *>address, nbytes, invalidate)
    else:
        cxl_flush_meta(<const void *>address, nbytes, invalidate)


DEF MPOL_BIND = 2


cdef bind_node(char *base, size_t nbytes, int node):
    """Bind the pages of a fresh shared mapping to NUMA node `node` before
    anything touches them."""
    cdef unsigned long mask[16]
    if node < 0 or node >= 16 * 64:
        raise PoolError(0, f"NUMA node {node} is out of range")
    memset(mask, 0, sizeof(mask))
    mask[node // 64] = 1UL << (node % 64)
    if syscall(SYS_mbind, base, nbytes, MPOL_BIND, mask, 16 * 64 + 1, 0) != 0:
        raise PoolError(errno, f"mbind(node {node}): {strerror(errno).decode()}")


cdef uint64_t host_id = 0
cdef uint64_t start_ticks = 0


def set_host(uint64_t value, uint64_t start=0):
    """This host's identity and this process's start time, stored in the
    control lines of the pools this process maps (a pid means something
    only on its host, and only for the process that started then)."""
    global host_id, start_ticks
    host_id = value
    start_ticks = start


# Heartbeats (pyx/cxl_beat.h): liveness where a pid means nothing.
cdef uint64_t lease_beats = 30


def set_heartbeat(double period_s, uint64_t beats):
    """The heartbeat period of this process's words (CXLMPI_HEARTBEAT; fixed
    once the first word beats: observers were told it) and the number of
    beats an observer waits for before it judges a still counter's owner
    gone (CXLMPI_LEASE_BEATS)."""
    global lease_beats
    cxl_beat_set_period(<uint64_t>(period_s * 1e9))
    lease_beats = max(beats, 1)


def heartbeat():
    """(period in ns, lease in beats, beats made so far by this process)."""
    return cxl_beat_period_ns, lease_beats, cxl_beat_rounds


def beat_add(uintptr_t address, uintptr_t owner=0, uint64_t token=0):
    """Advance the 64-bit word at `address` every period (and write its line
    back) until beat_remove, or until the word at `owner` no longer holds
    `token` (the memory changed hands): a partition-table entry or lock
    this process holds.  Remove it before its memory is unmapped."""
    cdef int rc = cxl_beat_add(<uint64_t *>address, 1, <const uint64_t *>owner, token)
    if rc != 0:
        raise PoolError(rc, f"cannot start the heartbeat: {strerror(rc).decode()}")


def beat_remove(uintptr_t address):
    """Stop beating the word at `address` (never registered: nothing)."""
    cxl_beat_remove(<const uint64_t *>address)


def beat_remove_range(uintptr_t address, size_t nbytes):
    """Stop beating every word in the `nbytes` at `address`, or watched
    there (call it before that memory is unmapped)."""
    cxl_beat_remove_range(<const void *>address, nbytes)


def flushed_lines():
    """Cache lines this process flushed or invalidated for software
    coherence (CXLMPI_COHERENCE=sw); the metadata flushes of every mode
    (set-up, detach, partition table) are not counted."""
    return cxl_flushed_lines


EMULATE_FAULTS = {"none": CXL_EMU_FAULT_NONE, "skip-flush": CXL_EMU_FAULT_SKIP_FLUSH,
                  "skip-invalidate": CXL_EMU_FAULT_SKIP_INVALIDATE}


def configure_emulation(uint64_t seed, str fault="none"):
    """How this process emulates memory without coherence
    (CXLMPI_COHERENCE=emulate, cxl_emulate.h): `seed` chooses the random
    evictions; `fault` ("none", "skip-flush", "skip-invalidate") drops
    every write-back or every invalidation of data lines (the tests'
    proof that the emulator catches a missing step)."""
    cxl_emu_configure(seed, EMULATE_FAULTS[fault])


def emulation():
    """This process's emulated coherence so far: ``pools`` (mappings
    emulated now), ``writebacks`` (dirty lines flushes wrote back),
    ``invalidates`` (lines reloaded from memory), ``evictions`` (dirty
    lines written back at random), ``dropped`` (lines a fault hook
    skipped)."""
    return {"pools": cxl_emu_nregions, "writebacks": cxl_emu_writebacks,
            "invalidates": cxl_emu_invalidates, "evictions": cxl_emu_evictions,
            "dropped": cxl_emu_dropped}

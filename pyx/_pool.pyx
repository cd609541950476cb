# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The pool: one shared-memory segment per pool group, its layout, and the
collective algorithms that run inside it without the GIL.

Layout of a segment (all offsets from the start of the mapping, so that each
process may map it at a different address)::

    0                 header page: magic, version, nranks, sizes (HEADER_NBYTES)
    HEADER_NBYTES     control lines, one per rank, CTRL_NBYTES (128) apart;
                      rank r is the only writer of line r:
                        +0  seq   steps published by r (release-stored last)
                        +8  pid   r's process id, for the liveness check
                        +16 value[2]  a number r publishes with a step
                            (its byte count in a header step), by parity
                        +32 host  r's host (pids are per host)
                        +40 attached  1 while r has the pool mapped
                        +48 value2[2]  more numbers of a header step
                            (buffer offsets)
                        +64 sig[3][2]  the call r makes, by parity of
                            the call's first step: what, its number,
                            root/op/type; bytes; and a sum over the
                            blocks it sends and receives (see wait_all)
                        +112 passed  r's last call that went to MPI
    slot_offset       data slots: rank r owns two halves of half_nbytes each,
                      at slot_offset + (2*r + h) * half_nbytes

The step protocol (one rule, every algorithm): at step s every rank writes what
it publishes into its own half s % 2, release-stores seq = s, waits until every
rank's seq >= s, then reads.  A half written at step s is read only during step
s and rewritten no earlier than step s + 2, by which time every reader has
published s + 1, i.e. finished reading: back-to-back collectives never need a
barrier and never overwrite data a slower rank is still reading.  Right after
its wait at step s a rank may already write its half (s + 1) % 2.

This module knows nothing of MPI: creating and attaching a segment needs only
its name, which the caller distributes.
"""

from libc.stdint cimport uint64_t, int64_t, uint32_t, uintptr_t, intptr_t
from libc.stdlib cimport malloc, free
from libc.errno cimport errno
from posix.unistd cimport getpid, close, ftruncate, getuid
from posix.mman cimport (shm_open, shm_unlink, mmap, munmap, PROT_READ,
                         PROT_WRITE, MAP_SHARED, MAP_FAILED)
from posix.fcntl cimport O_RDWR, O_CREAT, O_EXCL
from posix.stat cimport struct_stat, fstat, S_IRWXG, S_IRWXO
from libc.string cimport strerror, memset
from posix.types cimport off_t
from cpython.buffer cimport PyBUF_WRITABLE, PyBUF_FORMAT
cimport cython

import os
import secrets
import zlib

cdef extern from "<sys/syscall.h>" nogil:
    long SYS_mbind
    long syscall(long number, ...)

cdef extern from "cxl_kernels.h" nogil:
    ctypedef void (*cxl_reduce_fn)(void *dst, const void *a, const void *b, size_t n)
    ctypedef struct cxl_waiter:
        uint64_t polls
        uint64_t spin_polls
        double deadline_s
        double next_check_s
    uint64_t cxl_load_acquire(const uint64_t *p)
    void cxl_store_release(uint64_t *p, uint64_t v)
    void cxl_flush(const void *addr, size_t n, int invalidate)
    uint64_t cxl_flush_meta(const void *addr, size_t n, int invalidate)
    void cxl_copy(void *dst, const void *src, size_t n)
    void cxl_copy_out(void *dst, const void *src, size_t n)
    void cxl_waiter_init(cxl_waiter *w, double timeout_s, int spin)
    int cxl_backoff(cxl_waiter *w)
    double cxl_now_s()
    int cxl_pid_gone(int64_t pid)
    cxl_reduce_fn cxl_reducer(int op, int type)
    ctypedef struct cxl_progress:
        void *iprobe
        intptr_t comm
        int any_source
        int any_tag
        int comm_is_int
        uint64_t calls
    void cxl_progress_poke(cxl_progress *p)
    int cxl_progress_due(uint64_t polls, uint64_t spin_polls)
    uint64_t cxl_flushed_lines
    int cxl_flush_available()
    int cxl_has_clflushopt()
    int cxl_has_clwb()
    int cxl_has_avx2()
    int cxl_has_avx512f()

DEF MAGIC = 0x31304c504d4c5843   # "CXLMPL01" little-endian
DEF VERSION = 1
DEF HEADER_NBYTES = 4096
DEF CTRL_NBYTES = 128
DEF PAGE_NBYTES = 4096
DEF HOST_WORD = 4      # control-line word: the host's identity (cxlmpi.backends)
DEF ATTACHED_WORD = 5  # control-line word: 1 while the rank has the pool mapped
DEF SIG_WORD = 8       # control-line words 8..13: the call's signature, by parity
DEF PASSED_WORD = 14   # control-line word: the last call this rank sent to MPI

# Status codes returned by the nogil algorithms.
DEF OK = 0
DEF ERR_TIMEOUT = -1
DEF ERR_PEER_GONE = -2
DEF ERR_MISMATCH = -3  # the ranks' calls differ (size, root, op, type, counts)
DEF ERR_PASSED = -4    # a peer sent this call to MPI: every rank must

# Type codes and op codes: the same numbering as cxl_kernels.h.
TYPE_CODES = {
    "i8": 0, "i16": 1, "i32": 2, "i64": 3, "u8": 4, "u16": 5, "u32": 6,
    "u64": 7, "f32": 8, "f64": 9, "c64": 10, "c128": 11, "bool": 12,
    "byte": 13,
}
OP_CODES = {
    "SUM": 0, "PROD": 1, "MAX": 2, "MIN": 3, "LAND": 4, "LOR": 5,
    "LXOR": 6, "BAND": 7, "BOR": 8, "BXOR": 9,
}


ctypedef struct header_t:
    uint64_t magic
    uint32_t version
    uint32_t nranks
    uint64_t total_nbytes
    uint64_t slot_offset
    uint64_t half_nbytes
    uint64_t token         # partition token (device pools), 0 for shm
    uint64_t arena_offset  # pool-resident arrays: rank r's arena at
    uint64_t arena_nbytes  # arena_offset + r * arena_nbytes


ctypedef struct state_t:
    char *base
    int rank
    int size
    uint64_t step          # last step this rank published
    size_t half_nbytes
    size_t slot_offset
    int sw                 # software coherence: flush/invalidate
    int spin               # busy-poll before yielding (a core per rank)
    double timeout_s
    int failed_rank        # set on error: a rank that never arrived
    int failed_code
    size_t arena_offset    # where the arenas start (== mapping size if none)
    # per rank: its send buffer when read in place, or NULL (published
    # through its half); the array itself NULL: every rank publishes
    const char **res
    cxl_progress progress  # how a waiter keeps MPI progressing (set_progress)
    uint64_t ops           # calls of this rank: pool calls and passed ones
    uint64_t sig[3]        # this call's signature (see wait_all)
    int sig_pending        # the next step is this call's first


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


def set_host(uint64_t value):
    """This host's identity, stored in the control lines of the pools this
    process maps (a pid means something only on its host)."""
    global host_id
    host_id = value


DEF ARENA_ALIGN = 2 * 1024 * 1024


cdef inline uint64_t resident(state_t *st, const char *addr, size_t nbytes,
                              size_t mapped) noexcept nogil:
    """offset + 1 of [addr, addr + nbytes) in the arenas, or 0."""
    cdef const char *lo = st.base + st.arena_offset
    cdef const char *hi = st.base + mapped
    if st.arena_offset >= mapped or addr < lo or addr > hi or nbytes > <size_t>(hi - addr):
        return 0
    return <uint64_t>(addr - st.base) + 1


cdef size_t arena_start(size_t pool_nbytes) noexcept nogil:
    return (pool_nbytes + ARENA_ALIGN - 1) // ARENA_ALIGN * ARENA_ALIGN


def check_layout(int nranks, size_t pool_nbytes):
    """Raise ValueError when a pool of `pool_nbytes` bytes has no room for
    `nranks` ranks."""
    half = Pool.layout(nranks, pool_nbytes)[1]
    if half < 2 * PAGE_NBYTES:
        raise ValueError(
            f"pool of {pool_nbytes} bytes is too small for {nranks} ranks; "
            f"raise CXLMPI_POOL_SIZE")


def flushed_lines():
    """Cache lines this process flushed or invalidated for software
    coherence (CXLMPI_COHERENCE=sw); the metadata flushes of every mode
    (set-up, detach, partition table) are not counted."""
    return cxl_flushed_lines


# ------------------------------------------------------------------ protocol

cdef inline uint64_t *seq_ptr(state_t *st, int q) noexcept nogil:
    return <uint64_t *>(st.base + HEADER_NBYTES + <size_t>q * CTRL_NBYTES)


cdef inline char *half_ptr(state_t *st, int q, uint64_t step) noexcept nogil:
    return st.base + st.slot_offset + (2 * <size_t>q + <size_t>(step & 1)) * st.half_nbytes


cdef inline void publish(state_t *st) noexcept nogil:
    """Make this rank's writes of the next step visible, then announce it
    (with the call's signature when the step is the call's first).  In sw
    mode the line's second half (the signature) is written back before the
    sequence number is stored, the first half (seq, values) after."""
    cdef uint64_t *line = seq_ptr(st, st.rank)
    cdef int k
    st.step += 1
    if st.sig_pending:
        for k in range(3):
            line[SIG_WORD + 2 * k + (st.step & 1)] = st.sig[k]
        if st.sw:
            cxl_flush(line + 8, CTRL_NBYTES // 2, 0)
    cxl_store_release(line, st.step)
    if st.sw:
        cxl_flush(line, CTRL_NBYTES // 2, 0)


cdef inline uint64_t sig_word(const uint64_t *line, int k, uint64_t step) noexcept nogil:
    return line[SIG_WORD + 2 * k + (step & 1)]


cdef int passed_on(state_t *st, uint64_t *line, bint ahead) noexcept nogil:
    """At this call's first step: has peer `line` sent this call to MPI?
    Calls are numbered alike on every rank (pool calls and passed ones).
    A peer that has not published this step yet (`ahead` false) passed it
    when its last passed call is this one or later (it made no pool step
    since).  One that has (`ahead`) passed it when that step belongs to a
    later call of its own (it went on after an MPI call that completed
    without this rank, an eager send): the signature carries the call's
    number (its low 16 bits: a peer cannot run that far ahead).  Then this
    rank takes its step back, marks the call passed too, and goes to MPI as
    well."""
    if st.sw:
        cxl_flush(line + 8, CTRL_NBYTES // 2, 1)
    if ahead:
        if (sig_word(line, 0, st.step) >> 32) & 0xFFFF == st.ops & 0xFFFF:
            return 0
    elif cxl_load_acquire(line + PASSED_WORD) < st.ops:
        return 0
    cdef uint64_t *mine = seq_ptr(st, st.rank)
    st.step -= 1
    mine[PASSED_WORD] = st.ops
    if st.sw:
        cxl_flush(mine + 8, CTRL_NBYTES // 2, 0)
    cxl_store_release(mine, st.step)
    if st.sw:
        cxl_flush(mine, CTRL_NBYTES // 2, 0)
    return 1


cdef void mark_passed(void *state) noexcept nogil:
    """Pool.note_pass: count the call, and store its number as this rank's
    last call sent to MPI (nothing once the pool is unmapped)."""
    cdef state_t *st = <state_t *>state
    if st.base == NULL:
        return
    st.ops += 1
    cdef uint64_t *line = seq_ptr(st, st.rank)
    cxl_store_release(line + PASSED_WORD, st.ops)
    if st.sw:
        cxl_flush(line + 8, CTRL_NBYTES // 2, 0)


cdef int check_signatures(state_t *st) noexcept nogil:
    """After the first step of a call: every rank made the same call (the
    same collective, root, op, type and bytes), and the blocks the ranks
    send match those they receive (the sum of the third words is zero:
    each rank adds a hash of every block it sends and subtracts one of
    every block it receives).  All ranks read the same words, so all reach
    the same verdict."""
    cdef int q
    cdef uint64_t *line
    cdef uint64_t pairs = 0
    for q in range(st.size):
        line = seq_ptr(st, q)
        if st.sw and q != st.rank:
            cxl_flush(line + 8, CTRL_NBYTES // 2, 1)
        if sig_word(line, 0, st.step) != st.sig[0] or sig_word(line, 1, st.step) != st.sig[1]:
            st.failed_rank = q
            st.failed_code = ERR_MISMATCH
            return ERR_MISMATCH
        pairs += sig_word(line, 2, st.step)
    if pairs != 0:
        st.failed_rank = -1
        st.failed_code = ERR_MISMATCH
        return ERR_MISMATCH
    return OK


cdef inline void copy_in(state_t *st, void *slot, const void *src, size_t n) noexcept nogil:
    """Copy what this rank publishes into its half (in sw mode straight to
    memory, bypassing the cache: no write-back pass afterwards)."""
    if st.sw:
        cxl_copy_out(slot, src, n)
    else:
        cxl_copy(slot, src, n)


cdef inline void wrote(state_t *st, const void *addr, size_t n) noexcept nogil:
    """Data this rank just stored in the pool (flushed in sw mode)."""
    if st.sw:
        cxl_flush(addr, n, 0)


cdef inline void will_read(state_t *st, const void *addr, size_t n) noexcept nogil:
    """Data this rank is about to load from a peer (invalidated in sw mode)."""
    if st.sw:
        cxl_flush(addr, n, 1)


cdef int wait_all(state_t *st) noexcept nogil:
    """Wait until every rank has published the current step, keeping MPI
    progressing meanwhile.  At a call's first step, also: a peer that sent
    this call to MPI sends every rank there (ERR_PASSED), and the ranks'
    calls must match (ERR_MISMATCH)."""
    cdef int q
    cdef uint64_t *line
    cdef cxl_waiter w
    cdef bint first = st.sig_pending
    st.sig_pending = 0
    cxl_waiter_init(&w, st.timeout_s, st.spin)
    for q in range(st.size):
        if q == st.rank:
            continue
        line = seq_ptr(st, q)
        while True:
            if st.sw:
                cxl_flush(line, 8, 1)
            if cxl_load_acquire(line) >= st.step:
                # a step from a later call: q passed this one, then went on
                if first and passed_on(st, line, True):
                    return ERR_PASSED
                break
            if first and passed_on(st, line, False):
                return ERR_PASSED
            if st.progress.iprobe != NULL and cxl_progress_due(w.polls, w.spin_polls):
                cxl_progress_poke(&st.progress)
            if cxl_backoff(&w):
                if cxl_pid_gone((<int64_t *>line)[1]):
                    st.failed_rank = q
                    st.failed_code = ERR_PEER_GONE
                    return ERR_PEER_GONE
                if w.deadline_s > 0 and cxl_now_s() > w.deadline_s:
                    st.failed_rank = q
                    st.failed_code = ERR_TIMEOUT
                    return ERR_TIMEOUT
    if first:
        return check_signatures(st)
    return OK


cdef inline int step_all(state_t *st) noexcept nogil:
    publish(st)
    return wait_all(st)


# ---------------------------------------------------------------- algorithms

cdef int alg_barrier(state_t *st) noexcept nogil:
    return step_all(st)


cdef int alg_bcast(state_t *st, char *buf, size_t nbytes, int root,
                   size_t chunk) noexcept nogil:
    """Root copies chunk k into its half k % 2 while the others copy chunk k-1
    out of the other half: a two-stage pipeline."""
    cdef size_t off = 0, n
    cdef char *slot
    cdef int rc
    while off < nbytes:
        n = nbytes - off if nbytes - off < chunk else chunk
        slot = half_ptr(st, root, st.step + 1)
        if st.rank == root:
            copy_in(st, slot, buf + off, n)
        rc = step_all(st)
        if rc != OK:
            return rc
        if st.rank != root:
            will_read(st, slot, n)
            cxl_copy(buf + off, slot, n)
        off += n
    return OK


DEF BLOCK_NBYTES = 8192  # reduce block: the running result stays in L1


cdef inline size_t min_size(size_t a, size_t b) noexcept nogil:
    return a if a < b else b


cdef inline const char *source(state_t *st, int q, uint64_t step, size_t offset,
                               size_t at, const char *mine) noexcept nogil:
    """Where rank q's contribution to message byte `at` (byte `offset` of its
    half) is read: its own buffer when it is read in place (st.res), this
    rank's private buffer (`mine`), or q's half of `step`."""
    if st.res != NULL and st.res[q] != NULL:
        return st.res[q] + at
    if q == st.rank and mine != NULL:
        return mine
    return half_ptr(st, q, step) + offset


cdef void reduce_all(state_t *st, cxl_reduce_fn fn, char *dst, size_t offset,
                     size_t count, size_t itemsize, uint64_t step, int nranks,
                     const char *mine, char *dst2, size_t at) noexcept nogil:
    """dst = x0 op x1 op ... op x(nranks-1), left to right in rank order (a
    copy of x0 for one rank), from `count` elements at byte `offset` of each
    rank's half of `step` (message byte `at`); a rank's x is read from its
    own buffer instead when it is read in place, and this rank's from `mine`
    when that is not NULL (its private buffer: one copy fewer).  Block by
    block, so that the running result stays in L1 across the p - 1 folds
    and, when `dst2` is not NULL, is copied there while still hot.  The same
    order on every rank and for every slice: every rank gets bit-identical
    results."""
    cdef int q
    cdef size_t block = BLOCK_NBYTES // itemsize if BLOCK_NBYTES > itemsize else 1
    cdef size_t done = 0, n, off
    cdef const char *a
    cdef const char *b
    while done < count:
        n = min_size(count - done, block)
        off = done * itemsize
        a = source(st, 0, step, offset, at, mine) + off
        if nranks == 1:
            cxl_copy(dst + off, a, n * itemsize)
        else:
            b = source(st, 1, step, offset, at, mine) + off
            fn(dst + off, a, b, n)
        for q in range(2, nranks):
            b = source(st, q, step, offset, at, mine) + off
            fn(dst + off, dst + off, b, n)
        if dst2 != NULL:
            cxl_copy(dst2 + off, dst + off, n * itemsize)
        done += n


cdef void invalidate_all(state_t *st, size_t offset, size_t nbytes,
                         uint64_t step, size_t at) noexcept nogil:
    cdef int q
    if st.sw:
        for q in range(st.size):
            if st.res != NULL and st.res[q] != NULL:
                cxl_flush(st.res[q] + at, nbytes, 1)
            elif q != st.rank:
                cxl_flush(half_ptr(st, q, step) + offset, nbytes, 1)


cdef inline const char *own_source(state_t *st, const char *sendbuf,
                                   const char *dst) noexcept nogil:
    """This rank's contribution may be read straight from its send buffer,
    unless the result overwrites it before the fold reaches it (in place,
    rank >= 2: dst = x0 op x1 is written first)."""
    if sendbuf == dst and st.rank >= 2:
        return NULL
    return sendbuf


cdef int alg_reduce_small(state_t *st, const char *sendbuf, char *recvbuf,
                          size_t count, size_t itemsize, cxl_reduce_fn fn,
                          int root, int nranks, size_t chunk) noexcept nogil:
    """Every rank publishes its contribution; the root (every rank when
    root < 0) folds those of ranks 0 .. nranks-1 straight into its receive
    buffer: all of them for Reduce and Allreduce, x0 .. xr for Scan and
    x0 .. x(r-1) for Exscan (nothing on rank 0, whose buffer stays as is)."""
    cdef size_t per_step = chunk // itemsize
    cdef size_t done = 0, n
    cdef char *mine
    cdef char *dst
    cdef int rc
    while done < count:
        n = min_size(count - done, per_step)
        mine = half_ptr(st, st.rank, st.step + 1)
        if st.res == NULL or st.res[st.rank] == NULL:
            copy_in(st, mine, sendbuf + done * itemsize, n * itemsize)
        rc = step_all(st)
        if rc != OK:
            return rc
        if (root < 0 or root == st.rank) and nranks > 0:
            dst = recvbuf + done * itemsize
            invalidate_all(st, 0, n * itemsize, st.step, done * itemsize)
            reduce_all(st, fn, dst, 0, n, itemsize, st.step, nranks,
                       own_source(st, sendbuf + done * itemsize, dst), NULL,
                       done * itemsize)
        done += n
    return OK


cdef int alg_reduce_rsag(state_t *st, const char *sendbuf, char *recvbuf,
                         size_t count, size_t itemsize, cxl_reduce_fn fn,
                         int root, size_t chunk) noexcept nogil:
    """Reduce-scatter then allgather (or gather to the root), pipelined.

    Chunk k is published at step s (all of it but this rank's own slice,
    which only this rank reads, straight from its send buffer); right after
    the wait every rank reduces its 1/p slice of chunk k into its other half
    (the half of step s + 1, free by then), next to chunk k + 1's input, and
    into its own receive buffer while the block is hot.  At step s + 1 every
    rank (the root only, for Reduce) copies the other ranks' slices of chunk
    k out."""
    cdef size_t per_step = chunk // itemsize
    cdef size_t out_offset = per_step * itemsize
    cdef size_t nchunks = (count + per_step - 1) // per_step
    cdef size_t k, n, prev_n = 0, done = 0, prev_done = 0
    cdef size_t lo, hi
    cdef int q, p = st.size, rc
    cdef char *mine
    cdef char *out
    cdef const char *src
    for k in range(nchunks + 1):
        mine = half_ptr(st, st.rank, st.step + 1)
        n = 0
        if k < nchunks:
            n = min_size(count - done, per_step)
            src = sendbuf + done * itemsize
            lo = n * st.rank // p
            hi = n * (st.rank + 1) // p
            if st.res == NULL or st.res[st.rank] == NULL:
                copy_in(st, mine, src, lo * itemsize)
                copy_in(st, mine + hi * itemsize, src + hi * itemsize, (n - hi) * itemsize)
        rc = step_all(st)
        if rc != OK:
            return rc
        if k > 0 and (root < 0 or root == st.rank):
            # chunk k-1: slice q lives in rank q's half of this step (this
            # rank's own slice is in its receive buffer already)
            for q in range(p):
                if q == st.rank:
                    continue
                lo = prev_n * q // p
                hi = prev_n * (q + 1) // p
                out = half_ptr(st, q, st.step) + out_offset
                will_read(st, out, (hi - lo) * itemsize)
                cxl_copy(recvbuf + (prev_done + lo) * itemsize, out,
                         (hi - lo) * itemsize)
        if k < nchunks:
            lo = n * st.rank // p
            hi = n * (st.rank + 1) // p
            out = half_ptr(st, st.rank, st.step + 1) + out_offset
            invalidate_all(st, lo * itemsize, (hi - lo) * itemsize, st.step,
                           (done + lo) * itemsize)
            reduce_all(st, fn, out, lo * itemsize, hi - lo, itemsize, st.step, p,
                       sendbuf + (done + lo) * itemsize,
                       recvbuf + (done + lo) * itemsize
                       if (root < 0 or root == st.rank) else NULL, (done + lo) * itemsize)
            wrote(st, out, (hi - lo) * itemsize)
        prev_n = n
        prev_done = done
        done += n
    return OK


cdef inline uint64_t *value_ptr(state_t *st, int q, uint64_t step) noexcept nogil:
    return seq_ptr(st, q) + 2 + (step & 1)


cdef inline uint64_t *value2_ptr(state_t *st, int q, uint64_t step) noexcept nogil:
    return seq_ptr(st, q) + 6 + (step & 1)


cdef int agree_max(state_t *st, uint64_t mine, uint64_t pairs,
                   uint64_t *result) noexcept nogil:
    """A header step: every rank publishes `mine`; all learn the maximum
    (0 from any rank, meaning "not mine", makes the result 0).  `pairs`:
    this rank's share of the block checksum (see check_signatures), checked
    only when every rank takes the pool path (a rank that declines may not
    know its blocks)."""
    cdef int q, rc
    cdef uint64_t v, best = 0, total = 0
    cdef bint any_zero = mine == 0
    value_ptr(st, st.rank, st.step + 1)[0] = mine
    value2_ptr(st, st.rank, st.step + 1)[0] = pairs
    rc = step_all(st)
    if rc != OK:
        return rc
    for q in range(st.size):
        if st.sw and q != st.rank:
            cxl_flush(value_ptr(st, q, st.step), 8, 1)
        v = value_ptr(st, q, st.step)[0]
        total += value2_ptr(st, q, st.step)[0]
        if v == 0:
            any_zero = True
        if v > best:
            best = v
    # (a rank that refused its message publishes all ones: it raises anyway)
    if not any_zero and total != 0 and best != <uint64_t>0xFFFFFFFFFFFFFFFF:
        st.failed_rank = -1
        st.failed_code = ERR_MISMATCH
        return ERR_MISMATCH
    result[0] = 0 if any_zero else best
    return OK


# ------------------------------------------------------- zero-copy paths
#
# Buffers that live in the pool (cxlmpi.empty & co.) are read and written in
# place by their peers, by offset.  A large collective first runs a header
# step in which every rank publishes where its buffers are (offset + 1, or
# 0 for private memory); all ranks see the same values, so all pick the same
# path, and a rank whose buffer is read or written by peers returns only
# after a completion step, when every peer is done with it.

DEF BLOCK_TMP = 8192
DEF STREAM_MIN_NBYTES = 4 * 1024 * 1024
DEF MAX_ZC_RANKS = 1024


cdef int publish_offsets(state_t *st, uint64_t send1, uint64_t recv1,
                         uint64_t *sends, uint64_t *recvs) noexcept nogil:
    """Header step: every rank's (send offset + 1, recv offset + 1).  It is
    the call's first step, so every rank's message size is checked to be
    the same (check_signatures) before anyone writes into a peer's buffer."""
    cdef int q, rc
    value_ptr(st, st.rank, st.step + 1)[0] = send1
    value2_ptr(st, st.rank, st.step + 1)[0] = recv1
    rc = step_all(st)
    if rc != OK:
        return rc
    for q in range(st.size):
        if st.sw and q != st.rank:
            cxl_flush(seq_ptr(st, q), CTRL_NBYTES // 2, 1)
        sends[q] = value_ptr(st, q, st.step)[0]
        recvs[q] = value2_ptr(st, q, st.step)[0]
    return OK


cdef void fold_block(cxl_reduce_fn fn, char *dst, const char **src, int nranks,
                     size_t off, size_t n, size_t itemsize) noexcept nogil:
    """dst[0:n] = src0 op src1 op ... (rank order) at element `off`."""
    cdef int q
    cdef size_t b = off * itemsize
    if nranks == 1:
        cxl_copy(dst, src[0] + b, n * itemsize)
        return
    fn(dst, src[0] + b, src[1] + b, n)
    for q in range(2, nranks):
        fn(dst, dst, src[q] + b, n)


cdef int alg_reduce_direct(state_t *st, cxl_reduce_fn fn, const char **src,
                           char **dst, int ndst, size_t lo, size_t hi,
                           size_t itemsize) noexcept nogil:
    """Fold elements [lo, hi) of every source straight from where they live
    and write the result to every destination, block by block through a
    small private buffer (a destination may be a source: in place)."""
    cdef char tmp[BLOCK_TMP]
    cdef size_t block = BLOCK_TMP // itemsize if BLOCK_TMP > itemsize else 1
    cdef size_t at = lo, n
    cdef int q, d
    if st.sw:
        for q in range(st.size):
            cxl_flush(src[q] + lo * itemsize, (hi - lo) * itemsize, 1)
    while at < hi:
        n = min_size(hi - at, block)
        fold_block(fn, tmp, src, st.size, at, n, itemsize)
        for d in range(ndst):
            cxl_copy(dst[d] + at * itemsize, tmp, n * itemsize)
        at += n
    if st.sw:
        for d in range(ndst):
            cxl_flush(dst[d] + lo * itemsize, (hi - lo) * itemsize, 0)
    return OK


cdef int alg_reduce_zc(state_t *st, const uint64_t *sends, const uint64_t *recvs,
                       char *recvbuf, size_t count, size_t itemsize,
                       cxl_reduce_fn fn, int root, bint all_recv) noexcept nogil:
    """Every send buffer is in the pool.  With every receive buffer there
    too (the root's, for Reduce), rank r folds its 1/p slice from every
    source and writes it into every receive buffer: each byte is read once
    and written once per destination.  Otherwise every rank that receives
    folds everything into its own (private) receive buffer."""
    cdef const char *src[MAX_ZC_RANKS]
    cdef char *dst[MAX_ZC_RANKS]
    cdef int q, p = st.size, ndst = 0, rc
    cdef size_t lo, hi
    for q in range(p):
        src[q] = st.base + sends[q] - 1
    if all_recv:
        lo = count * st.rank // p
        hi = count * (st.rank + 1) // p
        for q in range(p):
            if root < 0 or q == root:
                dst[ndst] = st.base + recvs[q] - 1
                ndst += 1
        alg_reduce_direct(st, fn, src, dst, ndst, lo, hi, itemsize)
    elif root < 0 or root == st.rank:
        dst[0] = recvbuf
        alg_reduce_direct(st, fn, src, dst, 1, 0, count, itemsize)
    rc = step_all(st)  # completion: every source read, every result written
    if rc == OK and st.sw and (root < 0 or root == st.rank):
        cxl_flush(recvbuf, count * itemsize, 1)
    return rc


cdef int alg_bcast_push(state_t *st, char *buf, size_t nbytes, int root,
                        const uint64_t *recvs) noexcept nogil:
    """Every receiver's buffer is in the pool: the root copies straight into
    each of them, then one completion step (receivers in sw mode then drop
    stale lines of their buffer)."""
    cdef int q
    cdef char *dst
    cdef int rc
    if st.rank == root:
        for q in range(st.size):
            if q != root:
                dst = st.base + recvs[q] - 1
                if dst != buf:
                    cxl_copy(dst, buf, nbytes)
                    wrote(st, dst, nbytes)
    rc = step_all(st)
    if rc == OK and st.rank != root:
        will_read(st, buf, nbytes)
    return rc


cdef int alg_bcast_zc(state_t *st, char *buf, size_t nbytes, int root,
                      uint64_t root1) noexcept nogil:
    """The root's buffer is in the pool: every other rank copies straight
    from it (one copy instead of two, none at the root)."""
    cdef const char *src = st.base + root1 - 1
    if st.rank != root and <const char *>buf != src:
        will_read(st, src, nbytes)
        if nbytes >= STREAM_MIN_NBYTES:
            cxl_copy_out(buf, src, nbytes)
        else:
            cxl_copy(buf, src, nbytes)
    return step_all(st)


cdef bint all_fit(const uint64_t *v, int n, size_t nbytes, size_t mapped) noexcept nogil:
    """Every value is an offset + 1 with `nbytes` after it inside the pool."""
    cdef int q
    for q in range(n):
        if v[q] == 0 or v[q] - 1 + nbytes > mapped:
            return False
    return True


cdef int alg_gather(state_t *st, const char *sendbuf, size_t send_nbytes,
                    char **recv_addr, const size_t *recv_nbytes, int root,
                    size_t nsteps, size_t chunk) noexcept nogil:
    """Allgather(v) (root < 0) and Gather(v): every rank publishes its block,
    `chunk` bytes a step, in its own half; every reader (every rank, or the
    root) copies each peer's chunk to where that peer's block goes.  A
    reader's own block is copied straight from its send buffer.  A reader
    never copies more than it expects from a peer (`recv_nbytes`)."""
    cdef size_t j, off, n
    cdef int q, rc
    cdef bint reader = root < 0 or root == st.rank
    cdef char *mine
    cdef const char *src
    if reader and recv_addr[st.rank] != sendbuf:
        cxl_copy(recv_addr[st.rank], sendbuf, min_size(send_nbytes, recv_nbytes[st.rank]))
    for j in range(nsteps):
        off = j * chunk
        mine = half_ptr(st, st.rank, st.step + 1)
        if off < send_nbytes:
            n = min_size(chunk, send_nbytes - off)
            copy_in(st, mine, sendbuf + off, n)
        rc = step_all(st)
        if rc != OK:
            return rc
        if reader:
            for q in range(st.size):
                if q == st.rank or off >= recv_nbytes[q]:
                    continue
                n = min_size(chunk, recv_nbytes[q] - off)
                src = half_ptr(st, q, st.step)
                will_read(st, src, n)
                cxl_copy(recv_addr[q] + off, src, n)
    return OK


cdef int alg_exchange(state_t *st, const char **send_addr, const size_t *send_nbytes,
                      char **recv_addr, const size_t *recv_nbytes,
                      size_t nsteps, size_t sub) noexcept nogil:
    """Alltoall(v) and Scatter(v): personalized exchange.  A half is cut into
    p sub-slots of `sub` bytes, sub-slot d for the data going to rank d; each
    step every rank puts up to `sub` more bytes for each peer in its
    sub-slots, and every rank copies the bytes meant for it out of every
    peer's half.  This rank's own block is copied directly."""
    cdef size_t j, off, n
    cdef int q, rc, me = st.rank
    cdef char *mine
    cdef const char *src
    if recv_addr[me] != send_addr[me]:
        cxl_copy(recv_addr[me], send_addr[me], min_size(send_nbytes[me], recv_nbytes[me]))
    for j in range(nsteps):
        off = j * sub
        mine = half_ptr(st, me, st.step + 1)
        for q in range(st.size):
            if q != me and off < send_nbytes[q]:
                n = min_size(sub, send_nbytes[q] - off)
                copy_in(st, mine + q * sub, send_addr[q] + off, n)
        rc = step_all(st)
        if rc != OK:
            return rc
        for q in range(st.size):
            if q != me and off < recv_nbytes[q]:
                n = min_size(sub, recv_nbytes[q] - off)
                src = half_ptr(st, q, st.step) + me * sub
                will_read(st, src, n)
                cxl_copy(recv_addr[q] + off, src, n)
    return OK


cdef int publish_block_offsets(state_t *st, const char **send_addr,
                               const size_t *send_nbytes, char **recv_addr,
                               const size_t *recv_nbytes, size_t mapped,
                               bint *pull, bint *push) noexcept nogil:
    """Header step of the personalized collectives.  Every rank writes, in
    its half, three tables of p words: where its block for each rank lives
    (offset + 1, or 0: private), where the block from each rank goes in its
    receive buffer, and that block's size (an empty block counts as in the
    pool).  Every rank reads every table, so all decide alike: `pull` when
    every send block is in the pool (readers copy from the owners), else
    `push` when every receive block is (writers copy into the receivers).
    In place (a block both sent and received) neither: one rank's reading
    would race another's writing."""
    cdef uint64_t *mine = <uint64_t *>half_ptr(st, st.rank, st.step + 1)
    cdef const uint64_t *theirs
    cdef int q, d, rc, p = st.size
    cdef bint inplace = False
    for d in range(p):
        if d != st.rank and send_nbytes[d] and <const char *>recv_addr[d] == send_addr[d]:
            inplace = True
    for d in range(p):
        mine[d] = 1 if send_nbytes[d] == 0 else \
            resident(st, send_addr[d], send_nbytes[d], mapped)
        mine[p + d] = 1 if recv_nbytes[d] == 0 else \
            resident(st, recv_addr[d], recv_nbytes[d], mapped)
        mine[2 * p + d] = recv_nbytes[d]
        if inplace:
            mine[d] = 0
            mine[p + d] = 0
    wrote(st, mine, 3 * p * 8)
    rc = step_all(st)
    if rc != OK:
        return rc
    pull[0] = True
    push[0] = True
    for q in range(p):
        theirs = <const uint64_t *>half_ptr(st, q, st.step)
        will_read(st, theirs, 3 * p * 8)
        for d in range(p):
            if theirs[d] == 0:
                pull[0] = False
            if theirs[p + d] == 0:
                push[0] = False
    return OK


cdef int alg_exchange_push(state_t *st, const char **send_addr, const size_t *send_nbytes,
                           char **recv_addr, const size_t *recv_nbytes,
                           size_t mapped) noexcept nogil:
    """Every receive block is in the pool: each rank copies its block for
    each rank straight into that rank's receive buffer (never more than the
    receiver said it takes), then one completion step; in sw mode each rank
    then drops stale lines of its receive buffer."""
    cdef int d, q, p = st.size, me = st.rank
    cdef const uint64_t *table
    cdef uint64_t at
    cdef size_t n
    cdef char *dst
    for d in range(p):
        if d == me:
            n = min_size(send_nbytes[me], recv_nbytes[me])
            if n and <const char *>recv_addr[me] != send_addr[me]:
                cxl_copy(recv_addr[me], send_addr[me], n)
            continue
        table = <const uint64_t *>half_ptr(st, d, st.step)
        n = min_size(send_nbytes[d], table[2 * p + me])
        if n == 0:
            continue
        at = table[p + me] - 1
        n = min_size(n, mapped - at)
        dst = st.base + at
        cxl_copy(dst, send_addr[d], n)
        wrote(st, dst, n)
    rc = step_all(st)
    if rc == OK and st.sw:
        for q in range(p):
            if q != me:
                will_read(st, recv_addr[q], recv_nbytes[q])
    return rc


cdef int alg_exchange_zc(state_t *st, const char **send_addr, const size_t *send_nbytes,
                         char **recv_addr, const size_t *recv_nbytes,
                         size_t mapped) noexcept nogil:
    """Every block is in the pool: each rank copies the blocks meant for it
    straight from their owners' buffers (the table of the header step is
    still in every rank's half), then one completion step."""
    cdef int q, me = st.rank
    cdef uint64_t at
    cdef size_t n
    cdef const char *src
    for q in range(st.size):
        if q == me:
            src = send_addr[me]
            n = min_size(send_nbytes[me], recv_nbytes[me])
        else:
            at = (<const uint64_t *>half_ptr(st, q, st.step))[me] - 1
            src = st.base + at
            n = min_size(recv_nbytes[q], mapped - at)
        if n and <const char *>recv_addr[q] != src:
            will_read(st, src, n)
            cxl_copy(recv_addr[q], src, n)
    return step_all(st)


cdef int exchange_in_place(state_t *st, const char **send_addr,
                           const size_t *send_nbytes, char **recv_addr,
                           const size_t *recv_nbytes, size_t mapped,
                           bint *done) noexcept nogil:
    """The header step of a personalized exchange, then pull or push when
    the tables allow it (`done`); else the caller copies through the halves."""
    cdef bint pull = False, push = False
    cdef int rc = publish_block_offsets(st, send_addr, send_nbytes, recv_addr, recv_nbytes,
                                        mapped, &pull, &push)
    done[0] = rc == OK and (pull or push)
    if rc != OK or not done[0]:
        return rc
    if pull:
        return alg_exchange_zc(st, send_addr, send_nbytes, recv_addr, recv_nbytes, mapped)
    return alg_exchange_push(st, send_addr, send_nbytes, recv_addr, recv_nbytes, mapped)


cdef int alg_reduce_scatter_zc(state_t *st, cxl_reduce_fn fn, char *recvbuf,
                               size_t count, size_t itemsize, size_t mapped) noexcept nogil:
    """Every piece is in the pool: each rank folds the pieces meant for it
    straight from their owners' buffers into its receive buffer."""
    cdef const char *src[MAX_ZC_RANKS]
    cdef char *dst[1]
    cdef uint64_t at
    cdef int q
    for q in range(st.size):
        at = (<const uint64_t *>half_ptr(st, q, st.step))[st.rank] - 1
        if at + count * itemsize > mapped:
            at = 0  # a piece shorter than this rank's count: erroneous, stay inside
        src[q] = st.base + at
    dst[0] = recvbuf
    if count:
        alg_reduce_direct(st, fn, src, dst, 1, 0, count, itemsize)
    return step_all(st)


cdef int alg_reduce_scatter(state_t *st, const char **send_addr,
                            const size_t *counts, char *recvbuf, size_t itemsize,
                            cxl_reduce_fn fn, size_t nsteps, size_t sub_count,
                            bint inplace) noexcept nogil:
    """Reduce_scatter(_block): rank d's result is the rank-order fold of
    every rank's piece d (`counts[d]` elements at `send_addr[d]`).  Pieces
    travel as in alg_exchange, `sub_count` elements a step; the receiver
    folds them straight into its receive buffer, its own piece read from its
    send buffer (or from its pool copy when in place: see `piece`)."""
    cdef size_t j, off, n, my_n
    cdef int q, rc, me = st.rank
    cdef size_t sub = sub_count * itemsize
    cdef char *mine
    cdef const char *a
    cdef const char *b
    for j in range(nsteps):
        off = j * sub_count
        mine = half_ptr(st, me, st.step + 1)
        for q in range(st.size):
            if off < counts[q] and (q != me or (inplace and me != 0)):
                n = min_size(sub_count, counts[q] - off)
                copy_in(st, mine + q * sub, send_addr[q] + off * itemsize, n * itemsize)
        rc = step_all(st)
        if rc != OK:
            return rc
        if off >= counts[me]:
            continue
        my_n = min_size(sub_count, counts[me] - off)
        for q in range(st.size):
            if q != me:
                will_read(st, half_ptr(st, q, st.step) + me * sub, my_n * itemsize)
        a = piece(st, send_addr[me] + off * itemsize, 0, inplace, sub)
        if st.size == 1:
            cxl_copy(recvbuf + off * itemsize, a, my_n * itemsize)
            continue
        b = piece(st, send_addr[me] + off * itemsize, 1, inplace, sub)
        fn(recvbuf + off * itemsize, a, b, my_n)
        for q in range(2, st.size):
            b = piece(st, send_addr[me] + off * itemsize, q, inplace, sub)
            fn(recvbuf + off * itemsize, recvbuf + off * itemsize, b, my_n)
    return OK


cdef inline const char *piece(state_t *st, const char *own, int q, bint inplace,
                              size_t sub) noexcept nogil:
    """Where rank q's piece for this rank is: the pool, or this rank's own
    send buffer -- unless in place on a rank other than 0, where the result
    (at the start of the buffer) overlaps the own piece at another offset."""
    if q == st.rank and not (inplace and st.rank != 0):
        return own
    return half_ptr(st, q, st.step) + <size_t>st.rank * sub


cdef cxl_reduce_fn reducer(int op, int tcode) except NULL:
    """The kernel of `op` on type `tcode` (the dispatcher checked it exists)."""
    cdef cxl_reduce_fn fn = cxl_reducer(op, tcode)
    if fn == NULL:
        raise ValueError(f"op {op} is not defined for type {tcode}")
    return fn


# ------------------------------------------------------------- signatures

KIND_NAMES = {}   # kind code -> the name it was made from (error messages)
cdef dict KIND_CODES = {}


cdef uint64_t kind_code(str what):
    """A stable 16-bit code of a collective's name (the same in every
    process: no salted hash)."""
    code = KIND_CODES.get(what)
    if code is None:
        code = zlib.crc32(what.encode()) & 0xFFFF
        KIND_CODES[what] = code
        KIND_NAMES[code] = what
    return code


cdef inline uint64_t mix64(uint64_t x) noexcept nogil:
    """splitmix64's finalizer: a well-spread 64-bit hash of x."""
    x += <uint64_t>0x9E3779B97F4A7C15
    x = (x ^ (x >> 30)) * <uint64_t>0xBF58476D1CE4E5B9
    x = (x ^ (x >> 27)) * <uint64_t>0x94D049BB133111EB
    return x ^ (x >> 31)


cdef uint64_t counts_hash(const size_t *counts, int n) noexcept nogil:
    cdef uint64_t h = mix64(n)
    cdef int i
    for i in range(n):
        h = mix64(h ^ counts[i])
    return h


def pair_hash(uint64_t src, uint64_t dst, uint64_t nbytes):
    """The checksum term of a block of `nbytes` from rank src to rank dst:
    the sender adds it, the receiver subtracts it, so that the ranks' terms
    sum to zero exactly when every block is received as sent."""
    return mix64(mix64((src << 32) ^ dst) ^ nbytes)


# ---------------------------------------------------------------------- pool

class PoolError(OSError):
    """A segment could not be created, opened or mapped."""


class PoolNoSpace(MemoryError):
    """The memory behind the pool (/dev/shm, the pool file) cannot hold more."""


# Pool memory is reserved before it is used (fallocate on the backing file):
# tmpfs allocates pages only at first touch, and a full /dev/shm (a
# container's 64 MiB) would otherwise kill the process with SIGBUS.  What
# cannot be reserved falls back - private memory for arrays, MPI for a pool
# that cannot be created - and the process says so once (cxl_no_space).
NO_SPACE = "not enough shared memory"

cdef extern from *:
    """
    #include <stdio.h>
    static int cxl_warned_no_space = 0;
    static void cxl_no_space(const char *what, size_t nbytes)
    {
        if (__atomic_exchange_n(&cxl_warned_no_space, 1, __ATOMIC_ACQ_REL)) return;
        fprintf(stderr, "cxlmpi: warning: not enough shared memory (/dev/shm or the "
                "pool file is full) for %zu more bytes of %s. Give the job more "
                "(e.g. docker run --shm-size=1g) or lower CXLMPI_POOL_SIZE / "
                "CXLMPI_ARENA_SIZE; this warning is not repeated.\\n", nbytes, what);
        fflush(stderr);
    }
    """
    void cxl_no_space(const char *what, size_t nbytes) nogil

cdef extern from "cxl_alloc.h" nogil:
    ctypedef void (*cxl_notice_fn)(const char *what, size_t nbytes)
    ctypedef struct cxl_arena:
        size_t nbytes
        int retired
    int CXL_ALLOC_OK
    int CXL_ALLOC_FULL
    int CXL_ALLOC_NOSPACE
    void cxl_arena_init(cxl_arena *a, char *base, size_t lo, size_t nbytes, int fd,
                        int64_t fd_offset, cxl_notice_fn notice, const char *what)
    void cxl_arena_destroy(cxl_arena *a)
    int cxl_arena_alloc(cxl_arena *a, size_t size, int reserve, size_t *offset)
    void cxl_arena_free(cxl_arena *a, size_t off)
    size_t cxl_arena_free_bytes(cxl_arena *a)
    int fallocate(int fd, int mode, off_t offset, off_t length)
    int dup(int fd)
    int EOPNOTSUPP, ENODEV, ENOSYS, ESPIPE, EINTR

cdef extern from "<pthread.h>" nogil:
    int pthread_atfork(void (*prepare)() noexcept nogil, void (*parent)() noexcept nogil,
                       void (*child)() noexcept nogil)

cdef const char *ARENA_WHAT = (b"pool-resident arrays (cxlmpi.empty & co. return private "
                               b"arrays now)")

# The process this module runs in: a child made by fork() gets its own pid
# here, and leaves every pool it inherited alone (see Pool.inherited).
cdef int64_t this_pid = getpid()


cdef void after_fork_in_child() noexcept nogil:
    global this_pid
    this_pid = getpid()


pthread_atfork(NULL, NULL, after_fork_in_child)


def warn_no_space(str what, size_t nbytes):
    """Say, once per process, that `nbytes` of pool memory for `what` could
    not be had (later calls, and the NumPy hook's, stay silent)."""
    cxl_no_space(what.encode(), nbytes)


def no_space_notice():
    """Address of the C function behind warn_no_space (for the NumPy hook)."""
    return <uintptr_t>cxl_no_space


cdef int reserve_file(int fd, size_t offset, size_t nbytes) noexcept nogil:
    """Back [offset, offset + nbytes) of `fd` with memory now; 0, or the
    errno (0 too where the file cannot reserve: devdax needs no reserving)."""
    cdef int rc = fallocate(fd, 0, <off_t>offset, <off_t>nbytes)
    while rc != 0 and errno == EINTR:
        rc = fallocate(fd, 0, <off_t>offset, <off_t>nbytes)
    if rc == 0 or errno == EOPNOTSUPP or errno == ENODEV or errno == ENOSYS \
            or errno == ESPIPE:
        return 0
    return errno


cdef class Pool:
    """One mapped segment and this rank's view of it (one per communicator).

    Create with `Pool.create(...)` on the group leader, send `name` to the
    others, `Pool.attach(name, ...)` there, then `unlink()` on the leader
    once every rank has attached.
    """
    cdef state_t st
    cdef size_t nbytes
    cdef readonly str name
    cdef readonly bint unlinked
    cdef public size_t chunk_nbytes
    cdef public size_t rsag_min_nbytes
    cdef public int rsag_min_ranks
    cdef public object release   # called once after close (frees a partition)
    cdef public size_t zerocopy_min_nbytes
    cdef cxl_arena arena         # this rank's arena (cxl_alloc.h: no Python inside)
    cdef size_t live             # PoolBuffers alive (they keep the mapping)
    cdef bint closing
    cdef bint detached           # exiting: line cleared, partition given back
    cdef readonly int fd         # the backing file, for reserving memory
    cdef readonly size_t file_offset  # where the mapping starts in it
    cdef int64_t pid             # the process that mapped the pool

    def __cinit__(self):
        self.st.base = NULL
        self.nbytes = 0
        self.unlinked = True
        self.live = 0
        self.closing = False
        self.detached = False
        self.fd = -1
        self.file_offset = 0
        self.pid = this_pid
        memset(&self.arena, 0, sizeof(cxl_arena))

    def __dealloc__(self):
        self._unmap()
        cxl_arena_destroy(&self.arena)

    cdef _unmap(self):
        """Let go of the segment.  Only the process that mapped it clears its
        control line and removes the name; a forked child, and a process
        detached at exit (arrays may still be used), keep the mapping until
        they exit and touch nothing shared."""
        cdef uint64_t *line
        cdef bint mine = self.pid == this_pid
        if self.st.base != NULL:
            if mine and not self.detached and self.st.size > 0:
                line = seq_ptr(&self.st, self.st.rank)  # this rank is gone
                line[ATTACHED_WORD] = 0
                cxl_flush_meta(line, CTRL_NBYTES, 0)
            if mine and not self.detached:
                munmap(self.st.base, self.nbytes)
            self.st.base = NULL
        if self.fd >= 0:
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
    def mapping_nbytes(int nranks, size_t pool_nbytes, size_t arena_nbytes):
        """Bytes of a pool with `arena_nbytes` of pool-resident arrays per
        rank (the arenas start 2 MiB-aligned after the slots)."""
        if arena_nbytes == 0:
            return pool_nbytes
        return arena_start(pool_nbytes) + <size_t>nranks * arena_nbytes

    @staticmethod
    def create(int rank, int nranks, size_t pool_nbytes, str prefix="cxlmpi",
               int numa_node=-1, size_t arena_nbytes=0):
        """Create, size and map a new POSIX shared-memory segment under an
        unguessable name (O_EXCL, mode 0600); returns the Pool of the
        creating rank.  With `numa_node` >= 0 the segment's pages are bound
        to that NUMA node (the policy is stored with the shared object, so
        every rank's page faults follow it)."""
        check_layout(nranks, pool_nbytes)
        cdef size_t total = Pool.mapping_nbytes(nranks, pool_nbytes, arena_nbytes)
        name = f"/{prefix}-{os.getuid()}-{os.getpid()}-{secrets.token_hex(12)}"
        cdef bytes bname = name.encode()
        cdef int fd = shm_open(bname, O_RDWR | O_CREAT | O_EXCL, 0o600)
        if fd < 0:
            raise PoolError(errno, f"shm_open({name}): {strerror(errno).decode()}")
        cdef Pool pool = Pool.__new__(Pool)
        pool.name = name
        pool.unlinked = False
        pool.fd = fd                # kept: arena blocks are reserved through it
        try:
            if ftruncate(fd, total) != 0:
                raise PoolError(errno, f"ftruncate({name}, {total}): "
                                       f"{strerror(errno).decode()}")
            pool._map(fd, 0, total)
            if numa_node >= 0:
                bind_node(pool.st.base, total, numa_node)  # before any page exists
            pool._reserve_segment(pool_nbytes)
        except BaseException:
            pool._unmap()
            raise
        pool._format(nranks, 0, pool_nbytes, arena_nbytes)
        pool._setup(rank)
        return pool

    @staticmethod
    def attach(str name, int rank, int nranks, size_t pool_nbytes,
               size_t arena_nbytes=0):
        """Map an existing segment created by `create` on another rank."""
        cdef size_t total = Pool.mapping_nbytes(nranks, pool_nbytes, arena_nbytes)
        cdef bytes bname = name.encode()
        cdef int fd = shm_open(bname, O_RDWR, 0)
        if fd < 0:
            raise PoolError(errno, f"shm_open({name}): {strerror(errno).decode()}")
        cdef struct_stat sb
        cdef Pool pool = Pool.__new__(Pool)
        pool.name = name
        pool.fd = fd                # kept: arena blocks are reserved through it
        try:
            if fstat(fd, &sb) != 0:
                raise PoolError(errno, f"fstat({name}): {strerror(errno).decode()}")
            if sb.st_uid != getuid() or (sb.st_mode & (S_IRWXG | S_IRWXO)):
                raise PoolError(0, f"{name}: not a private segment of this user")
            if <size_t>sb.st_size != total:
                raise PoolError(0, f"{name}: {sb.st_size} bytes, expected {total}")
            pool._map(fd, 0, total)
        except BaseException:
            pool._unmap()
            raise
        pool._verify(nranks, 0, pool_nbytes, arena_nbytes)
        pool._setup(rank)
        return pool

    @staticmethod
    def map_partition(int fd, size_t offset, size_t nbytes, int rank, int nranks,
                      bint create, uint64_t token, str name, size_t arena_nbytes=0):
        """Map `nbytes` of an open file or device at `offset` (a partition
        claimed through the device's partition table, see
        cxlmpi.backends).  The creating rank formats the partition, wiping
        whatever an earlier job left in its control lines; the others check
        that it carries this job's `token`."""
        check_layout(nranks, nbytes)
        cdef Pool pool = Pool.__new__(Pool)
        pool.name = name
        pool.fd = dup(fd)           # arena blocks are reserved through it
        pool.file_offset = offset
        pool._map(fd, offset, Pool.mapping_nbytes(nranks, nbytes, arena_nbytes))
        if create:
            pool._reserve_segment(nbytes)
            pool._format(nranks, token, nbytes, arena_nbytes)
        else:
            pool._verify(nranks, token, nbytes, arena_nbytes)
        pool._setup(rank)
        return pool

    cdef _map(self, int fd, size_t offset, size_t nbytes):
        cdef void *addr = mmap(NULL, nbytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                               fd, <off_t>offset)
        if addr == MAP_FAILED:
            raise PoolError(errno, f"mmap({self.name}, {nbytes} bytes at {offset}): "
                                   f"{strerror(errno).decode()}")
        self.st.base = <char *>addr
        self.nbytes = nbytes

    cdef _reserve_segment(self, size_t nbytes):
        """Back the header, control lines and slots (the first `nbytes`)
        with memory now, so that no collective ever meets a SIGBUS."""
        cdef int err
        with nogil:
            err = reserve_file(self.fd, self.file_offset, nbytes)
        if err:
            raise PoolError(err, f"{NO_SPACE} for the pool {self.name} ({nbytes} bytes, "
                                 f"CXLMPI_POOL_SIZE): {strerror(err).decode()}")

    cdef _format(self, int nranks, uint64_t token, size_t pool_nbytes,
                 size_t arena_nbytes):
        """Write the header of a new pool: control lines zeroed first (no
        stale step of an earlier user), the magic number last."""
        slot_offset, half = Pool.layout(nranks, pool_nbytes)
        cdef size_t ctrl_end = HEADER_NBYTES + <size_t>nranks * CTRL_NBYTES
        memset(self.st.base, 0, ctrl_end)
        cdef header_t *h = <header_t *>self.st.base
        h.version = VERSION
        h.nranks = nranks
        h.total_nbytes = self.nbytes
        h.slot_offset = slot_offset
        h.half_nbytes = half
        h.token = token
        h.arena_offset = arena_start(pool_nbytes) if arena_nbytes else pool_nbytes
        h.arena_nbytes = arena_nbytes
        cxl_store_release(&h.magic, MAGIC)
        cxl_flush_meta(self.st.base, ctrl_end, 0)

    cdef _verify(self, int nranks, uint64_t token, size_t pool_nbytes,
                 size_t arena_nbytes):
        cdef header_t *h = <header_t *>self.st.base
        cxl_flush_meta(h, sizeof(header_t), 1)
        slot_offset, half = Pool.layout(nranks, pool_nbytes)
        if (cxl_load_acquire(&h.magic) != MAGIC or h.version != VERSION
                or h.arena_nbytes != arena_nbytes
                or h.nranks != <uint32_t>nranks or h.total_nbytes != self.nbytes
                or h.slot_offset != slot_offset or h.half_nbytes != half
                or h.token != token):
            self._unmap()
            raise PoolError(0, f"{self.name}: header does not match this job's pool")

    cdef _setup(self, int rank):
        cdef header_t *h = <header_t *>self.st.base
        self.st.rank = rank
        self.st.size = h.nranks
        self.st.step = 0
        self.st.half_nbytes = h.half_nbytes
        self.st.slot_offset = h.slot_offset
        self.st.sw = 0
        self.st.spin = 1
        self.st.timeout_s = 0
        self.st.res = NULL
        memset(&self.st.progress, 0, sizeof(cxl_progress))
        self.st.ops = 0
        self.st.sig_pending = 0
        self.chunk_nbytes = h.half_nbytes
        self.rsag_min_nbytes = 0
        self.rsag_min_ranks = 3
        self.zerocopy_min_nbytes = 256 * 1024
        self.st.arena_offset = h.arena_offset
        if h.arena_nbytes:
            cxl_arena_init(&self.arena, self.st.base,
                           h.arena_offset + <size_t>rank * h.arena_nbytes, h.arena_nbytes,
                           self.fd, self.file_offset, cxl_no_space, ARENA_WHAT)
        cdef uint64_t *line = seq_ptr(&self.st, rank)
        (<int64_t *>line)[1] = getpid()
        line[HOST_WORD] = host_id
        line[ATTACHED_WORD] = 1
        cxl_store_release(line, 0)
        cxl_flush_meta(line, CTRL_NBYTES, 0)

    def unlink(self):
        """Remove the segment's name; the mappings stay valid."""
        if not self.unlinked:
            shm_unlink(self.name.encode())
            self.unlinked = True

    def close(self):
        """No more collectives: unmap the segment (and unlink it if this rank
        still owns the name), then give a claimed partition back - once the
        last pool-resident array of this rank is gone, too."""
        self.closing = True
        if self.live == 0:
            self._finish_close()

    cdef _finish_close(self):
        self._unmap()
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
        cdef uint64_t *line
        if self.pid == this_pid and not self.detached and self.st.base != NULL \
                and self.st.size > 0:
            line = seq_ptr(&self.st, self.st.rank)
            line[ATTACHED_WORD] = 0
            cxl_flush_meta(line, CTRL_NBYTES, 0)
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

    cdef _give_back(self, size_t off):
        """Return a block to the arena (a no-op in a forked child)."""
        cxl_arena_free(&self.arena, off)

    def arena_free(self):
        """Free bytes in this rank's arena."""
        return cxl_arena_free_bytes(&self.arena)

    def arena_nbytes(self):
        """Bytes of each rank's arena (0: no pool-resident arrays)."""
        if self.st.base == NULL:
            return 0
        return (<header_t *>self.st.base).arena_nbytes

    def offset_of(self, uintptr_t address, size_t nbytes):
        """Offset in the pool of [address, address + nbytes) when it lies in
        the arenas (any rank's), else -1."""
        cdef uint64_t at = resident(&self.st, <const char *>address, nbytes, self.nbytes)
        return <int64_t>at - 1

    def view(self, size_t offset, size_t nbytes):
        """A read-only PoolBuffer on `nbytes` at `offset` of the arenas (a
        peer's array: Bcast_view); it keeps the mapping alive."""
        self._check()
        if offset < self.st.arena_offset or offset + nbytes > self.nbytes \
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
        return [cxl_load_acquire(seq_ptr(&self.st, q)) for q in range(self.st.size)]

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

    cdef size_t _chunk(self, size_t itemsize, bint rsag):
        """Bytes one rank publishes per step: whole elements that fit a half
        (with room for the 1/p result slice in the reduce-scatter case)."""
        cdef size_t cap = self.st.half_nbytes
        if rsag:
            cap = cap * self.st.size // (self.st.size + 1) - itemsize
        cdef size_t chunk = self.chunk_nbytes if self.chunk_nbytes < cap else cap
        chunk -= chunk % itemsize
        return chunk if chunk >= itemsize else itemsize

    cdef _raise(self, int rc, str what):
        raise PoolFailure(rc, self.st.failed_rank, what)

    cdef _expect(self, str what, int root, int op, int tcode, uint64_t nbytes,
                 uint64_t pairs):
        """The signature of the call about to start (published with its
        first step, compared by every rank: see check_signatures)."""
        self.st.ops += 1
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
        [(what, root, op, tcode, nbytes)] (root/op/tcode -1 when none)."""
        self._check()
        out = []
        cdef uint64_t *line
        cdef uint64_t a
        for q in range(self.st.size):
            line = seq_ptr(&self.st, q)
            if self.st.sw:
                cxl_flush(line + 8, CTRL_NBYTES // 2, 1)
            a = sig_word(line, 0, self.st.step)
            out.append((KIND_NAMES.get(a >> 48, f"call {a >> 48:#x}"),
                        <int>(a & 0xFFFF) - 1, <int>((a >> 24) & 0xFF) - 1,
                        <int>((a >> 16) & 0xFF) - 1, sig_word(line, 1, self.st.step)))
        return out

    def barrier(self):
        """All ranks of the pool meet (no data)."""
        self._check()
        cdef int rc
        self._expect("Barrier", -1, -1, -1, 0, 0)
        with nogil:
            rc = alg_barrier(&self.st)
        if rc != OK:
            self._raise(rc, "Barrier")

    def bcast(self, uintptr_t address, size_t nbytes, int root):
        """Broadcast `nbytes` at `address` (this rank's buffer) from `root`."""
        self._check()
        cdef size_t chunk = self._chunk(1, False)
        cdef int rc = OK
        cdef uint64_t sends[MAX_ZC_RANKS]
        cdef uint64_t recvs[MAX_ZC_RANKS]
        cdef bint zc = self._zerocopy(nbytes), push = False
        cdef uint64_t mine = 0, theirs = 0
        cdef int q
        self._expect("Bcast", root, -1, -1, nbytes, 0)
        if zc and self.st.rank == root:
            mine = resident(&self.st, <const char *>address, nbytes, self.nbytes)
        elif zc:
            theirs = resident(&self.st, <const char *>address, nbytes, self.nbytes)
        with nogil:
            if zc:
                rc = publish_offsets(&self.st, mine, theirs, sends, recvs)
                zc = rc == OK and all_fit(sends + root, 1, nbytes, self.nbytes)
                if rc == OK and not zc:
                    # every receiver's buffer in the pool: the root writes
                    # straight into them (one copy each instead of two)
                    push = True
                    for q in range(self.st.size):
                        if q != root and not all_fit(recvs + q, 1, nbytes, self.nbytes):
                            push = False
            if rc == OK and zc:
                rc = alg_bcast_zc(&self.st, <char *>address, nbytes, root, sends[root])
            elif rc == OK and push:
                rc = alg_bcast_push(&self.st, <char *>address, nbytes, root, recvs)
            elif rc == OK:
                rc = alg_bcast(&self.st, <char *>address, nbytes, root, chunk)
        if rc != OK:
            self._raise(rc, "Bcast")

    def reduce(self, uintptr_t sendaddr, uintptr_t recvaddr, size_t count,
               size_t itemsize, int op, int tcode, int root):
        """Reduce `count` elements to `root` (every rank when root < 0).
        `sendaddr` may equal `recvaddr` (in place); `recvaddr` is ignored on
        non-root ranks of a rooted reduce."""
        self._check()
        cdef cxl_reduce_fn fn = reducer(op, tcode)
        # Two ranks move the same bytes across cores either way, and the
        # everyone-reduces-all algorithm takes one step per chunk instead of
        # two: reduce-scatter + allgather pays from three ranks on.
        cdef bint rsag = (self.st.size >= self.rsag_min_ranks
                          and count >= <size_t>self.st.size
                          and count * itemsize >= self.rsag_min_nbytes)
        cdef size_t chunk = self._chunk(itemsize, rsag)
        cdef int rc = OK, q
        cdef size_t nbytes = count * itemsize
        cdef uint64_t sends[MAX_ZC_RANKS]
        cdef uint64_t recvs[MAX_ZC_RANKS]
        cdef bint zc = self._zerocopy(nbytes), all_recv = False
        cdef bint any_res = False
        cdef uint64_t send1 = 0, recv1 = 0
        cdef const char *res[MAX_ZC_RANKS]
        self._expect("Allreduce" if root < 0 else "Reduce", root, op, tcode, nbytes, 0)
        if zc:
            send1 = resident(&self.st, <const char *>sendaddr, nbytes, self.nbytes)
            if root < 0 or root == self.st.rank:
                recv1 = resident(&self.st, <const char *>recvaddr, nbytes, self.nbytes)
        with nogil:
            if zc:
                rc = publish_offsets(&self.st, send1, recv1, sends, recvs)
                zc = rc == OK and all_fit(sends, self.st.size, nbytes, self.nbytes)
                if zc:
                    all_recv = all_fit(recvs, self.st.size, nbytes, self.nbytes) \
                        if root < 0 else all_fit(recvs + root, 1, nbytes, self.nbytes)
                    for q in range(self.st.size):  # no rank folds over its own input
                        if not all_recv and recvs[q] == sends[q]:
                            zc = False
                if rc == OK and not zc:
                    # Some send buffers in the pool: those ranks skip copying
                    # in and are read in place (never one whose result
                    # overwrites its input: in place).
                    for q in range(self.st.size):
                        res[q] = NULL
                        if all_fit(sends + q, 1, nbytes, self.nbytes) \
                                and sends[q] != recvs[q]:
                            res[q] = self.st.base + sends[q] - 1
                            any_res = True
            if rc != OK:
                pass
            elif zc:
                rc = alg_reduce_zc(&self.st, sends, recvs, <char *>recvaddr, count,
                                   itemsize, fn, root, all_recv)
            else:
                self.st.res = res if any_res else NULL
                if rsag:
                    rc = alg_reduce_rsag(&self.st, <const char *>sendaddr,
                                         <char *>recvaddr, count, itemsize, fn, root, chunk)
                else:
                    rc = alg_reduce_small(&self.st, <const char *>sendaddr,
                                          <char *>recvaddr, count, itemsize, fn, root,
                                          self.st.size, chunk)
                self.st.res = NULL
                if rc == OK and any_res:
                    rc = step_all(&self.st)  # completion: peers are done reading
        if rc != OK:
            self._raise(rc, "Allreduce" if root < 0 else "Reduce")

    cdef bint _zerocopy(self, size_t nbytes):
        """Whether a collective of `nbytes` first asks where every rank's
        buffers live (the same answer on every rank: the pool has arenas,
        and the size is past zerocopy_min_nbytes)."""
        return (self.st.arena_offset < self.nbytes and nbytes >= self.zerocopy_min_nbytes
                and self.st.size <= MAX_ZC_RANKS)

    cdef bint _zerocopy_tables(self, size_t nbytes):
        """`_zerocopy`, and room in a half for the three tables of p words
        the personalized collectives publish."""
        return self._zerocopy(nbytes) and <size_t>self.st.size * 24 <= self.st.half_nbytes

    def _sub(self, size_t itemsize):
        """Bytes of a per-destination sub-slot (whole elements, 64-aligned)."""
        cdef size_t sub = self.st.half_nbytes // self.st.size
        cdef size_t chunk = self.chunk_nbytes
        if chunk < sub:
            sub = chunk
        sub -= sub % 64
        sub -= sub % itemsize
        return sub if sub >= itemsize else itemsize

    def agree(self, uint64_t value, str what="header step", int root=-1,
              uint64_t pairs=0):
        """A header step of collective `what`: every rank publishes `value`;
        returns the maximum, or 0 when any rank published 0 ("not through
        the pool").  `pairs`: this rank's share of the block checksum
        (pair_hash), checked when no rank published 0."""
        self._check()
        cdef uint64_t agreed = 0
        cdef int rc
        self._expect(what + " header", root, -1, -1, 0, 0)
        with nogil:
            rc = agree_max(&self.st, value, pairs, &agreed)
        if rc != OK:
            self._raise(rc, what)
        return agreed

    def gather(self, uintptr_t sendaddr, size_t send_nbytes, recv_addrs,
               recv_nbytes, int root, size_t max_nbytes, str what, uint64_t pairs=0):
        """Allgather(v) (root < 0) and Gather(v).  `recv_addrs`/`recv_nbytes`:
        where each rank's block goes (ignored off the root of a Gather);
        `max_nbytes`: the largest block of any rank (the same everywhere);
        `pairs`: this rank's share of the block checksum (pair_hash)."""
        self._check()
        self._expect(what, root, -1, -1, max_nbytes, pairs)
        cdef _Arrays recv = _Arrays(recv_addrs, recv_nbytes)
        cdef size_t chunk = self._chunk(1, False)
        cdef size_t nsteps = (max_nbytes + chunk - 1) // chunk
        cdef int rc = OK, p = self.st.size
        cdef bint zc = self._zerocopy_tables(max_nbytes * p), done = False
        cdef bint reader = root < 0 or root == self.st.rank
        # As a personalized exchange: the same block for every rank; off the
        # root of a Gather nothing is received.
        cdef _Arrays send = _Arrays([sendaddr] * p, [send_nbytes] * p) if zc else None
        cdef _Arrays into = recv if reader or not zc else _Arrays([0] * p, [0] * p)
        with nogil:
            if zc:
                rc = exchange_in_place(&self.st, <const char **>send.addr, send.nbytes,
                                       into.addr, into.nbytes, self.nbytes, &done)
            if rc == OK and not done:
                rc = alg_gather(&self.st, <const char *>sendaddr, send_nbytes,
                                recv.addr, recv.nbytes, root, nsteps, chunk)
        if rc != OK:
            self._raise(rc, what)

    def exchange(self, send_addrs, send_nbytes, recv_addrs, recv_nbytes,
                 size_t max_nbytes, str what, int root=-1, uint64_t pairs=0):
        """Alltoall(v) and Scatter(v) (from `root`): `send_*[d]` goes to
        rank d, `recv_*[q]` comes from rank q; `max_nbytes`: the largest
        block between any two ranks (the same everywhere); `pairs`: this
        rank's share of the block checksum (pair_hash)."""
        self._check()
        self._expect(what, root, -1, -1, max_nbytes, pairs)
        cdef _Arrays send = _Arrays(send_addrs, send_nbytes)
        cdef _Arrays recv = _Arrays(recv_addrs, recv_nbytes)
        cdef size_t sub = self._sub(1)
        cdef size_t nsteps = (max_nbytes + sub - 1) // sub
        cdef int rc = OK
        cdef bint zc = self._zerocopy_tables(max_nbytes * self.st.size), done = False
        with nogil:
            if zc:
                rc = exchange_in_place(&self.st, <const char **>send.addr, send.nbytes,
                                       recv.addr, recv.nbytes, self.nbytes, &done)
            if rc == OK and not done:
                rc = alg_exchange(&self.st, <const char **>send.addr, send.nbytes,
                                  recv.addr, recv.nbytes, nsteps, sub)
        if rc != OK:
            self._raise(rc, what)

    def reduce_scatter(self, send_addrs, counts, uintptr_t recvaddr,
                       size_t itemsize, int op, int tcode, bint inplace, str what):
        """Reduce_scatter(_block): `send_addrs[d]` is where this rank's piece
        for rank d starts, `counts[d]` its elements (the same on every rank);
        `inplace`: the pieces are in the receive buffer, whose start gets the
        result."""
        self._check()
        cdef cxl_reduce_fn fn = reducer(op, tcode)
        cdef _Arrays send = _Arrays(send_addrs, counts)
        # every rank passes the same counts: their hash must agree
        self._expect(what, -1, op, tcode, counts_hash(send.nbytes, self.st.size) ^ itemsize, 0)
        cdef size_t sub_count = self._sub(itemsize) // itemsize
        cdef size_t nsteps = 0, q
        cdef size_t total = 0
        for q in range(self.st.size):
            nsteps = max(nsteps, (send.nbytes[q] + sub_count - 1) // sub_count)
            total += send.nbytes[q] * itemsize
        cdef int rc = OK
        # In place the result overwrites the start of the send buffer, which
        # rank 0 may still be reading: the copying path then.
        cdef bint zc = self._zerocopy_tables(total) and not inplace
        cdef bint all_resident = False, push = False
        cdef _Arrays blocks = _Arrays(send_addrs, [c * itemsize for c in counts]) \
            if zc else None
        cdef _Arrays nothing = _Arrays([0] * self.st.size, [0] * self.st.size) \
            if zc else None
        with nogil:
            if zc:
                rc = publish_block_offsets(&self.st, <const char **>blocks.addr,
                                           blocks.nbytes, nothing.addr, nothing.nbytes,
                                           self.nbytes, &all_resident, &push)
            if rc == OK and zc and all_resident:
                rc = alg_reduce_scatter_zc(&self.st, fn, <char *>recvaddr,
                                           send.nbytes[self.st.rank], itemsize, self.nbytes)
            elif rc == OK:
                rc = alg_reduce_scatter(&self.st, <const char **>send.addr, send.nbytes,
                                        <char *>recvaddr, itemsize, fn, nsteps, sub_count,
                                        inplace)
        if rc != OK:
            self._raise(rc, what)

    def scan(self, uintptr_t sendaddr, uintptr_t recvaddr, size_t count,
             size_t itemsize, int op, int tcode, bint exclusive):
        """Scan (inclusive) or Exscan of `count` elements: rank r folds the
        contributions of ranks 0 .. r (0 .. r-1)."""
        self._check()
        cdef cxl_reduce_fn fn = reducer(op, tcode)
        cdef size_t chunk = self._chunk(itemsize, False)
        cdef int nranks = self.st.rank if exclusive else self.st.rank + 1
        cdef int rc
        self._expect("Exscan" if exclusive else "Scan", -1, op, tcode, count * itemsize, 0)
        with nogil:
            rc = alg_reduce_small(&self.st, <const char *>sendaddr, <char *>recvaddr,
                                  count, itemsize, fn, -1, nranks, chunk)
        if rc != OK:
            self._raise(rc, "Exscan" if exclusive else "Scan")


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
        self.pool.live -= 1
        if self.pool.closing and self.pool.live == 0:
            self.pool._finish_close()


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


class PoolFailure(Exception):
    """A pool algorithm stopped: a peer never arrived or is gone (`rank`),
    the ranks' calls do not match (`mismatch`; rank -1: their blocks), or
    a peer sent the call to MPI, where every rank must follow (`passed`)."""

    def __init__(self, code, rank, what):
        super().__init__(code, rank, what)
        self.code = code
        self.timed_out = code == ERR_TIMEOUT
        self.mismatch = code == ERR_MISMATCH
        self.passed = code == ERR_PASSED
        self.rank = rank
        self.what = what

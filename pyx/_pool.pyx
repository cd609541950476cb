# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The pool: one shared-memory segment per pool group, its layout, and the
collective algorithms that run inside it without the GIL.

The layout of a segment (header, one control line per rank, two data halves
per rank, the arenas) is declared once, in pyx/cxl_layout.h.  The module is
one extension made of one file per concern, each a layer on the one before::

    codes.pxi           the numbers shared with Python and cxlmpi._shim
                        (collectives, variant flags, path codes, size
                        classes; declared in pyx/cxl_codes.h)
    pool/layout.pxi     the layout as this rank sees it; status and kernel codes
    pool/machine.pxi    CPU features, cache flushes (and their emulation), NUMA
                        binding, host identity
    pool/liveness.pxi   peers' locks (liveness without a clock), the partition's
                        token (whose memory it is)
    pool/protocol.pxi   steps, waits (with MPI progress), call signatures,
                        header steps
    pool/signatures.pxi what signs a call (kind codes, block checksums) and
                        whether the ranks' calls match (after a first step)
    pool/sizing.pxi     what each family's choice reads: bytes a step, a
                        sub-slot, whether a call asks where buffers live
    pool/fold.pxi       rank-order folds shared by every reduction
    pool/bcast.pxi      Barrier and Bcast algorithms
    pool/reduce.pxi     Reduce, Allreduce and scan algorithms
    pool/gather.pxi     Gather(v) and Allgather(v)
    pool/exchange.pxi   Alltoall(v), Scatter(v), Reduce_scatter(_block)
    pool/reserve.pxi    reserving pool memory (a data half only on first use),
                        and what a shortage of it becomes
    pool/segment.pxi    the segment's life: create, attach, map a partition,
                        publish, close, detach, unlink, after fork
    pool/arenas.pxi     pool-resident memory: arenas, the shared node heap,
                        offsets, PoolBuffer
    pool/pool.pxi       the blocking collectives: one entry per collective,
                        tunables, progress hooks, signatures, inspection
    pool/worker.pxi     the Pool class: the nonblocking collectives, posted
                        (Op) to a worker thread per pool that runs them in order

Each family file ends in one nogil run_<family> (run_barrier, run_bcast,
run_reduce, run_scan, run_gather, run_exchange, run_reduce_scatter) that
makes every choice of algorithm from the call's arguments, the pool's
tunables and the variant flags (V_*) cxlmpi.select passes: a test pins any
algorithm with those flags alone.  A Pool method only checks, signs and
marshals its call, then runs one run_<family> without the GIL.

Cython wants a cdef class's methods in one class body, so Pool is a chain of
classes, one concern each: _Segment (every field, and the segment's life),
_Arenas(_Segment) (pool-resident memory), Pool(_Arenas) (the collectives).
Each file then reads as one class and its fields stay declared once;
module-level functions taking the Pool would have doubled every signature.

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
from libc.stdlib cimport calloc, malloc, free
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
import sys
import zlib

cdef extern from "cxl_kernels.h" nogil:
    ctypedef void (*cxl_reduce_fn)(void *dst, const void *a, const void *b, size_t n)
    ctypedef struct cxl_waiter:
        uint64_t polls
        uint64_t spin_polls
        double deadline_s
        double next_check_s
        long sleep_ns
        int yielding
        double yield_end_s
    uint64_t cxl_load_acquire(const uint64_t *p)
    void cxl_store_release(uint64_t *p, uint64_t v)
    uint32_t cxl_load32(const uint32_t *p)
    void cxl_store32(uint32_t *p, uint32_t v)
    void cxl_flush(const void *addr, size_t n, int invalidate)
    uint64_t cxl_flush_meta(const void *addr, size_t n, int invalidate)
    void cxl_copy(void *dst, const void *src, size_t n)
    void cxl_copy_out(void *dst, const void *src, size_t n)
    void cxl_waiter_init(cxl_waiter *w, double timeout_s, int spin)
    int cxl_backoff(cxl_waiter *w)
    int cxl_spun(cxl_waiter *w)
    uint32_t cxl_this_cpu()
    int cxl_hand_over(cxl_waiter *w)
    void cxl_fence()
    int cxl_futex_sleep(cxl_waiter *w, const uint64_t *seq, uint64_t seen)
    void cxl_futex_wake(const uint64_t *seq)
    long cxl_sleep_first_ns
    long cxl_sleep_max_ns
    uint64_t cxl_futex_sleeps
    uint64_t cxl_futex_timeouts
    uint64_t cxl_futex_wakes
    uint64_t cxl_backoff_rounds
    uint64_t cxl_hand_overs
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
        double idle_s
    int cxl_progress_poke(cxl_progress *p)
    int cxl_progress_due(uint64_t polls, uint64_t spin_polls)
    uint64_t cxl_flushed_lines
    int cxl_flush_available()
    int cxl_has_clflushopt()
    int cxl_has_clwb()
    int cxl_has_avx2()
    int cxl_has_avx512f()

cdef extern from "cxl_beat.h" nogil:
    int cxl_beat_add(uint64_t *word, int flush, const uint64_t *owner, uint64_t token)
    void cxl_beat_remove(const uint64_t *word)
    void cxl_beat_remove_range(const void *base, size_t nbytes)
    void cxl_beat_set_period(uint64_t ns)
    uint64_t cxl_beat_period_ns
    uint64_t cxl_beat_rounds
    int cxl_beat_expired(double since_s, double now_s, uint64_t period_ns, uint64_t beats)

cdef extern from "cxl_emulate.h" nogil:
    void cxl_emu_configure(uint64_t seed, int fault)
    char *cxl_emu_attach(char *s, size_t nbytes, size_t load_nbytes, size_t data_offset)
    char *cxl_emu_detach(char *p)
    int cxl_emu_nregions
    uint64_t cxl_emu_writebacks
    uint64_t cxl_emu_invalidates
    uint64_t cxl_emu_evictions
    uint64_t cxl_emu_dropped
    int CXL_EMU_FAULT_NONE
    int CXL_EMU_FAULT_SKIP_FLUSH
    int CXL_EMU_FAULT_SKIP_INVALIDATE


include "codes.pxi"
include "pool/layout.pxi"
include "pool/machine.pxi"
include "pool/liveness.pxi"
include "pool/protocol.pxi"
include "pool/signatures.pxi"
include "pool/sizing.pxi"
include "pool/fold.pxi"
include "pool/bcast.pxi"
include "pool/reduce.pxi"
include "pool/gather.pxi"
include "pool/exchange.pxi"
include "pool/reserve.pxi"
include "pool/segment.pxi"
include "pool/arenas.pxi"
include "pool/pool.pxi"
include "pool/worker.pxi"

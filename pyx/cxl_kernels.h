/* cxl_kernels.h -- the lowest layer of cxlmpi: flag loads and stores with
 * acquire/release ordering, cache-line flushes for software coherence, the
 * wait policy, copies and the reduction kernels.
 *
 * Everything here is plain C11 used from Cython; nothing here knows about MPI.
 * One body per reduction is instantiated per (op, dtype) by the macros below,
 * never a hand-copied loop per type.
 */
#ifndef CXL_KERNELS_H
#define CXL_KERNELS_H

#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include <stdio.h>
#include <complex.h>
#include <sched.h>
#include <time.h>
#include <errno.h>
#include <signal.h>
#include <limits.h>
#include <unistd.h>
#include <sys/types.h>
#include <sys/syscall.h>
#include <linux/futex.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <cpuid.h>
#define CXL_X86 1
#else
#define CXL_X86 0
#endif

#define CXL_LINE 64

#include "cxl_emulate.h"

/* ---------------------------------------------------------------- flags */

static inline uint64_t cxl_load_acquire(const volatile uint64_t *p)
{
    return __atomic_load_n((const uint64_t *)p, __ATOMIC_ACQUIRE);
}

static inline void cxl_store_release(volatile uint64_t *p, uint64_t v)
{
    __atomic_store_n((uint64_t *)p, v, __ATOMIC_RELEASE);
}

/* The same for 32-bit words (a control line's asleep and cpu). */
static inline uint32_t cxl_load32(const volatile uint32_t *p)
{
    return __atomic_load_n((const uint32_t *)p, __ATOMIC_ACQUIRE);
}

static inline void cxl_store32(volatile uint32_t *p, uint32_t v)
{
    __atomic_store_n((uint32_t *)p, v, __ATOMIC_RELEASE);
}

static inline void cxl_cpu_relax(void)
{
#if CXL_X86
    _mm_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#endif
}

/* ------------------------------------------------- software coherence */

#if CXL_X86
/* Set once at start-up from CPUID: 2 = clwb, 1 = clflushopt, 0 = clflush. */
static int cxl_flush_kind = -1;
#endif
/* Lines the software-coherence protocol flushed or invalidated in this
 * process (cxl_flush; cxlmpi.stats()["coherence"]["flushed_lines"]).  The
 * flushes every mode makes of metadata -- a pool's header and control lines
 * at set-up and detach, the partition table -- go through cxl_flush_meta
 * and are not counted: in hw mode the figure stays 0. */
static uint64_t cxl_flushed_lines = 0;

static inline int cxl_cpu_has(int leaf7_ebx_bit)
{
#if CXL_X86
    unsigned int a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return 0;
    return (b >> leaf7_ebx_bit) & 1u;
#else
    (void)leaf7_ebx_bit;
    return 0;
#endif
}
static inline int cxl_has_clflushopt(void) { return cxl_cpu_has(23); }
static inline int cxl_has_clwb(void) { return cxl_cpu_has(24); }
static inline int cxl_has_avx2(void) { return cxl_cpu_has(5); }
static inline int cxl_has_avx512f(void) { return cxl_cpu_has(16); }

#if CXL_X86
__attribute__((target("clflushopt")))
static void cxl_clflushopt_range(const char *p, const char *end)
{
    for (; p < end; p += CXL_LINE) _mm_clflushopt((void *)p);
}
__attribute__((target("clwb")))
static void cxl_clwb_range(const char *p, const char *end)
{
    for (; p < end; p += CXL_LINE) _mm_clwb((void *)p);
}
#endif

/* Whether this CPU can write back / invalidate lines from user space:
 * x86-64 (clwb, clflushopt, clflush) and aarch64 (DC CVAC, DC CIVAC). */
static inline int cxl_flush_available(void)
{
#if CXL_X86 || defined(__aarch64__)
    return 1;
#else
    return 0;
#endif
}

/* Write back (and, for invalidate, drop) every line of [addr, addr+n);
 * returns the number of lines.  invalidate=1 is what a reader does before
 * loading data another host wrote. */
static inline uint64_t cxl_flush_meta(const void *addr, size_t n, int invalidate)
{
    if (n == 0) return 0;
    int64_t emulated = cxl_emu_flush(addr, n, invalidate);
    if (emulated >= 0) return (uint64_t)emulated;
#if CXL_X86
    if (n == 0) return 0;
    const char *p = (const char *)((uintptr_t)addr & ~(uintptr_t)(CXL_LINE - 1));
    const char *end = (const char *)addr + n;
    uint64_t lines = (uint64_t)((end - p + CXL_LINE - 1) / CXL_LINE);
    if (cxl_flush_kind < 0)
        cxl_flush_kind = cxl_has_clwb() ? 2 : cxl_has_clflushopt() ? 1 : 0;
    /* A full fence on either side, as Linux's clflush_cache_range: the
     * stores before it are in the lines before they are written back
     * (clflushopt and clwb are ordered only by fences), and the write-backs
     * are done before the release store that publishes them, the
     * invalidations before the loads that follow (loads may pass an
     * sfence). */
    _mm_mfence();
    if (cxl_flush_kind == 2 && !invalidate) cxl_clwb_range(p, end);
    else if (cxl_flush_kind >= 1) cxl_clflushopt_range(p, end);
    else for (; p < end; p += CXL_LINE) _mm_clflush(p);
    _mm_mfence();
    return lines;
#elif defined(__aarch64__)
    if (n == 0) return 0;
    uint64_t ctr;
    __asm__ __volatile__("mrs %0, ctr_el0" : "=r"(ctr));
    size_t line = (size_t)4 << ((ctr >> 16) & 0xF);   /* smallest D-cache line */
    const char *p = (const char *)((uintptr_t)addr & ~(uintptr_t)(line - 1));
    const char *end = (const char *)addr + n;
    uint64_t lines = (uint64_t)((end - p + line - 1) / line);
    __asm__ __volatile__("dsb ish" ::: "memory");   /* stores before it, first */
    if (invalidate)
        for (; p < end; p += line) __asm__ __volatile__("dc civac, %0" :: "r"(p) : "memory");
    else
        for (; p < end; p += line) __asm__ __volatile__("dc cvac, %0" :: "r"(p) : "memory");
    __asm__ __volatile__("dsb ish" ::: "memory");
    return lines;
#else
    (void)addr; (void)n; (void)invalidate;  /* sw coherence refused at set-up */
    return 0;
#endif
}

/* The same, for the software-coherence protocol: counted in
 * cxl_flushed_lines. */
static inline void cxl_flush(const void *addr, size_t n, int invalidate)
{
    cxl_flushed_lines += cxl_flush_meta(addr, n, invalidate);
}

/* ------------------------------------------------------------- waiting */

static inline double cxl_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Is process `pid` gone (exited, or a zombie nobody has reaped yet)?  Only
 * meaningful for peers on this host; called every 10 ms at most. */
static inline int cxl_pid_gone(int64_t pid)
{
    char path[64], buf[512];
    if (pid <= 0) return 0;
    if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) return 1;
    snprintf(path, sizeof path, "/proc/%lld/stat", (long long)pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *close_paren = strrchr(buf, ')');  /* comm may hold spaces */
    if (!close_paren || close_paren[1] != ' ') return 0;
    return close_paren[2] == 'Z' || close_paren[2] == 'X';
}

/* Wait policy.  A waiter first spins (pause, then re-poll): the cheapest
 * wait when the rank it waits for runs on another CPU and arrives soon.
 * When that rank last waited on the waiter's own CPU, it is likely queued
 * behind the waiter: spinning would keep it off the very core it needs, so
 * the waiter yields the CPU to it instead (cxl_hand_over), as it does with
 * more ranks than cores.  Then it gets out of the way: on one host it
 * sleeps in the kernel on the awaited word itself (cxl_futex_sleep: a
 * futex on the peer's seq, which the peer wakes when it publishes -- see
 * publish/wait_all in pool/protocol.pxi for how no wake-up is lost);
 * elsewhere (ranks on other hosts, software coherence) it backs off:
 * sched_yield, then short sleeps (cxl_backoff).  Sleeps are bounded, so
 * the waiter still keeps MPI progressing and checks its deadline and its
 * peers' liveness. */
typedef struct {
    uint64_t polls;
    uint64_t spin_polls; /* polls with only a pause before getting out of the way */
    double deadline_s;   /* absolute monotonic time; <= 0: none */
    double next_check_s; /* next time to look at the clock / liveness */
    long sleep_ns;       /* bound of the next futex sleep */
    int yielding;        /* hands the CPU over (yields) before it sleeps ... */
    double yield_end_s;  /* ... until then (0: not yet begun) */
} cxl_waiter;

/* Spinning pays when every rank has a core of its own (cxlmpi.pools.group
 * decides `spin`): ~40 us of pause-polls (4096 x ~10 ns on a recent x86),
 * about what sleeping and being woken costs (~30 us in a VM), so a wait
 * never costs much more than twice the better of the two.  With more ranks
 * than cores the ranks sharing a CPU take turns: a waiter yields (the rank
 * queued behind it runs at once, no wake-up to pay) for up to
 * CXL_HAND_OVER_S, about a scheduler slice, before it sleeps; so does a
 * spinning waiter whose peer last waited on its CPU. */
#define CXL_SPIN_POLLS 4096u
#define CXL_HAND_OVER_S 0.001
#define CXL_YIELD_POLLS 65536u
/* Futex sleeps start short (MPI progress soon after a wait begins) and
 * double up to a bound (MPI progress, the deadline and liveness are looked
 * at after each sleep).  Tests set both to an hour: a lost wake-up then
 * hangs the job. */
static long cxl_sleep_first_ns = 50000L;   /* 50 us */
static long cxl_sleep_max_ns = 1000000L;   /* 1 ms */

/* Process-wide counters of the wait policy (cxlmpi._pool.wait_counts). */
static uint64_t cxl_futex_sleeps = 0;    /* FUTEX_WAITs made */
static uint64_t cxl_futex_timeouts = 0;  /* ... that ended by their bound */
static uint64_t cxl_futex_wakes = 0;     /* FUTEX_WAKEs made (a peer was asleep) */
static uint64_t cxl_backoff_rounds = 0;  /* yields and naps (no futex) */
static uint64_t cxl_hand_overs = 0;      /* yields to the ranks sharing the CPU */

static inline void cxl_waiter_init(cxl_waiter *w, double timeout_s, int spin)
{
    w->polls = 0;
    w->spin_polls = spin ? CXL_SPIN_POLLS : 0;
    w->deadline_s = timeout_s > 0 ? cxl_now_s() + timeout_s : 0.0;
    w->next_check_s = 0.0;
    w->sleep_ns = cxl_sleep_first_ns;
    w->yielding = !spin;
    w->yield_end_s = 0.0;
}

/* A full fence: a store before it is visible to every CPU before any load
 * after it is made (store-load order, which acquire/release do not give). */
static inline void cxl_fence(void)
{
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

/* Whether the waiter has spun long enough; counts the poll and pauses
 * while it has not. */
static inline int cxl_spun(cxl_waiter *w)
{
    w->polls++;
    if (w->polls < w->spin_polls) { cxl_cpu_relax(); return 0; }
    return 1;
}

/* Time to check the deadline and peer liveness (about every 10 ms)? */
static inline int cxl_check_due(cxl_waiter *w)
{
    double now = cxl_now_s();
    if (now < w->next_check_s) return 0;
    w->next_check_s = now + 0.01;
    return 1;
}

/* One round of backing off (no futex); returns 1 when it is time to check
 * the deadline and peer liveness (about every 10 ms once past spinning). */
static inline int cxl_backoff(cxl_waiter *w)
{
    if (!cxl_spun(w)) return 0;
    cxl_backoff_rounds++;
    if (w->polls < CXL_YIELD_POLLS) sched_yield();
    else {
        struct timespec ts = {0, 20000}; /* 20 us */
        nanosleep(&ts, NULL);
    }
    if ((w->polls & 63u) != 0) return 0;
    return cxl_check_due(w);
}

int sched_getcpu(void);   /* <sched.h> declares it only with _GNU_SOURCE */

/* 1 + the CPU this thread runs on now (0: unknown). */
static inline uint32_t cxl_this_cpu(void)
{
    int cpu = sched_getcpu();
    return cpu < 0 ? 0u : (uint32_t)cpu + 1u;
}

/* One yield of the CPU to the ranks queued on it (w->yielding ends after
 * CXL_HAND_OVER_S of them); returns 1 when it is time to check the
 * deadline and peer liveness. */
static inline int cxl_hand_over(cxl_waiter *w)
{
    w->polls++;
    cxl_hand_overs++;
    if (w->yield_end_s == 0.0) w->yield_end_s = cxl_now_s() + CXL_HAND_OVER_S;
    sched_yield();
    double now = cxl_now_s();
    if (now >= w->yield_end_s) w->yielding = 0;
    if (now < w->next_check_s) return 0;
    w->next_check_s = now + 0.01;
    return 1;
}

/* The futex word of a 64-bit sequence number: its low 32 bits. */
static inline uint32_t *cxl_futex_word(const volatile uint64_t *seq)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    return (uint32_t *)seq + 1;
#else
    return (uint32_t *)seq;
#endif
}

/* Sleep until *seq no longer holds `seen` (a FUTEX_WAKE on it), or the
 * bound passes.  Not the private futex: the word lies in a MAP_SHARED
 * mapping of another process.  Returns 1 when it is time to check the
 * deadline and liveness, 0 when not, -1 when this mapping cannot take a
 * futex (the caller backs off instead). */
static inline int cxl_futex_sleep(cxl_waiter *w, const volatile uint64_t *seq, uint64_t seen)
{
    struct timespec ts = {w->sleep_ns / 1000000000L, w->sleep_ns % 1000000000L};
    w->polls++;
    cxl_futex_sleeps++;
    long rc = syscall(SYS_futex, cxl_futex_word(seq), FUTEX_WAIT, (uint32_t)seen, &ts,
                      NULL, 0);
    if (rc != 0) {
        if (errno == ETIMEDOUT) {
            cxl_futex_timeouts++;
            w->sleep_ns = w->sleep_ns * 2 < cxl_sleep_max_ns ? w->sleep_ns * 2
                                                             : cxl_sleep_max_ns;
        } else if (errno != EAGAIN && errno != EINTR) {
            return -1;      /* ENOSYS, EFAULT, EINVAL: no futex here */
        }
    }
    return cxl_check_due(w);
}

/* Wake every process asleep on *seq (cxl_futex_sleep). */
static inline void cxl_futex_wake(const volatile uint64_t *seq)
{
    cxl_futex_wakes++;
    syscall(SYS_futex, cxl_futex_word(seq), FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* ------------------------------------------------------- MPI progress
 * A rank waiting in the pool must keep MPI progressing: a peer may be
 * waiting on it in MPI (passive-target RMA, a rendezvous send it posted a
 * receive for, a pending nonblocking collective).  cxlmpi links no MPI
 * library, so the waiter calls MPI_Iprobe through a pointer found at run
 * time, on a communicator nothing is ever sent to: it never matches, and
 * every MPI library runs its progress engine when a probe finds nothing.
 * The handle is an int (MPICH ABI) or a pointer (Open MPI ABI). */
typedef struct {
    void *iprobe;       /* MPI_Iprobe, or NULL: no progress calls */
    intptr_t comm;      /* the probed communicator's handle */
    int any_source;
    int any_tag;
    int comm_is_int;    /* sizeof(MPI_Comm) == sizeof(int) */
    uint64_t calls;     /* progress calls made (stats) */
    double idle_s;      /* the quickest call so far: an idle engine's cost */
} cxl_progress;

/* A progress call found work when it took this much longer than twice an
 * idle one: it moved data (an accumulate's or a rendezvous message's
 * packets, tens of microseconds a MiB) where an idle engine returns in
 * well under a microsecond. */
#define CXL_PROGRESS_WORK_S 1e-6

/* Call MPI progress once; returns 1 when the engine had work to do. */
static inline int cxl_progress_poke(cxl_progress *p)
{
    int flag = 0;
    uint64_t status[32];  /* larger than any MPI_Status */
    double t0, dt;
    if (p->iprobe == NULL) return 0;
    p->calls++;
    t0 = cxl_now_s();
    if (p->comm_is_int)
        ((int (*)(int, int, int, int *, void *))p->iprobe)(
            p->any_source, p->any_tag, (int)p->comm, &flag, status);
    else
        ((int (*)(int, int, void *, int *, void *))p->iprobe)(
            p->any_source, p->any_tag, (void *)p->comm, &flag, status);
    dt = cxl_now_s() - t0;
    if (p->idle_s <= 0.0 || dt < p->idle_s) p->idle_s = dt;
    return dt > 2.0 * p->idle_s + CXL_PROGRESS_WORK_S;
}

/* Whether a waiter that has polled `polls` times calls MPI progress now:
 * every 256 polls while it spins (a few microseconds; a short wait never
 * pays for it), every 8th poll once it yields the core (and before every
 * futex sleep: see wait_all, where a call that found work turns the sleep
 * into yielding for another CXL_HAND_OVER_S). */
static inline int cxl_progress_due(uint64_t polls, uint64_t spin_polls)
{
    return polls < spin_polls ? (polls & 255u) == 255u : (polls & 7u) == 7u;
}

/* --------------------------------------------------------------- copies */

static inline void cxl_copy(void *dst, const void *src, size_t n)
{
    if (n && dst != src) memcpy(dst, src, n);
}

/* Copy into shared memory so that the data is in memory, not in this CPU's
 * cache, when the function returns (software coherence: what a writer
 * publishes to hosts that do not snoop its cache).  x86-64: non-temporal
 * stores for the aligned middle (no second pass over the data to write it
 * back), ordinary stores written back for the partial lines at either end,
 * then a fence.  Elsewhere: copy, then write back. */
static inline void cxl_copy_out(void *dst, const void *src, size_t n)
{
    if (n == 0) return;
    if (cxl_emu_covers(dst)) {
        /* emulated memory: streaming stores would bypass the image that
         * stands for this process's caches */
        memcpy(dst, src, n);
        cxl_flush(dst, n, 0);
        return;
    }
#if CXL_X86 && defined(__SSE2__)
    char *d = (char *)dst;
    const char *s = (const char *)src;
    size_t head = (CXL_LINE - ((uintptr_t)d & (CXL_LINE - 1))) & (CXL_LINE - 1);
    if (head > n) head = n;
    if (head) {
        memcpy(d, s, head);
        cxl_flush(d, head, 0);
    }
    d += head; s += head; n -= head;
    size_t body = n & ~(size_t)(CXL_LINE - 1);
    for (size_t i = 0; i < body; i += CXL_LINE) {
        __m128i a = _mm_loadu_si128((const __m128i *)(s + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(s + i + 48));
        _mm_stream_si128((__m128i *)(d + i), a);
        _mm_stream_si128((__m128i *)(d + i + 16), b);
        _mm_stream_si128((__m128i *)(d + i + 32), c);
        _mm_stream_si128((__m128i *)(d + i + 48), e);
    }
    if (n > body) {
        memcpy(d + body, s + body, n - body);
        cxl_flush(d + body, n - body, 0);
    }
    _mm_sfence();
#else
    memcpy(dst, src, n);
    cxl_flush(dst, n, 0);
#endif
}

/* --------------------------------------------------- reduction kernels
 * Type codes (cxlmpi._pool.TYPE_CODES names them).  BYTE is an opaque byte: only the
 * bitwise ops are defined on it, as MPI says for MPI_BYTE. */
enum {
    CXL_I8, CXL_I16, CXL_I32, CXL_I64,
    CXL_U8, CXL_U16, CXL_U32, CXL_U64,
    CXL_F32, CXL_F64, CXL_C64, CXL_C128,
    CXL_BOOL, CXL_BYTE, CXL_NTYPES
};
/* Op codes (cxlmpi._pool.OP_CODES names them). */
enum {
    CXL_SUM, CXL_PROD, CXL_MAX, CXL_MIN,
    CXL_LAND, CXL_LOR, CXL_LXOR, CXL_BAND, CXL_BOR, CXL_BXOR, CXL_NOPS
};

/* dst[i] = a[i] OP b[i]  (dst may equal a: "accumulate" form). */
typedef void (*cxl_reduce_fn)(void *dst, const void *a, const void *b, size_t n);

#define CXL_OP_SUM(x, y) ((x) + (y))
#define CXL_OP_PROD(x, y) ((x) * (y))
#define CXL_OP_MAX(x, y) ((x) > (y) ? (x) : (y))
#define CXL_OP_MIN(x, y) ((x) < (y) ? (x) : (y))
#define CXL_OP_LAND(x, y) ((x) && (y))
#define CXL_OP_LOR(x, y) ((x) || (y))
#define CXL_OP_LXOR(x, y) ((!(x)) != (!(y)))
#define CXL_OP_BAND(x, y) ((x) & (y))
#define CXL_OP_BOR(x, y) ((x) | (y))
#define CXL_OP_BXOR(x, y) ((x) ^ (y))

/* The one loop body.  `dst` may alias `a` or `b` element for element (the
 * same index), which is well defined: each element is read before it is
 * written.  No restrict: the compiler checks for overlap and vectorizes. */
#define CXL_DEF_REDUCE(OPN, TN, T)                                           \
    static void cxl_reduce_##OPN##_##TN(void *dst_, const void *a_,          \
                                        const void *b_, size_t n)            \
    {                                                                        \
        T *dst = (T *)dst_;                                                  \
        const T *a = (const T *)a_;                                          \
        const T *b = (const T *)b_;                                 \
        for (size_t i = 0; i < n; i++) dst[i] = (T)CXL_OP_##OPN(a[i], b[i]); \
    }

#define CXL_FOR_INTS(M, OPN)                                                  \
    M(OPN, i8, int8_t) M(OPN, i16, int16_t) M(OPN, i32, int32_t)              \
    M(OPN, i64, int64_t) M(OPN, u8, uint8_t) M(OPN, u16, uint16_t)            \
    M(OPN, u32, uint32_t) M(OPN, u64, uint64_t)
#define CXL_FOR_REALS(M, OPN) M(OPN, f32, float) M(OPN, f64, double)
#define CXL_FOR_COMPLEX(M, OPN) \
    M(OPN, c64, float _Complex) M(OPN, c128, double _Complex)

/* Which (op, type) pairs MPI defines: sum/prod on numbers, max/min on
 * integers and reals, logical ops on integers and bool, bitwise ops on
 * integers and bytes. */
CXL_FOR_INTS(CXL_DEF_REDUCE, SUM) CXL_FOR_REALS(CXL_DEF_REDUCE, SUM) CXL_FOR_COMPLEX(CXL_DEF_REDUCE, SUM)
CXL_FOR_INTS(CXL_DEF_REDUCE, PROD) CXL_FOR_REALS(CXL_DEF_REDUCE, PROD) CXL_FOR_COMPLEX(CXL_DEF_REDUCE, PROD)
CXL_FOR_INTS(CXL_DEF_REDUCE, MAX) CXL_FOR_REALS(CXL_DEF_REDUCE, MAX)
CXL_FOR_INTS(CXL_DEF_REDUCE, MIN) CXL_FOR_REALS(CXL_DEF_REDUCE, MIN)
CXL_FOR_INTS(CXL_DEF_REDUCE, LAND) CXL_DEF_REDUCE(LAND, bool, _Bool)
CXL_FOR_INTS(CXL_DEF_REDUCE, LOR) CXL_DEF_REDUCE(LOR, bool, _Bool)
CXL_FOR_INTS(CXL_DEF_REDUCE, LXOR) CXL_DEF_REDUCE(LXOR, bool, _Bool)
CXL_FOR_INTS(CXL_DEF_REDUCE, BAND) CXL_DEF_REDUCE(BAND, byte, uint8_t)
CXL_FOR_INTS(CXL_DEF_REDUCE, BOR) CXL_DEF_REDUCE(BOR, byte, uint8_t)
CXL_FOR_INTS(CXL_DEF_REDUCE, BXOR) CXL_DEF_REDUCE(BXOR, byte, uint8_t)

#define CXL_INT_ENTRIES(OPN)                                          \
    [CXL_I8] = cxl_reduce_##OPN##_i8, [CXL_I16] = cxl_reduce_##OPN##_i16, \
    [CXL_I32] = cxl_reduce_##OPN##_i32, [CXL_I64] = cxl_reduce_##OPN##_i64, \
    [CXL_U8] = cxl_reduce_##OPN##_u8, [CXL_U16] = cxl_reduce_##OPN##_u16, \
    [CXL_U32] = cxl_reduce_##OPN##_u32, [CXL_U64] = cxl_reduce_##OPN##_u64
#define CXL_REAL_ENTRIES(OPN) \
    [CXL_F32] = cxl_reduce_##OPN##_f32, [CXL_F64] = cxl_reduce_##OPN##_f64
#define CXL_COMPLEX_ENTRIES(OPN) \
    [CXL_C64] = cxl_reduce_##OPN##_c64, [CXL_C128] = cxl_reduce_##OPN##_c128

/* NULL entry = the op is not defined for the type: the dispatcher passes the
 * call through so that MPI itself reports the error. */
static const cxl_reduce_fn cxl_reduce_table[CXL_NOPS][CXL_NTYPES] = {
    [CXL_SUM] = {CXL_INT_ENTRIES(SUM), CXL_REAL_ENTRIES(SUM), CXL_COMPLEX_ENTRIES(SUM)},
    [CXL_PROD] = {CXL_INT_ENTRIES(PROD), CXL_REAL_ENTRIES(PROD), CXL_COMPLEX_ENTRIES(PROD)},
    [CXL_MAX] = {CXL_INT_ENTRIES(MAX), CXL_REAL_ENTRIES(MAX)},
    [CXL_MIN] = {CXL_INT_ENTRIES(MIN), CXL_REAL_ENTRIES(MIN)},
    [CXL_LAND] = {CXL_INT_ENTRIES(LAND), [CXL_BOOL] = cxl_reduce_LAND_bool},
    [CXL_LOR] = {CXL_INT_ENTRIES(LOR), [CXL_BOOL] = cxl_reduce_LOR_bool},
    [CXL_LXOR] = {CXL_INT_ENTRIES(LXOR), [CXL_BOOL] = cxl_reduce_LXOR_bool},
    [CXL_BAND] = {CXL_INT_ENTRIES(BAND), [CXL_BYTE] = cxl_reduce_BAND_byte},
    [CXL_BOR] = {CXL_INT_ENTRIES(BOR), [CXL_BYTE] = cxl_reduce_BOR_byte},
    [CXL_BXOR] = {CXL_INT_ENTRIES(BXOR), [CXL_BYTE] = cxl_reduce_BXOR_byte},
};

static inline cxl_reduce_fn cxl_reducer(int op, int type)
{
    if (op < 0 || op >= CXL_NOPS || type < 0 || type >= CXL_NTYPES) return NULL;
    return cxl_reduce_table[op][type];
}

#endif /* CXL_KERNELS_H */

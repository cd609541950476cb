/* cxl_emulate.h -- memory that behaves like caches without coherence
 * (CXLMPI_COHERENCE=emulate), so that the software-coherence protocol is
 * tested on one host: a missing flush or invalidate there changes nothing
 * on coherent memory, and here it loses data.
 *
 * Each emulated pool is seen by this process through three mappings of the
 * same size:
 *
 *   P  a private anonymous mapping: what this process's "caches" hold.  It
 *      is the address user code and the kernels use (st.base, pool arrays).
 *   S  the real shared mapping: memory, what the other processes see.
 *   C  a private clean copy: what P's lines held when last loaded from S
 *      (or written back to it).  A line whose P differs from C is dirty.
 *
 * cxl_flush(addr, n, 0) writes back every dirty 64-byte line of the range
 * (P -> S, P -> C; see cxl_emu_stale); cxl_flush(addr, n, 1) writes back the dirty lines and
 * reloads every line of the range (S -> P, S -> C).  Whole lines, as a
 * cache writes them back: two processes that write parts of one line
 * clobber each other's bytes, as on real hardware.  At every flush (a hook
 * point, before the flush's own lines), with probability
 * 1/CXL_EMU_EVICT_ONE_IN, a dirty line of a range flushed lately is
 * evicted: written back (seeded by CXLMPI_EMULATE_SEED), as a cache evicts
 * lines whenever it likes.
 *
 * A line is written back in 8-byte words from its last to its first with
 * release stores, and reloaded from its first to its last with acquire
 * loads: a reader that sees a line's first word (a control line's seq) new
 * sees the rest of that write-back too -- a line moves as a whole, as on
 * hardware.
 *
 * Only P's header, control lines and data halves are loaded from S when a
 * pool is mapped (the arenas start as zero pages: their contents are
 * undefined until written, and a reader invalidates before it reads).
 *
 * Fault hooks (CXLMPI_EMULATE_FAULT) make the tests show that the emulator
 * catches a protocol that forgets a step: skip-flush drops write-backs of
 * data lines (past the control lines), skip-invalidate drops their
 * invalidations.  Control lines are never dropped (nothing would run).
 *
 * Thread-safe: one mutex around every operation (a background thread may
 * flush a word of its control line while the main thread runs a
 * collective).  Only addresses inside an emulated P go through here; every
 * other flush is a real one.
 */
#ifndef CXL_EMULATE_H
#define CXL_EMULATE_H

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include <sys/mman.h>

#define CXL_EMU_LINE 64
#define CXL_EMU_MAX_REGIONS 64
#define CXL_EMU_RECENT 64
#define CXL_EMU_EVICT_ONE_IN 4
#define CXL_EMU_EVICT_PROBES 8

#define CXL_EMU_FAULT_NONE 0
#define CXL_EMU_FAULT_SKIP_FLUSH 1
#define CXL_EMU_FAULT_SKIP_INVALIDATE 2

typedef struct {
    char *p, *s, *c;      /* private image, shared memory, clean copy */
    size_t nbytes;        /* bytes of each mapping (a multiple of the page) */
    size_t data_offset;   /* lines from here on are data (fault hooks apply) */
} cxl_emu_region;

typedef struct {
    const char *addr;
    size_t n;
} cxl_emu_range;

static cxl_emu_region cxl_emu_regions[CXL_EMU_MAX_REGIONS];
static int cxl_emu_nregions = 0;          /* read without the lock: 0 = off */
static pthread_mutex_t cxl_emu_lock = PTHREAD_MUTEX_INITIALIZER;
static int cxl_emu_fault = CXL_EMU_FAULT_NONE;
static uint64_t cxl_emu_rng = 0x9E3779B97F4A7C15ull;
static cxl_emu_range cxl_emu_recent[CXL_EMU_RECENT];
static unsigned cxl_emu_recent_next = 0;
/* Counters (cxlmpi._pool.emulation()). */
static uint64_t cxl_emu_writebacks = 0;   /* dirty lines written back by flushes */
static uint64_t cxl_emu_invalidates = 0;  /* lines reloaded from memory */
static uint64_t cxl_emu_evictions = 0;    /* dirty lines written back at random */
static uint64_t cxl_emu_dropped = 0;      /* lines a fault hook skipped */

static inline uint64_t cxl_emu_next(void)
{
    /* xorshift64* */
    cxl_emu_rng ^= cxl_emu_rng >> 12;
    cxl_emu_rng ^= cxl_emu_rng << 25;
    cxl_emu_rng ^= cxl_emu_rng >> 27;
    return cxl_emu_rng * 0x2545F4914F6CDD1Dull;
}

/* Seed the evictions (the same seed and rank: the same choices). */
static void cxl_emu_configure(uint64_t seed, int fault)
{
    pthread_mutex_lock(&cxl_emu_lock);
    cxl_emu_rng = (seed ^ 0x9E3779B97F4A7C15ull) | 1;
    cxl_emu_fault = fault;
    pthread_mutex_unlock(&cxl_emu_lock);
}

/* The region holding [addr, addr + 1), or NULL; with the lock held. */
static inline cxl_emu_region *cxl_emu_find(const void *addr)
{
    const char *a = (const char *)addr;
    for (int i = 0; i < cxl_emu_nregions; i++) {
        cxl_emu_region *r = &cxl_emu_regions[i];
        if (a >= r->p && a < r->p + r->nbytes) return r;
    }
    return NULL;
}

static inline int cxl_emu_dirty(const cxl_emu_region *r, size_t off)
{
    return memcmp(r->p + off, r->c + off, CXL_EMU_LINE) != 0;
}

/* Whether memory no longer holds what P does.  A write-back (flush
 * without invalidate) writes back such a line even when P equals C: the
 * process may have stored the very bytes its stale clean copy held (a
 * store makes a line dirty whatever it writes, which comparing P with C
 * cannot see).  A process writes back only lines it owns or just stored
 * to, so a line it merely holds stale is never written back this way. */
static inline int cxl_emu_stale(const cxl_emu_region *r, size_t off)
{
    return memcmp(r->p + off, r->s + off, CXL_EMU_LINE) != 0;
}

/* P -> S (last word first, release), P -> C. */
static inline void cxl_emu_store_line(cxl_emu_region *r, size_t off)
{
    const uint64_t *from = (const uint64_t *)(r->p + off);
    uint64_t *to = (uint64_t *)(r->s + off);
    uint64_t words[CXL_EMU_LINE / 8];
    memcpy(words, from, CXL_EMU_LINE);
    for (int k = CXL_EMU_LINE / 8 - 1; k >= 0; k--)
        __atomic_store_n(&to[k], words[k], __ATOMIC_RELEASE);
    memcpy(r->c + off, words, CXL_EMU_LINE);
}

/* S -> P (first word first, acquire), S -> C. */
static inline void cxl_emu_load_line(cxl_emu_region *r, size_t off)
{
    const uint64_t *from = (const uint64_t *)(r->s + off);
    uint64_t words[CXL_EMU_LINE / 8];
    for (int k = 0; k < CXL_EMU_LINE / 8; k++)
        words[k] = __atomic_load_n(&from[k], __ATOMIC_ACQUIRE);
    memcpy(r->p + off, words, CXL_EMU_LINE);
    memcpy(r->c + off, words, CXL_EMU_LINE);
}

/* Now and then, a dirty line of a range flushed lately (one of a few
 * random lines probed: lines written again since their last flush -- a
 * buffer NumPy code rewrites between calls, a half -- are the dirty
 * ones) is written back. */
static inline void cxl_emu_maybe_evict(void)
{
    if (cxl_emu_next() % CXL_EMU_EVICT_ONE_IN != 0) return;
    unsigned n = cxl_emu_recent_next < CXL_EMU_RECENT ? cxl_emu_recent_next : CXL_EMU_RECENT;
    for (int probe = 0; n && probe < CXL_EMU_EVICT_PROBES; probe++) {
        cxl_emu_range *range = &cxl_emu_recent[cxl_emu_next() % n];
        const char *a = range->addr + (range->n ? cxl_emu_next() % range->n : 0);
        cxl_emu_region *r = cxl_emu_find(a);
        if (r == NULL) continue;     /* unmapped since */
        size_t off = (size_t)(a - r->p) & ~(size_t)(CXL_EMU_LINE - 1);
        if (cxl_emu_dirty(r, off)) {
            cxl_emu_store_line(r, off);
            cxl_emu_evictions++;
            return;
        }
    }
}

/* Emulate a flush of [addr, addr + n) when it lies in an emulated pool:
 * returns the number of lines, or -1 when the address is not emulated
 * (the caller flushes for real). */
static int64_t cxl_emu_flush(const void *addr, size_t n, int invalidate)
{
    if (__atomic_load_n(&cxl_emu_nregions, __ATOMIC_ACQUIRE) == 0) return -1;
    pthread_mutex_lock(&cxl_emu_lock);
    cxl_emu_region *r = cxl_emu_find(addr);
    if (r == NULL) {
        pthread_mutex_unlock(&cxl_emu_lock);
        return -1;
    }
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    cxl_emu_maybe_evict();   /* before this flush cleans its own lines */
    size_t start = (size_t)((const char *)addr - r->p) & ~(size_t)(CXL_EMU_LINE - 1);
    size_t end = (size_t)((const char *)addr - r->p) + n;
    if (end > r->nbytes) end = r->nbytes;
    int64_t lines = 0;
    for (size_t off = start; off < end; off += CXL_EMU_LINE) {
        lines++;
        if (off >= r->data_offset
            && ((invalidate && cxl_emu_fault == CXL_EMU_FAULT_SKIP_INVALIDATE)
                || (!invalidate && cxl_emu_fault == CXL_EMU_FAULT_SKIP_FLUSH))) {
            cxl_emu_dropped++;
            continue;
        }
        if (cxl_emu_dirty(r, off) || (!invalidate && cxl_emu_stale(r, off))) {
            cxl_emu_store_line(r, off);
            cxl_emu_writebacks++;
        }
        if (invalidate) {
            cxl_emu_load_line(r, off);
            cxl_emu_invalidates++;
        }
    }
    if (n) {
        cxl_emu_recent[cxl_emu_recent_next % CXL_EMU_RECENT] =
            (cxl_emu_range){(const char *)addr, end > start ? end - start : 0};
        cxl_emu_recent_next++;
        if (cxl_emu_recent_next >= 2 * CXL_EMU_RECENT) cxl_emu_recent_next -= CXL_EMU_RECENT;
    }
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&cxl_emu_lock);
    return lines;
}

/* Whether [addr, addr + 1) lies in an emulated pool. */
static int cxl_emu_covers(const void *addr)
{
    if (__atomic_load_n(&cxl_emu_nregions, __ATOMIC_ACQUIRE) == 0) return 0;
    pthread_mutex_lock(&cxl_emu_lock);
    int found = cxl_emu_find(addr) != NULL;
    pthread_mutex_unlock(&cxl_emu_lock);
    return found;
}

/* Emulate the shared mapping `s` of `nbytes`: returns P (what this process
 * uses from now on), or NULL (errno set).  P and C get S's first
 * `load_nbytes` (header, control lines, halves); `data_offset`: where data
 * lines start (the fault hooks spare the control lines before it). */
static char *cxl_emu_attach(char *s, size_t nbytes, size_t load_nbytes, size_t data_offset)
{
    char *p = (char *)mmap(NULL, nbytes, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return NULL;
    char *c = (char *)mmap(NULL, nbytes, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (c == MAP_FAILED) {
        munmap(p, nbytes);
        return NULL;
    }
    pthread_mutex_lock(&cxl_emu_lock);
    if (cxl_emu_nregions == CXL_EMU_MAX_REGIONS) {
        pthread_mutex_unlock(&cxl_emu_lock);
        munmap(p, nbytes);
        munmap(c, nbytes);
        errno = ENOMEM;
        return NULL;
    }
    if (load_nbytes > nbytes) load_nbytes = nbytes;
    cxl_emu_region *r = &cxl_emu_regions[cxl_emu_nregions];
    r->p = p;
    r->s = s;
    r->c = c;
    r->nbytes = nbytes;
    r->data_offset = data_offset;
    for (size_t off = 0; off < load_nbytes; off += CXL_EMU_LINE)
        cxl_emu_load_line(r, off);
    __atomic_store_n(&cxl_emu_nregions, cxl_emu_nregions + 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&cxl_emu_lock);
    return p;
}

/* Stop emulating the region whose P starts at `p`: unmap P and C (what
 * they still hold dirty is lost; the pool writes back its control line
 * before it unmaps).  Returns S, or NULL when `p` is not emulated. */
static char *cxl_emu_detach(char *p)
{
    pthread_mutex_lock(&cxl_emu_lock);
    cxl_emu_region *r = cxl_emu_find(p);
    if (r == NULL || r->p != p) {
        pthread_mutex_unlock(&cxl_emu_lock);
        return NULL;
    }
    char *s = r->s;
    munmap(r->p, r->nbytes);
    munmap(r->c, r->nbytes);
    *r = cxl_emu_regions[cxl_emu_nregions - 1];
    __atomic_store_n(&cxl_emu_nregions, cxl_emu_nregions - 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&cxl_emu_lock);
    return s;
}

#endif /* CXL_EMULATE_H */

/* cxl_alloc.h - a thread-safe first-fit allocator over one range of pool
 * memory (a rank's arena of the node heap: cxlmpi.empty & co., and the
 * NumPy allocation handler, NEP 49, also here, which allocates from the
 * same arena).
 *
 * Safe against re-entry and threads: the allocator runs no Python code and
 * keeps its own mutex (NumPy may call the handler without the GIL, and a
 * garbage collection may free a pool array while another is allocated).
 * Its bookkeeping - free extents and live blocks, each a sorted array of
 * (offset, size) - lives in private (malloc'd) memory, never in the pool:
 * a free writes nothing there, and a block's memory is touched only by its
 * user.  Offsets are from `base`; data is 64-byte aligned (4 KiB from
 * 64 KiB).  Neighbouring free extents merge.
 *
 * Pool memory is reserved before it is handed out: on tmpfs (/dev/shm)
 * pages are only allocated at first touch, so a full filesystem would kill
 * the process with SIGBUS there.  A block beyond the reserved prefix of the
 * arena is first fallocate()d in the backing file; when that fails the
 * allocation fails (CXL_ALLOC_NOSPACE, `notice` called once) and so does
 * every later one that needs more, and the caller uses private memory.
 *
 * Fork: the arena belongs to the process that made it.  In a child made by
 * fork() it hands nothing out and frees are no-ops (the child shares the
 * pool memory with its parent; the parent goes on allocating from it).
 */
#ifndef CXL_ALLOC_H
#define CXL_ALLOC_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/vfs.h>
#include <unistd.h>

#define CXL_ALLOC_OK 0
#define CXL_ALLOC_FULL 1        /* no free extent is large enough */
#define CXL_ALLOC_NOSPACE 2     /* the backing file cannot hold more */
#define CXL_ALLOC_NOT_OWNER 3   /* a forked child, or the arena was retired */
#define CXL_ALLOC_REVOKED 4     /* the memory was handed to another job */

typedef void (*cxl_notice_fn)(const char *what, size_t nbytes);

typedef struct {
    size_t off, size;
} cxl_extent;

typedef struct {
    cxl_extent *v;
    size_t n, cap;
} cxl_extents;

typedef struct {
    char *base;                 /* offsets are from here */
    size_t lo, nbytes;          /* the arena: [lo, lo + nbytes) */
    cxl_extents free_list;      /* free extents, by offset */
    cxl_extents live;           /* live blocks, by offset */
    size_t live_bytes;
    pthread_mutex_t lock;
    int64_t pid;                /* the owner: other processes never touch it */
    int retired;                /* the process is exiting: hand nothing out */
    int fd;                     /* backing file (-1: nothing to reserve) */
    int64_t fd_offset;          /* file offset of `base` */
    size_t reserved;            /* [lo, reserved) is known to be backed */
    int no_space;               /* a reservation failed: reserve no more */
    int wipe;                   /* the memory may hold an earlier job's data
                                 * (a partition of a shared file or device):
                                 * zero each block when first reserved */
    cxl_notice_fn notice;       /* told (once per failure kind) about no_space */
    const char *what;           /* what the arena holds, for the notice */
    int (*revoked)(void *);     /* whether the memory is another job's now (a
                                 * partition reclaimed while this process
                                 * stood still past its lease); NULL: never */
    void *revoked_ctx;
} cxl_arena;

static int cxl_extents_insert(cxl_extents *x, size_t at, size_t off, size_t size)
{
    if (x->n == x->cap) {
        size_t cap = x->cap ? 2 * x->cap : 16;
        cxl_extent *v = (cxl_extent *)realloc(x->v, cap * sizeof(cxl_extent));
        if (!v) return -1;
        x->v = v;
        x->cap = cap;
    }
    memmove(x->v + at + 1, x->v + at, (x->n - at) * sizeof(cxl_extent));
    x->v[at].off = off;
    x->v[at].size = size;
    x->n += 1;
    return 0;
}

static void cxl_extents_remove(cxl_extents *x, size_t at)
{
    memmove(x->v + at, x->v + at + 1, (x->n - at - 1) * sizeof(cxl_extent));
    x->n -= 1;
}

/* First index whose offset is >= off. */
static size_t cxl_extents_find(const cxl_extents *x, size_t off)
{
    size_t a = 0, b = x->n;
    while (a < b) {
        size_t m = (a + b) / 2;
        if (x->v[m].off < off) a = m + 1; else b = m;
    }
    return a;
}

static void cxl_arena_init(cxl_arena *a, char *base, size_t lo, size_t nbytes, int fd,
                           int64_t fd_offset, cxl_notice_fn notice, const char *what)
{
    memset(a, 0, sizeof(*a));
    a->base = base;
    a->lo = lo;
    a->nbytes = nbytes;
    a->pid = getpid();
    a->fd = fd;
    a->fd_offset = fd_offset;
    a->reserved = lo;
    a->notice = notice;
    a->what = what;
    pthread_mutex_init(&a->lock, NULL);
    if (nbytes) cxl_extents_insert(&a->free_list, 0, lo, nbytes);
}

static void cxl_arena_destroy(cxl_arena *a)
{
    if (a->pid == getpid()) pthread_mutex_destroy(&a->lock);
    free(a->free_list.v);
    free(a->live.v);
    memset(a, 0, sizeof(*a));
}

static inline int cxl_arena_mine(const cxl_arena *a)
{
    return !__atomic_load_n(&a->retired, __ATOMIC_ACQUIRE) && a->pid == getpid();
}

static inline int cxl_arena_owns(const cxl_arena *a, const void *p)
{
    const char *c = (const char *)p;
    return a->nbytes && c >= a->base + a->lo && c < a->base + a->lo + a->nbytes;
}

/* fallocate(fd, 0, offset, nbytes) (retried on EINTR), refused at once
 * (-1, errno ENOSPC) where it cannot succeed on a tmpfs: there fallocate
 * allocates and zeroes page after page until the filesystem is full, and
 * only then gives them back -- long, and meanwhile every other process
 * writing to /dev/shm gets ENOSPC or SIGBUS.  Refused when the free blocks
 * cannot hold the range's holes (pages already there need none).  A
 * tmpfs reports pages fallocated but not yet written as holes too, so a
 * range is reserved by one process only (ready_step: the pool's rank 0),
 * never checked again by another.  Counted in cxl_reserve_refused (per
 * extension). */
#define CXL_TMPFS_MAGIC 0x01021994
static uint64_t cxl_reserve_refused = 0;

static int cxl_no_room(int fd, off_t offset, off_t nbytes)
{
    struct statfs fs;
    if (fstatfs(fd, &fs) != 0 || fs.f_type != CXL_TMPFS_MAGIC || fs.f_blocks == 0)
        return 0;               /* not a tmpfs, or one without a size limit */
    uint64_t avail = (uint64_t)fs.f_bavail * (uint64_t)fs.f_bsize;
    if (avail >= (uint64_t)nbytes) return 0;
    uint64_t holes = 0;
    off_t at = offset, end = offset + nbytes;
    while (at < end) {
        off_t hole = lseek(fd, at, SEEK_HOLE);
        if (hole < 0) return 0;  /* cannot tell: fallocate decides */
        if (hole >= end) break;
        off_t data = lseek(fd, hole, SEEK_DATA);
        if (data < 0 || data > end) data = end;   /* (ENXIO: a hole to the end) */
        holes += (uint64_t)(data - hole);
        at = data;
    }
    if (holes <= avail) return 0;
    __atomic_add_fetch(&cxl_reserve_refused, 1, __ATOMIC_RELAXED);
    return 1;
}

static int cxl_fallocate(int fd, off_t offset, off_t nbytes)
{
    if (cxl_no_room(fd, offset, nbytes)) {
        errno = ENOSPC;
        return -1;
    }
    int rc;
    do {
        rc = fallocate(fd, 0, offset, nbytes);
    } while (rc != 0 && errno == EINTR);
    return rc;
}

/* Back [off, end) with memory of the file (under the lock), and zero it
 * if the arena wipes.  0: done (or nothing to do: no file, or one that
 * allocates no pages, like devdax).  Only [max(off, reserved), end) is
 * touched: the new block's own memory. */
static int cxl_arena_reserve(cxl_arena *a, size_t off, size_t end)
{
    if (end <= a->reserved || (a->fd < 0 && !a->wipe)) return 0;
    if (a->no_space) return -1;
    size_t from = off <= a->reserved ? a->reserved : off;
    if (a->fd >= 0) {
        if (cxl_fallocate(a->fd, (off_t)(a->fd_offset + (int64_t)from),
                          (off_t)(end - from)) != 0) {
            if (errno == EOPNOTSUPP || errno == ENODEV || errno == ENOSYS
                    || errno == ESPIPE) {
                a->fd = -1;         /* memory that needs no reserving */
            } else {
                a->no_space = 1;
                return -1;
            }
        }
    }
    if (a->wipe) memset(a->base + from, 0, end - from);
    if (off <= a->reserved) a->reserved = end;
    return 0;
}

/* A block of at least `size` bytes: *offset, or a CXL_ALLOC_* code.  With
 * `reserve` 0 the block's memory is not reserved (a region the caller
 * reserves piecewise itself). */
static int cxl_arena_alloc(cxl_arena *a, size_t size, int reserve, size_t *offset)
{
    if (!cxl_arena_mine(a)) return CXL_ALLOC_NOT_OWNER;
    /* (a block of another job's memory: its wipe or its reservation would
     * write there, and so would the caller) */
    if (a->revoked && a->revoked(a->revoked_ctx)) return CXL_ALLOC_REVOKED;
    size_t align = size >= 65536 ? 4096 : 64;
    if (size == 0) size = 1;
    if (size > a->nbytes) return CXL_ALLOC_FULL;
    size_t need = (size + align - 1) & ~(align - 1);
    int rc = CXL_ALLOC_FULL;
    pthread_mutex_lock(&a->lock);
    for (size_t i = 0; i < a->free_list.n; i++) {
        cxl_extent e = a->free_list.v[i];
        size_t start = (e.off + align - 1) & ~(align - 1);
        if (start - e.off + need > e.size) continue;
        if (reserve && cxl_arena_reserve(a, start, start + need) != 0) {
            rc = CXL_ALLOC_NOSPACE;
            break;
        }
        size_t at = cxl_extents_find(&a->live, start);
        if (cxl_extents_insert(&a->live, at, start, need) != 0) break;
        size_t tail = e.off + e.size - (start + need);
        if (start > e.off) {                    /* keep the padding free */
            a->free_list.v[i].size = start - e.off;
            if (tail && cxl_extents_insert(&a->free_list, i + 1, start + need, tail) != 0) {
                a->free_list.v[i].size = e.size;
                cxl_extents_remove(&a->live, at);
                break;
            }
        } else if (tail) {
            a->free_list.v[i].off = start + need;
            a->free_list.v[i].size = tail;
        } else {
            cxl_extents_remove(&a->free_list, i);
        }
        a->live_bytes += need;
        *offset = start;
        rc = CXL_ALLOC_OK;
        break;
    }
    pthread_mutex_unlock(&a->lock);
    if (rc == CXL_ALLOC_NOSPACE && a->notice) a->notice(a->what, need);
    return rc;
}

/* Bytes of the live block at `off` (0: none there). */
static size_t cxl_arena_block(cxl_arena *a, size_t off, int locked)
{
    size_t n = 0;
    if (locked) pthread_mutex_lock(&a->lock);
    size_t at = cxl_extents_find(&a->live, off);
    if (at < a->live.n && a->live.v[at].off == off) n = a->live.v[at].size;
    if (locked) pthread_mutex_unlock(&a->lock);
    return n;
}

/* Give the block at `off` back (a no-op outside the owner process). */
static void cxl_arena_free(cxl_arena *a, size_t off)
{
    if (!cxl_arena_mine(a)) return;
    pthread_mutex_lock(&a->lock);
    size_t at = cxl_extents_find(&a->live, off);
    if (at < a->live.n && a->live.v[at].off == off) {
        size_t size = a->live.v[at].size;
        cxl_extents_remove(&a->live, at);
        a->live_bytes -= size;
        cxl_extents *f = &a->free_list;
        size_t i = cxl_extents_find(f, off);
        int down = i > 0 && f->v[i - 1].off + f->v[i - 1].size == off;
        int up = i < f->n && off + size == f->v[i].off;
        if (down && up) {
            f->v[i - 1].size += size + f->v[i].size;
            cxl_extents_remove(f, i);
        } else if (down) {
            f->v[i - 1].size += size;
        } else if (up) {
            f->v[i].off = off;
            f->v[i].size += size;
        } else {
            cxl_extents_insert(f, i, off, size);    /* no memory: the block leaks */
        }
    }
    pthread_mutex_unlock(&a->lock);
}

static size_t cxl_arena_free_bytes(cxl_arena *a)
{
    size_t n = 0;
    int mine = cxl_arena_mine(a);
    if (mine) pthread_mutex_lock(&a->lock);
    for (size_t i = 0; i < a->free_list.n; i++) n += a->free_list.v[i].size;
    if (mine) pthread_mutex_unlock(&a->lock);
    return n;
}

static size_t cxl_arena_live_blocks(cxl_arena *a)
{
    return a->live.n;
}

/* ------------------------------------------------- the NumPy handler
 * Arrays of at least `threshold` bytes come from the arena (when it has
 * room and may hand memory out); everything else, and whatever the arena
 * did not allocate, goes to the handler that was in place before. */

typedef struct {
    void *ctx;
    void *(*malloc)(void *ctx, size_t size);
    void *(*calloc)(void *ctx, size_t nelem, size_t elsize);
    void *(*realloc)(void *ctx, void *ptr, size_t new_size);
    void (*free)(void *ctx, void *ptr, size_t size);
} cxl_np_allocator;   /* the layout of NumPy's PyDataMemAllocator */

typedef struct {
    cxl_arena *arena;     /* the node heap's arena of this rank (a Pool's) */
    size_t threshold;
    cxl_np_allocator fallback;
    size_t pool_allocs;   /* arrays placed in the pool so far */
} cxl_hook;

static void *cxl_hook_pool_alloc(cxl_hook *h, size_t size)
{
    size_t off;
    if (size < h->threshold || cxl_arena_alloc(h->arena, size, 1, &off) != CXL_ALLOC_OK)
        return NULL;
    __atomic_add_fetch(&h->pool_allocs, 1, __ATOMIC_RELAXED);
    return h->arena->base + off;
}

static void *cxl_hook_malloc(void *ctx, size_t size)
{
    cxl_hook *h = (cxl_hook *)ctx;
    void *p = cxl_hook_pool_alloc(h, size);
    return p ? p : h->fallback.malloc(h->fallback.ctx, size);
}

static void *cxl_hook_calloc(void *ctx, size_t nelem, size_t elsize)
{
    cxl_hook *h = (cxl_hook *)ctx;
    size_t size;
    if (__builtin_mul_overflow(nelem, elsize, &size))
        return h->fallback.calloc(h->fallback.ctx, nelem, elsize);
    void *p = cxl_hook_pool_alloc(h, size);
    if (p) {
        memset(p, 0, size);
        return p;
    }
    return h->fallback.calloc(h->fallback.ctx, nelem, elsize);
}

static void cxl_hook_free(void *ctx, void *ptr, size_t size)
{
    cxl_hook *h = (cxl_hook *)ctx;
    if (ptr && cxl_arena_owns(h->arena, ptr))
        cxl_arena_free(h->arena, (size_t)((char *)ptr - h->arena->base));
    else
        h->fallback.free(h->fallback.ctx, ptr, size);
}

static void *cxl_hook_realloc(void *ctx, void *ptr, size_t new_size)
{
    cxl_hook *h = (cxl_hook *)ctx;
    if (!ptr) return cxl_hook_malloc(ctx, new_size);
    if (!cxl_arena_owns(h->arena, ptr))
        return h->fallback.realloc(h->fallback.ctx, ptr, new_size);
    size_t off = (size_t)((char *)ptr - h->arena->base);
    int mine = cxl_arena_mine(h->arena);
    /* a forked child reads its private copy of the table unlocked: a
     * parent's thread may have held the lock at the fork */
    size_t old = cxl_arena_block(h->arena, off, mine);
    if (mine && new_size <= old && new_size >= h->threshold) return ptr;
    void *p = cxl_hook_malloc(ctx, new_size);
    if (!p) return NULL;
    memcpy(p, ptr, old < new_size ? old : new_size);
    cxl_arena_free(h->arena, off);
    return p;
}

#endif

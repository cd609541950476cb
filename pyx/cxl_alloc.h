/* cxl_alloc.h - a thread-safe first-fit allocator over one region of pool
 * memory, and the NumPy allocation handler (NEP 49) built on it.
 *
 * NumPy may call the handler without the GIL, from any thread, so the
 * allocator keeps its own mutex.  Free blocks form an address-ordered list
 * kept inside the free memory itself; every block starts with a 64-byte
 * header (its size), so data stays 64-byte aligned and free/realloc know the
 * size.  Neighbouring free blocks merge on free.
 */
#ifndef CXL_ALLOC_H
#define CXL_ALLOC_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define CXL_ALLOC_HEAD 64

typedef struct cxl_free_block {
    size_t size;                    /* bytes of the block, header included */
    struct cxl_free_block *next;    /* next free block at a higher address */
} cxl_free_block;

typedef struct {
    char *base;
    size_t nbytes;
    cxl_free_block *free_list;
    pthread_mutex_t lock;
    size_t live_blocks;
    size_t live_bytes;
} cxl_arena;

static void cxl_arena_init(cxl_arena *a, char *base, size_t nbytes)
{
    uintptr_t start = ((uintptr_t)base + CXL_ALLOC_HEAD - 1) & ~(uintptr_t)(CXL_ALLOC_HEAD - 1);
    nbytes -= start - (uintptr_t)base;
    nbytes &= ~(size_t)(CXL_ALLOC_HEAD - 1);
    a->base = (char *)start;
    a->nbytes = nbytes;
    a->live_blocks = a->live_bytes = 0;
    pthread_mutex_init(&a->lock, NULL);
    a->free_list = NULL;
    if (nbytes >= 2 * CXL_ALLOC_HEAD) {
        a->free_list = (cxl_free_block *)a->base;
        a->free_list->size = nbytes;
        a->free_list->next = NULL;
    }
}

static inline int cxl_arena_owns(const cxl_arena *a, const void *p)
{
    return (const char *)p >= a->base && (const char *)p < a->base + a->nbytes;
}

/* Bytes usable in the block at data pointer p. */
static inline size_t cxl_arena_usable(const void *p)
{
    return *(const size_t *)((const char *)p - CXL_ALLOC_HEAD) - CXL_ALLOC_HEAD;
}

static void *cxl_arena_alloc(cxl_arena *a, size_t size)
{
    if (size > a->nbytes) return NULL;
    size_t need = (size + 2 * CXL_ALLOC_HEAD - 1) & ~(size_t)(CXL_ALLOC_HEAD - 1);
    void *out = NULL;
    pthread_mutex_lock(&a->lock);
    cxl_free_block **link = &a->free_list;
    for (cxl_free_block *b = a->free_list; b; link = &b->next, b = b->next) {
        if (b->size < need) continue;
        if (b->size - need >= 2 * CXL_ALLOC_HEAD) {     /* split: keep the tail free */
            cxl_free_block *rest = (cxl_free_block *)((char *)b + need);
            rest->size = b->size - need;
            rest->next = b->next;
            *link = rest;
        } else {
            need = b->size;
            *link = b->next;
        }
        *(size_t *)b = need;
        out = (char *)b + CXL_ALLOC_HEAD;
        a->live_blocks += 1;
        a->live_bytes += need;
        break;
    }
    pthread_mutex_unlock(&a->lock);
    return out;
}

static void cxl_arena_free(cxl_arena *a, void *p)
{
    cxl_free_block *blk = (cxl_free_block *)((char *)p - CXL_ALLOC_HEAD);
    size_t size = *(size_t *)blk;
    pthread_mutex_lock(&a->lock);
    a->live_blocks -= 1;
    a->live_bytes -= size;
    cxl_free_block *prev = NULL, *next = a->free_list;
    while (next && next < blk) { prev = next; next = next->next; }
    blk->size = size;
    blk->next = next;
    if (next && (char *)blk + blk->size == (char *)next) {      /* merge up */
        blk->size += next->size;
        blk->next = next->next;
    }
    if (prev && (char *)prev + prev->size == (char *)blk) {     /* merge down */
        prev->size += blk->size;
        prev->next = blk->next;
    } else if (prev) {
        prev->next = blk;
    } else {
        a->free_list = blk;
    }
    pthread_mutex_unlock(&a->lock);
}

static size_t cxl_arena_free_bytes(cxl_arena *a)
{
    size_t n = 0;
    pthread_mutex_lock(&a->lock);
    for (cxl_free_block *b = a->free_list; b; b = b->next) n += b->size;
    pthread_mutex_unlock(&a->lock);
    return n;
}

/* ------------------------------------------------- the NumPy handler
 * Arrays of at least `threshold` bytes come from the arena (when it has
 * room); everything else, and whatever the arena did not allocate, goes to
 * the handler that was in place before. */

typedef struct {
    void *ctx;
    void *(*malloc)(void *ctx, size_t size);
    void *(*calloc)(void *ctx, size_t nelem, size_t elsize);
    void *(*realloc)(void *ctx, void *ptr, size_t new_size);
    void (*free)(void *ctx, void *ptr, size_t size);
} cxl_np_allocator;   /* the layout of NumPy's PyDataMemAllocator */

typedef struct {
    cxl_arena arena;
    size_t threshold;
    cxl_np_allocator fallback;
    size_t pool_allocs;   /* arrays placed in the pool so far */
} cxl_hook;

static void *cxl_hook_malloc(void *ctx, size_t size)
{
    cxl_hook *h = (cxl_hook *)ctx;
    if (size >= h->threshold) {
        void *p = cxl_arena_alloc(&h->arena, size);
        if (p) { __atomic_add_fetch(&h->pool_allocs, 1, __ATOMIC_RELAXED); return p; }
    }
    return h->fallback.malloc(h->fallback.ctx, size);
}

static void *cxl_hook_calloc(void *ctx, size_t nelem, size_t elsize)
{
    cxl_hook *h = (cxl_hook *)ctx;
    size_t size;
    if (__builtin_mul_overflow(nelem, elsize, &size))
        return h->fallback.calloc(h->fallback.ctx, nelem, elsize);
    if (size >= h->threshold) {
        void *p = cxl_arena_alloc(&h->arena, size);
        if (p) {
            memset(p, 0, size);
            __atomic_add_fetch(&h->pool_allocs, 1, __ATOMIC_RELAXED);
            return p;
        }
    }
    return h->fallback.calloc(h->fallback.ctx, nelem, elsize);
}

static void cxl_hook_free(void *ctx, void *ptr, size_t size)
{
    cxl_hook *h = (cxl_hook *)ctx;
    if (ptr && cxl_arena_owns(&h->arena, ptr)) cxl_arena_free(&h->arena, ptr);
    else h->fallback.free(h->fallback.ctx, ptr, size);
}

static void *cxl_hook_realloc(void *ctx, void *ptr, size_t new_size)
{
    cxl_hook *h = (cxl_hook *)ctx;
    if (ptr && cxl_arena_owns(&h->arena, ptr)) {
        size_t old = cxl_arena_usable(ptr);
        if (new_size <= old && new_size >= h->threshold) return ptr;
        void *p = cxl_hook_malloc(ctx, new_size);
        if (!p) return NULL;
        memcpy(p, ptr, old < new_size ? old : new_size);
        cxl_arena_free(&h->arena, ptr);
        return p;
    }
    if (!ptr) return cxl_hook_malloc(ctx, new_size);
    return h->fallback.realloc(h->fallback.ctx, ptr, new_size);
}

#endif

# cython: language_level=3
"""The NumPy allocation hook (NEP 49): arrays of at least a threshold are
placed in pool memory, so that unmodified programs get the zero-copy paths.

`install(arena, threshold)` hands NumPy a handler whose large allocations
come from `arena` -- this rank's arena of the node heap (a cxl_arena inside
a Pool that cxlmpi.alloc keeps for good), the one cxlmpi.empty & co.
allocate from too, so that NumPy's arrays may grow into all of it -- and
whose small ones (and frees of memory it did not allocate) go to the
handler that was in place.  The arena reserves each block in its file
before NumPy gets it; when /dev/shm is full the handler uses NumPy's
allocator instead (the arena tells once per process: cxlmpi._pool).  The
handler's state is never freed: arrays may outlive everything else, up to
interpreter exit.  In a child made by fork() it hands out no pool memory and
frees of the parent's blocks are no-ops; so after the arena is retired (at
exit).
"""

from libc.stdint cimport uintptr_t
from libc.stdlib cimport malloc
from libc.string cimport memcpy, memset, strncpy
from cpython.pycapsule cimport PyCapsule_New, PyCapsule_GetPointer

cimport numpy as cnp

cnp.import_array()

from cxl_alloc cimport cxl_arena, cxl_arena_free_bytes, cxl_arena_live_blocks


cdef extern from "cxl_alloc.h" nogil:
    # the NumPy hook's part of the header (the arena's: cxl_alloc.pxd)
    ctypedef struct cxl_np_allocator:
        void *ctx
    ctypedef struct cxl_hook:
        cxl_arena *arena
        size_t threshold
        cxl_np_allocator fallback
        size_t pool_allocs
    void *cxl_hook_malloc(void *ctx, size_t size)
    void *cxl_hook_calloc(void *ctx, size_t nelem, size_t elsize)
    void *cxl_hook_realloc(void *ctx, void *ptr, size_t new_size)
    void cxl_hook_free(void *ctx, void *ptr, size_t size)

cdef extern from "numpy/arrayobject.h":
    ctypedef struct PyDataMemAllocator:
        void *ctx
        void *(*malloc)(void *ctx, size_t size) noexcept nogil
        void *(*calloc)(void *ctx, size_t nelem, size_t elsize) noexcept nogil
        void *(*realloc)(void *ctx, void *ptr, size_t new_size) noexcept nogil
        void (*free)(void *ctx, void *ptr, size_t size) noexcept nogil
    ctypedef struct PyDataMem_Handler:
        char name[127]
        unsigned char version
        PyDataMemAllocator allocator
    object PyDataMem_SetHandler(object handler)
    object PyDataMem_GetHandler()

cdef cxl_hook *hook = NULL
cdef object hook_capsule = None
cdef object previous = None


def install(uintptr_t arena, size_t threshold):
    """Make NumPy place arrays of `threshold` bytes and more in `arena` (the
    address of a cxl_arena that stays valid for good: Pool.arena_address);
    once per process, later calls only change the threshold."""
    global hook, hook_capsule, previous
    if hook != NULL:
        hook.threshold = threshold
        if PyDataMem_GetHandler() is not hook_capsule:
            PyDataMem_SetHandler(hook_capsule)
        return
    previous = PyDataMem_GetHandler()
    cdef PyDataMem_Handler *old = <PyDataMem_Handler *>PyCapsule_GetPointer(
        previous, "mem_handler")
    cdef cxl_hook *h = <cxl_hook *>malloc(sizeof(cxl_hook))
    cdef PyDataMem_Handler *handler = <PyDataMem_Handler *>malloc(sizeof(PyDataMem_Handler))
    if h == NULL or handler == NULL:
        raise MemoryError()
    h.arena = <cxl_arena *>arena
    h.threshold = threshold
    h.pool_allocs = 0
    memcpy(&h.fallback, &old.allocator, sizeof(PyDataMemAllocator))
    memset(handler, 0, sizeof(PyDataMem_Handler))
    strncpy(handler.name, b"cxlmpi_pool", 126)
    handler.version = 1
    handler.allocator.ctx = h
    handler.allocator.malloc = <void *(*)(void *, size_t) noexcept nogil>cxl_hook_malloc
    handler.allocator.calloc = <void *(*)(void *, size_t, size_t) noexcept nogil>cxl_hook_calloc
    handler.allocator.realloc = <void *(*)(void *, void *, size_t) noexcept nogil>cxl_hook_realloc
    handler.allocator.free = <void (*)(void *, void *, size_t) noexcept nogil>cxl_hook_free
    hook = h
    hook_capsule = PyCapsule_New(handler, "mem_handler", NULL)
    PyDataMem_SetHandler(hook_capsule)


def retire():
    """From now on (the process is exiting, its pool given back) NumPy gets
    no more pool memory and frees of pool arrays are no-ops."""
    if hook != NULL:
        hook.arena.retired = 1


def uninstall():
    """Give NumPy its previous handler back (arrays already in the pool stay
    valid; their memory returns to the arena when they are freed)."""
    if hook != NULL and previous is not None:
        PyDataMem_SetHandler(previous)


def active():
    """Whether NumPy currently allocates through the hook."""
    return hook != NULL and PyDataMem_GetHandler() is hook_capsule


def stats():
    """The hook's counters and its arena's (zeros before install)."""
    if hook == NULL:
        return {"threshold": 0, "arena_bytes": 0, "free_bytes": 0, "live_arrays": 0,
                "live_bytes": 0, "pool_allocs": 0}
    return {"threshold": hook.threshold, "arena_bytes": hook.arena.nbytes,
            "free_bytes": cxl_arena_free_bytes(hook.arena),
            "live_arrays": cxl_arena_live_blocks(hook.arena),
            "live_bytes": hook.arena.live_bytes,
            "pool_allocs": hook.pool_allocs}

# The arena allocator of pyx/cxl_alloc.h, declared once for the two
# extensions that use it (cxlmpi._pool: pool-resident arrays; cxlmpi._alloc:
# the NumPy allocation hook).

from libc.stdint cimport int64_t


cdef extern from "cxl_alloc.h" nogil:
    ctypedef void (*cxl_notice_fn)(const char *what, size_t nbytes)
    ctypedef struct cxl_arena:
        size_t nbytes
        size_t live_bytes
        int retired
        int wipe
        int (*revoked)(void *) noexcept nogil
        void *revoked_ctx
    int CXL_ALLOC_OK
    int CXL_ALLOC_FULL
    int CXL_ALLOC_NOSPACE
    int CXL_ALLOC_REVOKED
    void cxl_arena_init(cxl_arena *a, char *base, size_t lo, size_t nbytes, int fd,
                        int64_t fd_offset, cxl_notice_fn notice, const char *what)
    void cxl_arena_destroy(cxl_arena *a)
    int cxl_arena_alloc(cxl_arena *a, size_t size, int reserve, size_t *offset)
    void cxl_arena_free(cxl_arena *a, size_t off)
    size_t cxl_arena_free_bytes(cxl_arena *a)
    size_t cxl_arena_live_blocks(cxl_arena *a)
    int dup(int fd)

/* The MPI library's own collectives, called straight from the shim for
 * the calls that pass through (small messages), without going through
 * mpi4py's method a second time.
 *
 * A pass-through call used to cost the shim's parsing and then all of
 * mpi4py's: a second method dispatch, a second message parse.  Calling the
 * library's function with the handles mpi4py holds does what mpi4py would
 * do, minus that.  No MPI header and no MPI library at build time: the
 * functions are looked up at run time where mpi4py's own calls resolve --
 * the global scope first (a profiler preloaded with LD_PRELOAD, a library
 * loaded RTLD_GLOBAL), then the libraries mpi4py's extension module was
 * linked against -- and a handle is the machine word mpi4py exposes as
 * `.handle`: an int where the library's handles are ints (MPICH's ABI), a
 * pointer where they are pointers (Open MPI, the MPI-5 standard ABI).  One
 * typed call per ABI, never a call through a mismatched prototype. */
#ifndef CXL_MPI_H
#define CXL_MPI_H

#include <dlfcn.h>
#include <sched.h>
#include <stdint.h>
#include <time.h>

#ifndef RTLD_DEFAULT
#define RTLD_DEFAULT ((void *)0)
#endif

typedef intptr_t cxl_h;   /* an MPI handle (communicator, datatype, op) */

enum {
    CXL_MPI_BARRIER, CXL_MPI_BCAST, CXL_MPI_REDUCE, CXL_MPI_ALLREDUCE,
    CXL_MPI_SCAN, CXL_MPI_EXSCAN, CXL_MPI_ALLGATHER, CXL_MPI_GATHER,
    CXL_MPI_SCATTER, CXL_MPI_ALLTOALL, CXL_MPI_REDUCE_SCATTER_BLOCK,
    CXL_MPI_ALLGATHERV, CXL_MPI_GATHERV, CXL_MPI_SCATTERV, CXL_MPI_ALLTOALLV,
    CXL_MPI_REDUCE_SCATTER, CXL_MPI_IBARRIER, CXL_MPI_TEST, CXL_MPI_NFN
};

static const char *const cxl_mpi_names[CXL_MPI_NFN] = {
    "MPI_Barrier", "MPI_Bcast", "MPI_Reduce", "MPI_Allreduce", "MPI_Scan",
    "MPI_Exscan", "MPI_Allgather", "MPI_Gather", "MPI_Scatter", "MPI_Alltoall",
    "MPI_Reduce_scatter_block", "MPI_Allgatherv", "MPI_Gatherv", "MPI_Scatterv",
    "MPI_Alltoallv", "MPI_Reduce_scatter", "MPI_Ibarrier", "MPI_Test",
};

static void *cxl_mpi_fn[CXL_MPI_NFN];
static int cxl_mpi_int = 0;      /* handles are ints (else pointers) */
static int cxl_mpi_ready = 0;

/* Look up the `n` functions `names` into `fn`, where mpi4py's extension
 * module `module` resolves its calls: 1 when every one was found. */
static int cxl_mpi_lookup(const char *module, const char *const *names, int n, void **fn)
{
    void *lib = dlopen(module, RTLD_LAZY | RTLD_NOLOAD);
    int found = 1;
    for (int i = 0; i < n && found; i++) {
        fn[i] = dlsym(RTLD_DEFAULT, names[i]);
        if (!fn[i] && lib) fn[i] = dlsym(lib, names[i]);
        found = fn[i] != NULL;
    }
    if (lib) dlclose(lib);   /* (RTLD_NOLOAD took a reference: mpi4py keeps it loaded) */
    return found;
}

/* Look the functions up; `module` is the path of mpi4py's extension module,
 * `handle_bytes` the size of its handles (MPI._sizeof(MPI.Comm)).  1 when
 * every function was found, 0 otherwise (the calls then stay with mpi4py). */
static int cxl_mpi_resolve(const char *module, int handle_bytes)
{
    cxl_mpi_ready = 0;
    if (handle_bytes != (int)sizeof(int) && handle_bytes != (int)sizeof(void *))
        return 0;
    cxl_mpi_int = handle_bytes == (int)sizeof(int) && sizeof(int) != sizeof(void *);
    cxl_mpi_ready = cxl_mpi_lookup(module, cxl_mpi_names, CXL_MPI_NFN, cxl_mpi_fn);
    return cxl_mpi_ready;
}

/* The handle stored at `where` (MPI._addressof of an mpi4py object: read at
 * each call, so a freed communicator is seen as MPI_COMM_NULL, as stock). */
static inline cxl_h cxl_mpi_read(const void *where)
{
    if (cxl_mpi_int) return (cxl_h) * (const int *)where;
    return (cxl_h) * (void *const *)where;
}

#define CXL_I(h) ((int)(h))
#define CXL_P(h) ((void *)(h))

/* Each call in both ABIs: (the int form, the pointer form). */
#define CXL_MPI_CALL(which, iproto, pproto, iargs, pargs) \
    (cxl_mpi_int ? ((int (*) iproto)cxl_mpi_fn[which]) iargs \
                 : ((int (*) pproto)cxl_mpi_fn[which]) pargs)

static inline int cxl_mpi_barrier(cxl_h c)
{
    return CXL_MPI_CALL(CXL_MPI_BARRIER, (int), (void *), (CXL_I(c)), (CXL_P(c)));
}

/* Completing a generalized request (MPI_Grequest_complete) from the
 * thread that ran a nonblocking collective in the pool (pyx/pool/
 * worker.pxi), by its handle; looked up apart from the collectives, so
 * that a library without it only keeps nonblocking collectives with MPI.
 * 1 when found. */
static void *cxl_mpi_greq_complete = NULL;

static int cxl_mpi_resolve_greq(const char *module)
{
    static const char *const names[1] = {"MPI_Grequest_complete"};
    if (!cxl_mpi_lookup(module, names, 1, &cxl_mpi_greq_complete))
        cxl_mpi_greq_complete = NULL;
    return cxl_mpi_greq_complete != NULL;
}

/* (the pool worker's completion callback: its argument is the handle) */
static void cxl_mpi_complete(intptr_t request)
{
    if (cxl_mpi_int)
        ((int (*)(int))cxl_mpi_greq_complete)(CXL_I(request));
    else
        ((int (*)(void *))cxl_mpi_greq_complete)(CXL_P(request));
}

/* Generalized requests started here, with C callbacks: a posted call's
 * request costs no Python at MPI_Wait unless its call failed or staged a
 * message (pyx/shim/nonblocking.pxi).  MPI_Grequest_start's query
 * function fills an empty status as mpi4py's does: MPI_SOURCE, MPI_TAG and
 * MPI_ERROR at the byte offsets found through mpi4py at run time (MPI has
 * no setter for them before MPI-4.1), the count and the cancelled flag by
 * MPI's own setters. */
static void *cxl_mpi_greq_fn[3];   /* start, Status_set_elements, Status_set_cancelled */
static int cxl_mpi_greq_ready = 0;
static int cxl_status_at[3];       /* offsets of MPI_SOURCE, MPI_TAG, MPI_ERROR */
static int cxl_status_any[2];      /* MPI_ANY_SOURCE, MPI_ANY_TAG */
static intptr_t cxl_mpi_byte;      /* MPI_BYTE */

static int cxl_mpi_resolve_greq_start(const char *module, const int *at, const int *any,
                                      intptr_t byte)
{
    static const char *const names[3] = {
        "MPI_Grequest_start", "MPI_Status_set_elements", "MPI_Status_set_cancelled"};
    for (int i = 0; i < 3; i++) cxl_status_at[i] = at[i];
    cxl_status_any[0] = any[0];
    cxl_status_any[1] = any[1];
    cxl_mpi_byte = byte;
    cxl_mpi_greq_ready = cxl_mpi_greq_complete != NULL
        && cxl_mpi_lookup(module, names, 3, cxl_mpi_greq_fn);
    return cxl_mpi_greq_ready;
}

/* MPI_Grequest_start(query, free, cancel, extra, &request): MPI's code,
 * and the request's handle in `*request`. */
static int cxl_mpi_greq_start(void *query, void *free_fn, void *cancel, void *extra,
                              intptr_t *request)
{
    int rc;
    if (cxl_mpi_int) {
        int h = 0;
        rc = ((int (*)(void *, void *, void *, void *, int *))cxl_mpi_greq_fn[0])(
            query, free_fn, cancel, extra, &h);
        *request = h;
    } else {
        void *h = NULL;
        rc = ((int (*)(void *, void *, void *, void *, void **))cxl_mpi_greq_fn[0])(
            query, free_fn, cancel, extra, &h);
        *request = (intptr_t)h;
    }
    return rc;
}

/* A count that threads add to without a lock. */
static inline void cxl_count(uint64_t *counter)
{
    __atomic_fetch_add(counter, 1, __ATOMIC_RELAXED);
}

/* An empty status, as MPI leaves a collective's (source and tag undefined). */
static void cxl_mpi_status_empty(void *status)
{
    *(int *)((char *)status + cxl_status_at[0]) = cxl_status_any[0];
    *(int *)((char *)status + cxl_status_at[1]) = cxl_status_any[1];
    *(int *)((char *)status + cxl_status_at[2]) = 0;   /* MPI_SUCCESS */
    if (cxl_mpi_int)
        ((int (*)(void *, int, int))cxl_mpi_greq_fn[1])(status, CXL_I(cxl_mpi_byte), 0);
    else
        ((int (*)(void *, void *, int))cxl_mpi_greq_fn[1])(status, CXL_P(cxl_mpi_byte), 0);
    ((int (*)(void *, int))cxl_mpi_greq_fn[2])(status, 0);
}

/* How a rank waits between tests of a request only its peers can complete:
 * spinning first (the peers are usually microseconds behind), then
 * yielding the core for 10 ms (a peer may be queued behind this rank on
 * it), then sleeping between tests, from 1 us doubling to 1 ms, so that a
 * rank whose peers still compute does not take a core from them where
 * ranks outnumber cores.  1 once `timeout_s` (> 0) has passed since the
 * first pause, else 0. */
typedef struct {
    uint64_t polls;
    double first_s;
    long sleep_ns;
} cxl_pause;

static inline double cxl_mpi_now_s(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + 1e-9 * (double)now.tv_nsec;
}

static inline int cxl_mpi_pause(cxl_pause *p, double timeout_s)
{
    if (++p->polls < 1024)
        return 0;
    double now_s = cxl_mpi_now_s();
    if (p->first_s == 0.0)
        p->first_s = now_s;
    if (now_s - p->first_s < 0.01) {
        sched_yield();
    } else {
        struct timespec nap = {0, p->sleep_ns < 1000 ? 1000 : p->sleep_ns};
        nanosleep(&nap, NULL);
        p->sleep_ns = nap.tv_nsec >= 500000 ? 1000000 : 2 * nap.tv_nsec;
    }
    return timeout_s > 0 && now_s - p->first_s > timeout_s;
}

/* The end of a pool collective under CXLMPI_ORDERING (see _shim `order`):
 * MPI_Ibarrier on `c`, then MPI_Test until it completes, pausing between
 * tests (`cxl_mpi_pause`), or until `timeout_s` (0: never) has passed
 * since the first pause: 1 then, the barrier left pending (the caller
 * never uses `c` again, nor frees it).  0 when it completed or MPI failed (`*ierr`). */
static int cxl_mpi_order(cxl_h c, double timeout_s, int *ierr)
{
    int ireq = 0, flag = 0;
    void *preq = NULL;
    uint64_t status[32];   /* larger than any MPI_Status */
    cxl_pause pause = {0, 0.0, 0};
    *ierr = cxl_mpi_int
        ? ((int (*)(int, int *))cxl_mpi_fn[CXL_MPI_IBARRIER])(CXL_I(c), &ireq)
        : ((int (*)(void *, void **))cxl_mpi_fn[CXL_MPI_IBARRIER])(CXL_P(c), &preq);
    while (*ierr == 0) {
        *ierr = cxl_mpi_int
            ? ((int (*)(int *, int *, void *))cxl_mpi_fn[CXL_MPI_TEST])(&ireq, &flag, status)
            : ((int (*)(void **, int *, void *))cxl_mpi_fn[CXL_MPI_TEST])(&preq, &flag, status);
        if (flag || *ierr)
            break;
        if (cxl_mpi_pause(&pause, timeout_s))
            return 1;
    }
    return 0;
}

static inline int cxl_mpi_bcast(void *b, int n, cxl_h t, int root, cxl_h c)
{
    return CXL_MPI_CALL(CXL_MPI_BCAST, (void *, int, int, int, int),
                        (void *, int, void *, int, void *),
                        (b, n, CXL_I(t), root, CXL_I(c)), (b, n, CXL_P(t), root, CXL_P(c)));
}

/* Reduce (root >= 0), Allreduce, Scan and Exscan (root < 0: `which`). */
static inline int cxl_mpi_reduce(int which, const void *s, void *r, int n, cxl_h t, cxl_h op,
                                 int root, cxl_h c)
{
    if (which == CXL_MPI_REDUCE)
        return CXL_MPI_CALL(which, (const void *, void *, int, int, int, int, int),
                            (const void *, void *, int, void *, void *, int, void *),
                            (s, r, n, CXL_I(t), CXL_I(op), root, CXL_I(c)),
                            (s, r, n, CXL_P(t), CXL_P(op), root, CXL_P(c)));
    return CXL_MPI_CALL(which, (const void *, void *, int, int, int, int),
                        (const void *, void *, int, void *, void *, void *),
                        (s, r, n, CXL_I(t), CXL_I(op), CXL_I(c)),
                        (s, r, n, CXL_P(t), CXL_P(op), CXL_P(c)));
}

/* Reduce_scatter_block: `n` elements to each rank. */
static inline int cxl_mpi_reduce_scatter_block(const void *s, void *r, int n, cxl_h t, cxl_h op,
                                               cxl_h c)
{
    return CXL_MPI_CALL(CXL_MPI_REDUCE_SCATTER_BLOCK,
                        (const void *, void *, int, int, int, int),
                        (const void *, void *, int, void *, void *, void *),
                        (s, r, n, CXL_I(t), CXL_I(op), CXL_I(c)),
                        (s, r, n, CXL_P(t), CXL_P(op), CXL_P(c)));
}

/* Allgather and Alltoall (root < 0: `which`), Gather and Scatter. */
static inline int cxl_mpi_move(int which, const void *s, int sn, cxl_h st, void *r, int rn,
                               cxl_h rt, int root, cxl_h c)
{
    if (root < 0)
        return CXL_MPI_CALL(which, (const void *, int, int, void *, int, int, int),
                            (const void *, int, void *, void *, int, void *, void *),
                            (s, sn, CXL_I(st), r, rn, CXL_I(rt), CXL_I(c)),
                            (s, sn, CXL_P(st), r, rn, CXL_P(rt), CXL_P(c)));
    return CXL_MPI_CALL(which, (const void *, int, int, void *, int, int, int, int),
                        (const void *, int, void *, void *, int, void *, int, void *),
                        (s, sn, CXL_I(st), r, rn, CXL_I(rt), root, CXL_I(c)),
                        (s, sn, CXL_P(st), r, rn, CXL_P(rt), root, CXL_P(c)));
}

/* The v-collectives.  A vector message: counts and displacements in
 * elements, as the library's large-count functions take them (MPI_Count and
 * MPI_Aint arrays: MPI 4's `_c` functions, which mpi4py calls where the
 * library has them) and as C ints for the classic functions. */
typedef struct {
    void *buf;
    const intptr_t *counts, *displs;
    const int *icounts, *idispls;
    cxl_h type;
} cxl_vec;

enum {
    CXL_MPI_ALLGATHERV_C, CXL_MPI_GATHERV_C, CXL_MPI_SCATTERV_C, CXL_MPI_ALLTOALLV_C,
    CXL_MPI_REDUCE_SCATTER_C, CXL_MPI_NFN_C
};
static void *cxl_mpi_fn_c[CXL_MPI_NFN_C];
static int cxl_mpi_large = 0;   /* the `_c` functions are there, and take intptr_t arrays */

/* Look up the `_c` functions (after cxl_mpi_resolve): where the library's
 * MPI_Count and MPI_Aint are both 64 bits, like intptr_t. */
static int cxl_mpi_resolve_large(const char *module, int count_bytes, int aint_bytes)
{
    static const char *const names[CXL_MPI_NFN_C] = {
        "MPI_Allgatherv_c", "MPI_Gatherv_c", "MPI_Scatterv_c", "MPI_Alltoallv_c",
        "MPI_Reduce_scatter_c",
    };
    cxl_mpi_large = count_bytes == 8 && aint_bytes == 8 && sizeof(intptr_t) == 8 &&
                    cxl_mpi_lookup(module, names, CXL_MPI_NFN_C, cxl_mpi_fn_c);
    return cxl_mpi_large;
}

typedef const intptr_t *cxl_l;
typedef const int *cxl_v;

/* Each v-call in both ABIs and both count widths: `large` picks the `_c`
 * function (counts as intptr_t), else the classic one (as int). */
#define CXL_MPI_VCALL(which, lproto, lpproto, largs, lpargs, iproto, pproto, iargs, pargs) \
    (cxl_mpi_large \
        ? (cxl_mpi_int ? ((int (*) lproto)cxl_mpi_fn_c[which##_C]) largs \
                       : ((int (*) lpproto)cxl_mpi_fn_c[which##_C]) lpargs) \
        : CXL_MPI_CALL(which, iproto, pproto, iargs, pargs))

static inline int cxl_mpi_allgatherv(const void *s, intptr_t sn, cxl_h st, const cxl_vec *r,
                                     cxl_h c)
{
    return CXL_MPI_VCALL(CXL_MPI_ALLGATHERV,
        (const void *, intptr_t, int, void *, cxl_l, cxl_l, int, int),
        (const void *, intptr_t, void *, void *, cxl_l, cxl_l, void *, void *),
        (s, sn, CXL_I(st), r->buf, r->counts, r->displs, CXL_I(r->type), CXL_I(c)),
        (s, sn, CXL_P(st), r->buf, r->counts, r->displs, CXL_P(r->type), CXL_P(c)),
        (const void *, int, int, void *, cxl_v, cxl_v, int, int),
        (const void *, int, void *, void *, cxl_v, cxl_v, void *, void *),
        (s, (int)sn, CXL_I(st), r->buf, r->icounts, r->idispls, CXL_I(r->type), CXL_I(c)),
        (s, (int)sn, CXL_P(st), r->buf, r->icounts, r->idispls, CXL_P(r->type), CXL_P(c)));
}

static inline int cxl_mpi_gatherv(const void *s, intptr_t sn, cxl_h st, const cxl_vec *r,
                                  int root, cxl_h c)
{
    return CXL_MPI_VCALL(CXL_MPI_GATHERV,
        (const void *, intptr_t, int, void *, cxl_l, cxl_l, int, int, int),
        (const void *, intptr_t, void *, void *, cxl_l, cxl_l, void *, int, void *),
        (s, sn, CXL_I(st), r->buf, r->counts, r->displs, CXL_I(r->type), root, CXL_I(c)),
        (s, sn, CXL_P(st), r->buf, r->counts, r->displs, CXL_P(r->type), root, CXL_P(c)),
        (const void *, int, int, void *, cxl_v, cxl_v, int, int, int),
        (const void *, int, void *, void *, cxl_v, cxl_v, void *, int, void *),
        (s, (int)sn, CXL_I(st), r->buf, r->icounts, r->idispls, CXL_I(r->type), root,
         CXL_I(c)),
        (s, (int)sn, CXL_P(st), r->buf, r->icounts, r->idispls, CXL_P(r->type), root,
         CXL_P(c)));
}

static inline int cxl_mpi_scatterv(const cxl_vec *s, void *r, intptr_t rn, cxl_h rt, int root,
                                   cxl_h c)
{
    return CXL_MPI_VCALL(CXL_MPI_SCATTERV,
        (const void *, cxl_l, cxl_l, int, void *, intptr_t, int, int, int),
        (const void *, cxl_l, cxl_l, void *, void *, intptr_t, void *, int, void *),
        (s->buf, s->counts, s->displs, CXL_I(s->type), r, rn, CXL_I(rt), root, CXL_I(c)),
        (s->buf, s->counts, s->displs, CXL_P(s->type), r, rn, CXL_P(rt), root, CXL_P(c)),
        (const void *, cxl_v, cxl_v, int, void *, int, int, int, int),
        (const void *, cxl_v, cxl_v, void *, void *, int, void *, int, void *),
        (s->buf, s->icounts, s->idispls, CXL_I(s->type), r, (int)rn, CXL_I(rt), root,
         CXL_I(c)),
        (s->buf, s->icounts, s->idispls, CXL_P(s->type), r, (int)rn, CXL_P(rt), root,
         CXL_P(c)));
}

static inline int cxl_mpi_alltoallv(const cxl_vec *s, const cxl_vec *r, cxl_h c)
{
    return CXL_MPI_VCALL(CXL_MPI_ALLTOALLV,
        (const void *, cxl_l, cxl_l, int, void *, cxl_l, cxl_l, int, int),
        (const void *, cxl_l, cxl_l, void *, void *, cxl_l, cxl_l, void *, void *),
        (s->buf, s->counts, s->displs, CXL_I(s->type), r->buf, r->counts, r->displs,
         CXL_I(r->type), CXL_I(c)),
        (s->buf, s->counts, s->displs, CXL_P(s->type), r->buf, r->counts, r->displs,
         CXL_P(r->type), CXL_P(c)),
        (const void *, cxl_v, cxl_v, int, void *, cxl_v, cxl_v, int, int),
        (const void *, cxl_v, cxl_v, void *, void *, cxl_v, cxl_v, void *, void *),
        (s->buf, s->icounts, s->idispls, CXL_I(s->type), r->buf, r->icounts, r->idispls,
         CXL_I(r->type), CXL_I(c)),
        (s->buf, s->icounts, s->idispls, CXL_P(s->type), r->buf, r->icounts, r->idispls,
         CXL_P(r->type), CXL_P(c)));
}

/* Reduce_scatter: `r`'s counts are recvcounts (its buffer is the receive
 * buffer's). */
static inline int cxl_mpi_reduce_scatter(const void *s, const cxl_vec *r, cxl_h op, cxl_h c)
{
    return CXL_MPI_VCALL(CXL_MPI_REDUCE_SCATTER,
        (const void *, void *, cxl_l, int, int, int),
        (const void *, void *, cxl_l, void *, void *, void *),
        (s, r->buf, r->counts, CXL_I(r->type), CXL_I(op), CXL_I(c)),
        (s, r->buf, r->counts, CXL_P(r->type), CXL_P(op), CXL_P(c)),
        (const void *, void *, cxl_v, int, int, int),
        (const void *, void *, cxl_v, void *, void *, void *),
        (s, r->buf, r->icounts, CXL_I(r->type), CXL_I(op), CXL_I(c)),
        (s, r->buf, r->icounts, CXL_P(r->type), CXL_P(op), CXL_P(c)));
}


#endif

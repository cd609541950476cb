/* cxl_codes.h -- every number that the compiled code and Python share,
 * declared once.
 *
 *   collectives    the index of each intercepted collective: the rows of
 *                  cxlmpi.stats(), of the windows (cxlmpi.config), of
 *                  adaptive selection's route table (cxlmpi.select)
 *   variant flags  how a pool call runs (cxlmpi.select picks them)
 *   path codes     what a call takes: stock MPI, or the pool + variant flags
 *   size classes   the power-of-two class of a message (route table rows)
 *
 * Used by pyx/_pool.pyx and pyx/_shim.pyx (both through pyx/codes.pxi);
 * Python reads them from cxlmpi._pool (COLLECTIVES, VARIANT_FLAGS, PATH_*,
 * NCLASSES, size_class), never from copies of its own; tests/test_codes.py
 * checks that every Python table agrees.
 */
#ifndef CXL_CODES_H
#define CXL_CODES_H

#include <stdint.h>

/* The intercepted collectives, in the order of their names below (the
 * names are cxlmpi.config's and cxlmpi.stats()'s: the method's, lower case). */
enum {
    CXL_BARRIER, CXL_BCAST, CXL_REDUCE, CXL_ALLREDUCE, CXL_ALLGATHER, CXL_ALLGATHERV,
    CXL_GATHER, CXL_GATHERV, CXL_SCATTER, CXL_SCATTERV, CXL_ALLTOALL, CXL_ALLTOALLV,
    CXL_REDUCE_SCATTER_BLOCK, CXL_REDUCE_SCATTER, CXL_SCAN, CXL_EXSCAN,
    CXL_NCOLL   /* how many */
};

static const char *const cxl_collective_names[] = {
    "barrier", "bcast", "reduce", "allreduce", "allgather", "allgatherv",
    "gather", "gatherv", "scatter", "scatterv", "alltoall", "alltoallv",
    "reduce_scatter_block", "reduce_scatter", "scan", "exscan",
};
_Static_assert(sizeof(cxl_collective_names) / sizeof(cxl_collective_names[0]) == CXL_NCOLL,
               "one name per collective");

/* Variant flags of a pool call (0: the defaults), bit i named
 * cxl_variant_names[i]. */
enum {
    CXL_V_STREAM = 1,    /* publish with streaming stores (no dirty lines to snoop) */
    CXL_V_BIGCHUNK = 2,  /* steps of a whole half instead of CXLMPI_CHUNK_SIZE */
    CXL_V_RSAG = 4,      /* reductions: reduce-scatter + allgather */
    CXL_V_FLAT = 8,      /* reductions: every receiver folds everything */
    CXL_NVARIANTS = 4    /* how many flags */
};

static const char *const cxl_variant_names[] = {"stream", "bigchunk", "rsag", "flat"};
_Static_assert(sizeof(cxl_variant_names) / sizeof(cxl_variant_names[0]) == CXL_NVARIANTS,
               "one name per variant flag");
_Static_assert(CXL_V_FLAT == 1 << (CXL_NVARIANTS - 1), "flag i is bit i");

/* Path codes: what a call takes (a route table entry, a selector's pick). */
enum {
    CXL_PATH_NEW = -2,   /* a class no call has met yet: its first call opens a
                          * timed run on MPI without a header step */
    CXL_PATH_SLOW = -1,  /* no decision: ask the selector (a header step) */
    CXL_PATH_FOLLOW = -1,   /* (a call's path only, never a table's) MPI, where every
                             * rank already knows it (a header step said so): no
                             * pass mark, which would count the call twice */
    CXL_PATH_MPI = 0,    /* stock MPI */
    CXL_PATH_POOL = 1,   /* the pool; + variant flags: the pool with those */
    CXL_PATH_MAX = CXL_PATH_POOL + (1 << CXL_NVARIANTS) - 1   /* every flag */
};

/* Size classes: floor(log2(nbytes)), 0 for 0 and 1 byte; one per bit of a
 * 64-bit size. */
#define CXL_NCLASSES 64

/* The largest block of a posted v-collective, where its ranks cannot know
 * it (only some hold every count): the worker learns it first. */
#define CXL_MAX_VARIES UINT64_MAX

static inline int cxl_size_class(int64_t nbytes) {
    return nbytes <= 1 ? 0 : 63 - __builtin_clzll((unsigned long long)nbytes);
}

#endif /* CXL_CODES_H */

/* cxl_layout.h -- the shared layout of a pool segment, declared once.
 *
 * Every process may map a pool at a different address, so everything here is
 * reached by offset from the start of the mapping:
 *
 *   0                  cxl_header (in a page of CXL_HEADER_NBYTES)
 *   CXL_HEADER_NBYTES  cxl_ctrl[nranks]: one control line per rank, written
 *                      only by its rank (single writer per cache line)
 *   slot_offset        data halves: rank r owns two halves of half_nbytes,
 *                      at slot_offset + (2*r + h) * half_nbytes
 *   arena_offset       pool-resident arrays: rank r's arena at
 *                      arena_offset + r * arena_nbytes
 *
 * Used by pyx/_pool.pyx (cdef extern) and, through the offsets it exports
 * (cxlmpi._pool.LAYOUT), by cxlmpi/memory/backends.py, which reads control lines of
 * partitions to tell live jobs from stale ones.
 */
#ifndef CXL_LAYOUT_H
#define CXL_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#define CXL_MAGIC 0x31304c504d4c5843ull  /* "CXLMPL01" little-endian */
#define CXL_LAYOUT_VERSION 5  /* 2: call signatures, pass marks; 3: asleep; 4: its own line;
                                * 5: heartbeat */
#define CXL_HEADER_NBYTES 4096
#define CXL_LINE_NBYTES 64
#define CXL_CTRL_NBYTES 256

/* The segment header, written once by the creating rank (magic last). */
typedef struct {
    uint64_t magic;        /* +0   CXL_MAGIC once the rest is valid */
    uint32_t version;      /* +8   CXL_LAYOUT_VERSION */
    uint32_t nranks;       /* +12 */
    uint64_t total_nbytes; /* +16  bytes mapped */
    uint64_t slot_offset;  /* +24  where the data halves start */
    uint64_t half_nbytes;  /* +32  bytes of one half */
    uint64_t token;        /* +40  the partition's token (file/dax pools), 0 for shm */
    uint64_t arena_offset; /* +48  where the arenas start (== pool size if none) */
    uint64_t arena_nbytes; /* +56  bytes of each rank's arena */
} cxl_header;

/* One rank's control line: four 64-byte lines, grouped by how often they
 * are written, so that no line a peer reads on every call is also written
 * by its rank on every call; 256 bytes, so that adjacent-line prefetch
 * (pairs of lines) never makes two ranks' lines share.  Fields first, then
 * a release-store of seq. */
typedef struct {
    /* line 0: written at every step */
    uint64_t seq;          /* +0   steps this rank published (release-stored last) */
    int64_t pid;           /* +8   its process id (liveness: same host only) */
    uint64_t value[2];     /* +16  a number published with a step, by step parity */
    uint64_t host;         /* +32  its host's identity (cxlmpi.memory.backends) */
    uint64_t attached;     /* +40  1 while it has the pool mapped */
    uint64_t value2[2];    /* +48  a second number of a header step, by parity */
    /* line 1: written at a call's first step, or when it passes a call;
     * read by peers only at a call's first step (software coherence
     * writes it back before seq) */
    uint64_t sig[3][2];    /* +64  the call whose first step this is, by parity:
                            *      [0] what, call number, op, type, root
                            *      [1] bytes (the same on every rank)
                            *      [2] its share of the block checksum */
    uint64_t passed;       /* +112 its last call sent to MPI */
    uint64_t broken;       /* +120 0, or the call at which this rank found
                            *      the ranks' calls out of step (a peer's
                            *      first step of a call it made no step of):
                            *      the peers raise the mismatch too, instead
                            *      of waiting for a step that never comes;
                            *      with the top bit, the call this rank
                            *      refused (a message outside its buffer,
                            *      low 48 bits) and, in bits 48-62, 1 + the
                            *      rank of another pool group whose refusal
                            *      it passes on (0: its own) */
    /* line 2: written only when this rank falls asleep, wakes, or waits on
     * another CPU; read by every peer after each store of its seq or
     * passed (a pass-through call among them): kept out of lines 0 and 1
     * so that those reads hit the reader's cache (in line 1 they cost a
     * cache-line transfer per passed call, 0.1-0.2 us) */
    uint32_t asleep;       /* +128 0, or 1 + the peer whose seq word this rank
                            *      sleeps on (a futex; same host only), which
                            *      then wakes it */
    uint32_t cpu;          /* +132 1 + the CPU this rank last waited on (0:
                            *      unknown): a peer does not spin for a rank
                            *      queued behind it on its own CPU */
    uint64_t pad2[7];      /* +136 */
    /* line 3: the pair of line 2; written only by the heartbeat thread
     * (pyx/cxl_beat.h), read by a waiting peer now and then */
    uint64_t beat;         /* +192 advanced every beat_period_ns while the rank
                            *      lives: liveness where its pid means nothing */
    uint64_t beat_period_ns; /* +200 */
    uint64_t start;        /* +208 its process's start time (clock ticks since
                            *      boot; 0: unknown), written once at attach: a
                            *      reused pid is another process */
    uint64_t pad3[5];      /* +216 */
} cxl_ctrl;

_Static_assert(sizeof(cxl_header) == 64, "cxl_header is one cache line");
_Static_assert(sizeof(cxl_ctrl) == CXL_CTRL_NBYTES, "a control line is 256 bytes");
_Static_assert(offsetof(cxl_ctrl, sig) == CXL_LINE_NBYTES, "the signature opens line 1");
_Static_assert(offsetof(cxl_ctrl, asleep) == 2 * CXL_LINE_NBYTES, "asleep opens line 2");
_Static_assert(offsetof(cxl_ctrl, pid) == 8 && offsetof(cxl_ctrl, host) == 32
               && offsetof(cxl_ctrl, attached) == 40
               && offsetof(cxl_ctrl, beat) == 3 * CXL_LINE_NBYTES
               && offsetof(cxl_ctrl, start) == 3 * CXL_LINE_NBYTES + 16,
               "cxlmpi.memory.backends reads these offsets through LAYOUT");

#endif /* CXL_LAYOUT_H */

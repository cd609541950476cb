# The shared layout of a pool and this rank's view of it: the segment header,
# the control lines, the data halves, the arenas; status codes.
# (part of cxlmpi._pool: included by pyx/_pool.pyx)


cdef extern from "cxl_layout.h" nogil:
    # The shared layout, declared once (its placement comments are there).
    uint64_t CXL_MAGIC
    enum:
        CXL_LAYOUT_VERSION
        HEADER_NBYTES "CXL_HEADER_NBYTES"
        CTRL_NBYTES "CXL_CTRL_NBYTES"
        LINE_NBYTES "CXL_LINE_NBYTES"
    ctypedef struct cxl_header:
        uint64_t magic
        uint32_t version
        uint32_t nranks
        uint64_t total_nbytes
        uint64_t slot_offset
        uint64_t half_nbytes
        uint64_t token
        uint64_t arena_offset
        uint64_t arena_nbytes
    ctypedef struct cxl_ctrl:
        uint64_t seq
        int64_t pid
        uint64_t value[2]
        uint64_t host
        uint64_t attached
        uint64_t value2[2]
        uint64_t sig[3][2]
        uint64_t passed
        uint64_t broken
        uint32_t asleep
        uint32_t cpu
        uint64_t beat
        uint64_t beat_period_ns
        uint64_t start

DEF PAGE_NBYTES = 4096


cdef cxl_ctrl _ctrl_example
cdef cxl_header _header_example


def _layout():
    cdef char *at = <char *>&_ctrl_example
    return {"header_nbytes": HEADER_NBYTES, "ctrl_nbytes": CTRL_NBYTES,
            "line_nbytes": LINE_NBYTES,
            "ctrl_seq": <char *>&_ctrl_example.seq - at,
            "ctrl_passed": <char *>&_ctrl_example.passed - at,
            "ctrl_asleep": <char *>&_ctrl_example.asleep - at,
            "ctrl_cpu": <char *>&_ctrl_example.cpu - at,
            "ctrl_pid": <char *>&_ctrl_example.pid - at,
            "ctrl_host": <char *>&_ctrl_example.host - at,
            "ctrl_attached": <char *>&_ctrl_example.attached - at,
            "ctrl_beat": <char *>&_ctrl_example.beat - at,
            "ctrl_beat_period": <char *>&_ctrl_example.beat_period_ns - at,
            "ctrl_start": <char *>&_ctrl_example.start - at,
            "header_token": <char *>&_header_example.token - <char *>&_header_example}


# Offsets of the shared layout that Python code reads (cxlmpi.memory.backends, tests).
LAYOUT = _layout()
# Status codes returned by the nogil algorithms.
DEF OK = 0
DEF ERR_TIMEOUT = -1
DEF ERR_PEER_GONE = -2
DEF ERR_MISMATCH = -3  # the ranks' calls differ (size, root, op, type, counts)
DEF ERR_PASSED = -4    # a peer sent this call to MPI: every rank goes there too
DEF ERR_REVOKED = -5   # the pool's memory was handed to another job (liveness.pxi)
DEF ERR_CLOSED = -6    # the pool closed with this call queued or running (pool/worker.pxi)
DEF ERR_LEFT = -7      # an awaited peer closed its pool (a call of its own failed there)


class PoolFailure(Exception):
    """A pool algorithm stopped: a peer never arrived or is gone (`rank`;
    `still_s` > 0: judged by a heartbeat that stood still that long, past
    its lease of `lease_s`), the ranks' calls do not match (`mismatch`;
    rank -1: their blocks), a peer sent the call to MPI, where every rank
    must follow (`passed`), the pool's memory is another job's now
    (`revoked`), the pool closed while the call was in flight in its
    worker (`closed`: a nonblocking collective never waited for), or an
    awaited peer closed its pool, alive (`left`: a call of its own failed
    there -- a timeout, a peer it judged gone -- and it raised)."""

    MISMATCH = ERR_MISMATCH  # the code of a mismatch, for who raises one
    PASSED = ERR_PASSED      # ... and of a call a peer sent to MPI
    TIMEOUT = ERR_TIMEOUT    # ... and of a wait that timed out (pools.hierarchy)

    def __init__(self, code, rank, what, still_s=0.0, lease_s=0.0):
        super().__init__(code, rank, what)
        self.code, self.rank, self.what = code, rank, what
        self.timed_out = code == ERR_TIMEOUT
        self.mismatch = code == ERR_MISMATCH
        self.passed = code == ERR_PASSED
        self.revoked = code == ERR_REVOKED
        self.closed = code == ERR_CLOSED
        self.left = code == ERR_LEFT
        self.still_s, self.lease_s = still_s, lease_s


cdef extern from "cxl_kernels.h" nogil:
    enum:
        CXL_I8, CXL_I16, CXL_I32, CXL_I64, CXL_U8, CXL_U16, CXL_U32, CXL_U64
        CXL_F32, CXL_F64, CXL_C64, CXL_C128, CXL_BOOL, CXL_BYTE
        CXL_SUM, CXL_PROD, CXL_MAX, CXL_MIN, CXL_LAND, CXL_LOR, CXL_LXOR
        CXL_BAND, CXL_BOR, CXL_BXOR


# The kernels' type and op codes by name (the numbers are cxl_kernels.h's).
TYPE_CODES = {
    "i8": CXL_I8, "i16": CXL_I16, "i32": CXL_I32, "i64": CXL_I64,
    "u8": CXL_U8, "u16": CXL_U16, "u32": CXL_U32, "u64": CXL_U64,
    "f32": CXL_F32, "f64": CXL_F64, "c64": CXL_C64, "c128": CXL_C128,
    "bool": CXL_BOOL, "byte": CXL_BYTE,
}
OP_CODES = {
    "SUM": CXL_SUM, "PROD": CXL_PROD, "MAX": CXL_MAX, "MIN": CXL_MIN,
    "LAND": CXL_LAND, "LOR": CXL_LOR, "LXOR": CXL_LXOR,
    "BAND": CXL_BAND, "BOR": CXL_BOR, "BXOR": CXL_BXOR,
}


ctypedef struct state_t:
    char *base
    int rank
    int size
    uint64_t step          # last step this rank published
    size_t half_nbytes
    size_t slot_offset
    int sw                 # software coherence: flush/invalidate
    int spin               # busy-poll before sleeping (a core per rank, not busy)
    int no_futex           # a futex sleep failed here: back off instead
    double timeout_s
    int failed_rank        # set on error: a rank that never arrived
    int failed_code
    # The heap of pool-resident arrays this pool's zero-copy paths use: its
    # own arenas, or a node heap it shares (Pool.share_heap).  Offsets
    # published for zero copy are from `heap`; arrays lie in
    # [heap + heap_lo, heap + heap_hi) (heap_lo == heap_hi: none).
    char *heap
    size_t heap_lo
    size_t heap_hi
    # per rank: its send buffer when read in place, or NULL (published
    # through its half); the array itself NULL: every rank publishes
    const char **res
    const char **srcs      # scratch: one source pointer per rank (folds)
    cxl_progress progress  # how a waiter keeps MPI progressing (set_progress)
    uint64_t ops           # calls of this rank: pool calls and passed ones
    uint64_t passed_from   # the first call of this rank's passed ones before this call
    uint64_t pool_ops      # the number of this rank's last call that ran in the pool
    uint64_t sig[3]        # this call's signature (see wait_all)
    int sig_pending        # the next step is this call's first
    int stream             # this call publishes with streaming stores (a variant)
    int took_zc            # this call ran zero-copy (every rank alike)
    # The tunables (Pool.tune; zero before), alike on every rank: what each
    # family's run_<family> reads to pick its algorithm (pool/sizing.pxi)
    size_t chunk_nbytes        # bytes a rank publishes per step (CXLMPI_CHUNK_SIZE)
    size_t rsag_min_nbytes     # the smallest reduce-scatter + allgather reduction
    size_t zerocopy_min_nbytes  # the smallest call that asks where buffers live
    int rsag_min_ranks         # ... and its fewest ranks
    # liveness (pool/liveness.pxi): the backing file as this rank's own open
    # file description (-1: none), where the mapping starts in it, the
    # partition's token (0: a shm pool), and after ERR_PEER_GONE judged by
    # heartbeat how long the peer stood still and its lease (else 0);
    # lock_sure: a free lock means its owner is gone (a regular file)
    int lock_fd
    int lock_sure
    size_t file_offset
    uint64_t token
    # the token of the node heap it shares (0: none), and where its header
    # holds it: arrays used in place lie there (Pool.share_heap)
    uint64_t heap_token
    const uint64_t *heap_token_at
    double still_s
    double lease_s
    int quit               # the pool is closing: a wait in its worker ends (ERR_CLOSED)


DEF ARENA_ALIGN = 2 * 1024 * 1024


cdef inline uint64_t resident(state_t *st, const char *addr, size_t nbytes) noexcept nogil:
    """offset + 1 of [addr, addr + nbytes) in the heap's arenas, or 0."""
    cdef const char *lo = st.heap + st.heap_lo
    cdef const char *hi = st.heap + st.heap_hi
    if st.heap_lo >= st.heap_hi or addr < lo or addr > hi or nbytes > <size_t>(hi - addr):
        return 0
    return <uint64_t>(addr - st.heap) + 1


cdef size_t arena_start(size_t pool_nbytes) noexcept nogil:
    return (pool_nbytes + ARENA_ALIGN - 1) // ARENA_ALIGN * ARENA_ALIGN


def check_layout(int nranks, size_t pool_nbytes):
    """Raise ValueError when a pool of `pool_nbytes` bytes has no room for
    `nranks` ranks."""
    half = Pool.layout(nranks, pool_nbytes)[1]
    if half < 2 * PAGE_NBYTES:
        raise ValueError(
            f"pool of {pool_nbytes} bytes is too small for {nranks} ranks; "
            f"raise CXLMPI_POOL_SIZE")


cdef inline cxl_ctrl *ctrl(state_t *st, int q) noexcept nogil:
    """Rank q's control line."""
    return <cxl_ctrl *>(st.base + HEADER_NBYTES + <size_t>q * CTRL_NBYTES)


cdef inline char *half_ptr(state_t *st, int q, uint64_t step) noexcept nogil:
    return st.base + st.slot_offset + (2 * <size_t>q + <size_t>(step & 1)) * st.half_nbytes


cdef inline uint64_t *value_ptr(state_t *st, int q, uint64_t step) noexcept nogil:
    return &ctrl(st, q).value[step & 1]


cdef inline uint64_t *value2_ptr(state_t *st, int q, uint64_t step) noexcept nogil:
    return &ctrl(st, q).value2[step & 1]


DEF BLOCK_NBYTES = 8192  # reduce block: the running result stays in L1
DEF BLOCK_TMP = 8192
DEF STREAM_MIN_NBYTES = 4 * 1024 * 1024
DEF MAX_ZC_RANKS = 1024

# Variant flags of a pool call (V_STREAM, V_BIGCHUNK, V_RSAG, V_FLAT):
# pyx/cxl_codes.h, through pyx/codes.pxi.


cdef inline size_t min_size(size_t a, size_t b) noexcept nogil:
    return a if a < b else b

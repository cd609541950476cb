# The numbers the compiled code and Python share, declared once in
# pyx/cxl_codes.h (collective indices, variant flags, path codes, size
# classes), and the Python names they are exported under.  Python reads
# them from cxlmpi._pool: cxlmpi.config (COLLECTIVES), cxlmpi.select (the
# rest); tests/test_codes.py checks every table against them.
# (part of cxlmpi._pool and cxlmpi._shim: included by pyx/_pool.pyx and
# pyx/_shim.pyx)

from libc.stdint cimport int64_t, uint64_t

cdef extern from "cxl_codes.h" nogil:
    enum:
        NCOLL "CXL_NCOLL"
        BARRIER "CXL_BARRIER"
        BCAST "CXL_BCAST"
        REDUCE "CXL_REDUCE"
        ALLREDUCE "CXL_ALLREDUCE"
        ALLGATHER "CXL_ALLGATHER"
        ALLGATHERV "CXL_ALLGATHERV"
        GATHER "CXL_GATHER"
        GATHERV "CXL_GATHERV"
        SCATTER "CXL_SCATTER"
        SCATTERV "CXL_SCATTERV"
        ALLTOALL "CXL_ALLTOALL"
        ALLTOALLV "CXL_ALLTOALLV"
        REDUCE_SCATTER_BLOCK "CXL_REDUCE_SCATTER_BLOCK"
        REDUCE_SCATTER "CXL_REDUCE_SCATTER"
        SCAN "CXL_SCAN"
        EXSCAN "CXL_EXSCAN"
        V_STREAM "CXL_V_STREAM"
        V_BIGCHUNK "CXL_V_BIGCHUNK"
        V_RSAG "CXL_V_RSAG"
        V_FLAT "CXL_V_FLAT"
        NVARIANTS "CXL_NVARIANTS"
        CXL_PATH_NEW
        CXL_PATH_SLOW
        FOLLOW "CXL_PATH_FOLLOW"
        CXL_PATH_MPI
        CXL_PATH_POOL
        CXL_PATH_MAX
        CXL_NCLASSES
    const uint64_t CXL_MAX_VARIES
    const char *cxl_collective_names[]
    const char *cxl_variant_names[]
    int cxl_size_class(int64_t nbytes)


#: The intercepted collectives by index (cxlmpi.config.COLLECTIVES).
COLLECTIVES = tuple(cxl_collective_names[i].decode() for i in range(NCOLL))
#: Variant flags of a pool call by name (a path code is POOL_PATH + flags).
VARIANT_FLAGS = {cxl_variant_names[i].decode(): 1 << i for i in range(NVARIANTS)}
#: Path codes (cxlmpi.select's names): a class no call has met yet (NEW: its
#: first call opens a timed run on MPI), no decision (SLOW: ask the
#: selector), stock MPI, the pool (+ variant flags: the pool with those), the
#: pool with every flag.
NEW = CXL_PATH_NEW
SLOW = CXL_PATH_SLOW
MPI_PATH = CXL_PATH_MPI
POOL_PATH = CXL_PATH_POOL
MAX_PATH = CXL_PATH_MAX
#: The largest block of a posted v-collective whose ranks cannot know it
#: (Igatherv, Iscatterv, Ialltoallv: only some hold every count): its
#: worker learns it in a header step of its own (pool/worker.pxi).
MAX_VARIES = CXL_MAX_VARIES
#: Size classes of adaptive selection's route table.
NCLASSES = CXL_NCLASSES


def size_class(nbytes: int) -> int:
    """The size class of a message of `nbytes` bytes: floor(log2(nbytes)),
    0 for 0 and 1; NCLASSES for a size past the table (2**63 and more)."""
    return CXL_NCLASSES if nbytes >= 1 << 63 else cxl_size_class(nbytes)

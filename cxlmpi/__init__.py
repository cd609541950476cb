"""cxlmpi: MPI collectives through shared (CXL) memory for mpi4py programs.

Large collectives of a wrapped communicator run in a memory pool that every
rank of the pool group maps; everything else goes to MPI unchanged.

    import cxlmpi
    comm = cxlmpi.wrap(MPI.COMM_WORLD)   # one communicator
    cxlmpi.patch()                       # or MPI.COMM_WORLD itself
    # or: import cxlmpi.auto;  or: mpiexec -n 4 python -m cxlmpi app.py
"""

from __future__ import annotations

# First: starts MPI if nothing has (cxlmpi.launch.startup).
from .launch import startup  # noqa: F401

# isort: split
from ._version import __version__
from .communicator.cxlcomm import CXLComm, wrap
from .communicator.stats import install_stats_hook, stats
from .communicator.stats import reset as reset_stats
from .errors import (
    CXLMPIConfigError,
    CXLMPIError,
    CXLMPIMessageError,
    CXLMPIMismatchError,
    CXLMPIPeerError,
    CXLMPIPoolError,
    CXLMPITimeoutError,
)
from .launch.entry import is_patched, patch, unpatch

_ARRAYS = ("empty", "zeros", "empty_like", "zeros_like", "asarray", "is_resident",
           "write_back", "invalidate")


def __getattr__(name: str):
    # cxlmpi.empty & co. import NumPy on first use, not with cxlmpi: a
    # program may still set OMP_NUM_THREADS & co. before NumPy (and its BLAS
    # thread pool) starts - with two BLAS threads per rank on a node full of
    # ranks, a training loop ran 5-20x slower.
    if name in _ARRAYS:
        from .resident import arrays

        return getattr(arrays, name)
    raise AttributeError(f"module 'cxlmpi' has no attribute {name!r}")


__all__ = [
    "CXLComm",
    "wrap",
    "patch",
    "unpatch",
    "is_patched",
    "stats",
    "reset_stats",
    "CXLMPIError",
    "CXLMPIConfigError",
    "CXLMPIMessageError",
    "CXLMPITimeoutError",
    "CXLMPIPeerError",
    "CXLMPIPoolError",
    "CXLMPIMismatchError",
    "install_stats_hook",
    "empty",
    "zeros",
    "empty_like",
    "zeros_like",
    "asarray",
    "is_resident",
    "write_back",
    "invalidate",
    "__version__",
]

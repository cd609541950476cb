"""cxlmpi: MPI collectives through shared (CXL) memory for mpi4py programs.

Large collectives of a wrapped communicator run in a memory pool that every
rank of the pool group maps; everything else goes to MPI unchanged.

    import cxlmpi
    comm = cxlmpi.wrap(MPI.COMM_WORLD)   # one communicator
    cxlmpi.patch()                       # or MPI.COMM_WORLD itself
    # or: import cxlmpi.auto;  or: mpiexec -n 4 python -m cxlmpi app.py
"""

from __future__ import annotations

from ._version import __version__
from .errors import (
    CXLMPIConfigError,
    CXLMPIError,
    CXLMPIMessageError,
    CXLMPIMismatchError,
    CXLMPIPeerError,
    CXLMPIPoolError,
    CXLMPITimeoutError,
)

# This process's identity and heartbeat in the pool's control lines, for
# every user of cxlmpi._pool (set as it loads; needs no MPI).
from .memory import partitions as _identity  # noqa: F401

# Where each name of the API lives, imported on first use: importing cxlmpi
# neither starts MPI (its first use does, cxlmpi.startup) nor
# imports NumPy - a program may still set mpi4py.rc, and OMP_NUM_THREADS &
# co. before NumPy's BLAS thread pool starts (with two BLAS threads per
# rank on a node full of ranks, a training loop ran 5-20x slower).
_HOMES = {
    "CXLComm": "communicator.cxlcomm", "wrap": "communicator.cxlcomm",
    "install_stats_hook": "communicator.stats", "stats": "communicator.stats",
    "reset_stats": "communicator.stats",
    "patch": "launch.entry", "unpatch": "launch.entry", "is_patched": "launch.entry",
    **dict.fromkeys(("empty", "zeros", "empty_like", "zeros_like", "asarray",
                     "is_resident", "write_back", "invalidate"), "resident.arrays"),
}


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'cxlmpi' has no attribute {name!r}")
    from importlib import import_module

    module = import_module(f".{home}", __name__)
    value = getattr(module, "reset" if name == "reset_stats" else name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


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

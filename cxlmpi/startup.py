"""MPI started on the program's behalf.

A program that starts MPI itself (``mpi4py.rc.initialize = False``, then
``MPI.Init_thread()``) may use cxlmpi first (``cxlmpi.wrap``,
``import cxlmpi.auto``): cxlmpi's modules look MPI up as they load,
which MPI allows only once it is initialized (MPICH aborts the process
otherwise).  So cxlmpi starts MPI when it is not
started yet - as mpi4py itself would, by ``mpi4py.rc.threads`` and
``mpi4py.rc.thread_level`` - and the program's own ``MPI.Init()`` and
``MPI.Init_thread()`` then find it started and return as if they had
started it.  ``Init_thread(required)`` gives the level MPI provides, which
may be above `required` (as MPI allows): set ``mpi4py.rc.thread_level``
before using cxlmpi, or MPI4PY_RC_THREAD_LEVEL in the environment, to
ask for less.  A reference to the stock ``Init_thread`` taken before
that still fails ("more than once").  Importing this module does it: each
of cxlmpi's packages that looks MPI up imports it first.  ``import cxlmpi``
alone does not (its names load on first use), and ``python -m cxlmpi``
leaves starting MPI to the program (cxlmpi.launch.hook).
"""

from __future__ import annotations

import mpi4py
from mpi4py import MPI

__all__ = ["ensure_initialized", "take_over_init"]

_LEVELS = {"single": MPI.THREAD_SINGLE, "funneled": MPI.THREAD_FUNNELED,
           "serialized": MPI.THREAD_SERIALIZED, "multiple": MPI.THREAD_MULTIPLE}
_stock_init = MPI.Init
_stock_init_thread = MPI.Init_thread


def ensure_initialized() -> None:
    """Start MPI if nothing has (before it is finalized)."""
    if MPI.Is_initialized() or MPI.Is_finalized():
        return
    if mpi4py.rc.threads:
        _stock_init_thread(_LEVELS.get(str(mpi4py.rc.thread_level).lower(),
                                       MPI.THREAD_MULTIPLE))
    else:
        _stock_init()
    take_over_init()


def take_over_init() -> None:
    """The program's MPI.Init() and MPI.Init_thread() find MPI started on
    its behalf, and return as if they had started it."""
    MPI.Init = _init
    MPI.Init_thread = _init_thread


def _init() -> None:
    if not MPI.Is_initialized() or MPI.Is_finalized():
        _stock_init()                  # (after Finalize: MPI says what is wrong)


def _init_thread(required: int = MPI.THREAD_MULTIPLE) -> int:
    if not MPI.Is_initialized() or MPI.Is_finalized():
        return _stock_init_thread(required)
    return MPI.Query_thread()


ensure_initialized()

"""Putting wrapped communicators where a program will find them."""

from __future__ import annotations

import copyreg

from mpi4py import MPI

from .comm import _STOCK_CONSTANTS as _ORIGINAL
from .comm import CXLComm, predefined, reduce_stock

__all__ = ["patch", "unpatch", "is_patched", "predefined"]

_wrapped = predefined


def patch() -> None:
    """Replace MPI.COMM_WORLD and MPI.COMM_SELF with wrapped communicators.

    Code that looks them up afterwards (``MPI.COMM_WORLD``, ``from mpi4py.MPI
    import COMM_WORLD``) gets the wrapped ones; they compare equal to the
    constants they replace.  Idempotent."""
    for name in _ORIGINAL:
        setattr(MPI, name, _wrapped(name))
    # Stock pickles its constants by name, and the name now gives the
    # wrapped ones: plain Intracomm objects pickle through cxlmpi meanwhile.
    copyreg.pickle(MPI.Intracomm, reduce_stock)
    from . import config, install_stats_hook

    install_stats_hook()
    cfg = config.get()
    if cfg.alloc and not cfg.disable:  # collective: every rank patches
        from .alloc import enable

        enable(_wrapped("COMM_WORLD"))


def unpatch() -> None:
    """Put the stock MPI.COMM_WORLD and MPI.COMM_SELF back."""
    for name, comm in _ORIGINAL.items():
        setattr(MPI, name, comm)
    if copyreg.dispatch_table.get(MPI.Intracomm) is reduce_stock:
        del copyreg.dispatch_table[MPI.Intracomm]


def is_patched() -> bool:
    """Whether MPI.COMM_WORLD is the wrapped one."""
    return isinstance(MPI.COMM_WORLD, CXLComm)



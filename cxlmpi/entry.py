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

    Collective over COMM_WORLD the first time: every rank must patch (it
    checks that all ranks agree on the settings that choose a call's path).
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
    _check_settings(cfg)
    if cfg.alloc and not cfg.disable:  # collective: every rank patches
        from .alloc import enable

        enable(_wrapped("COMM_WORLD"))


_checked: object = None  # the settings checked already


def _check_settings(cfg: object) -> None:
    """Collective over COMM_WORLD, once per reading of the settings: every
    rank must agree on the settings of config.AGREED before any call can
    take a path that depends on them (a program's first collective may
    never set a pool up, where the check would otherwise run)."""
    global _checked
    if _checked is cfg or not MPI.Is_initialized() or MPI.Is_finalized():
        return
    world = _ORIGINAL["COMM_WORLD"]
    if world.Get_size() > 1:
        from .group import check_agreed

        check_agreed(world, cfg)
    _checked = cfg


def unpatch() -> None:
    """Put the stock MPI.COMM_WORLD and MPI.COMM_SELF back."""
    for name, comm in _ORIGINAL.items():
        setattr(MPI, name, comm)
    if copyreg.dispatch_table.get(MPI.Intracomm) is reduce_stock:
        del copyreg.dispatch_table[MPI.Intracomm]


def is_patched() -> bool:
    """Whether MPI.COMM_WORLD is the wrapped one."""
    return isinstance(MPI.COMM_WORLD, CXLComm)



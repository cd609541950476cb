"""Putting wrapped communicators where a program will find them."""

from __future__ import annotations

from mpi4py import MPI

from .comm import CXLComm

__all__ = ["patch", "unpatch", "is_patched", "predefined"]

_ORIGINAL = {"COMM_WORLD": MPI.COMM_WORLD, "COMM_SELF": MPI.COMM_SELF}
_WRAPPED: dict[str, CXLComm] = {}


def _wrapped(name: str) -> CXLComm:
    comm = _WRAPPED.get(name)
    if comm is None:
        comm = _WRAPPED[name] = CXLComm(_ORIGINAL[name])
    return comm


def patch() -> None:
    """Replace MPI.COMM_WORLD and MPI.COMM_SELF with wrapped communicators.

    Code that looks them up afterwards (``MPI.COMM_WORLD``, ``from mpi4py.MPI
    import COMM_WORLD``) gets the wrapped ones; they compare equal to the
    constants they replace.  Idempotent."""
    for name in _ORIGINAL:
        setattr(MPI, name, _wrapped(name))
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


def is_patched() -> bool:
    """Whether MPI.COMM_WORLD is the wrapped one."""
    return isinstance(MPI.COMM_WORLD, CXLComm)


def predefined(name: str) -> CXLComm:
    """The wrapped COMM_WORLD or COMM_SELF (used when unpickling them)."""
    return _wrapped(name)

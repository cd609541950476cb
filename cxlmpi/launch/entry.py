"""Putting wrapped communicators where a program will find them."""

from __future__ import annotations

import copyreg
import sys
import warnings
from collections.abc import Iterator
from types import FrameType
from typing import TYPE_CHECKING

from .. import startup  # noqa: F401  (first: MPI is started before cxlmpi looks it up)

# isort: split
from mpi4py import MPI

from ..communicator.cxlcomm import _STOCK_CONSTANTS as _ORIGINAL
from ..communicator.cxlcomm import CXLComm, check_settings, predefined, reduce_stock
from ..pools import agree

if TYPE_CHECKING:
    from ..config import Config

__all__ = ["patch", "unpatch", "is_patched", "predefined"]

_wrapped = predefined


def patch() -> None:
    """Replace MPI.COMM_WORLD and MPI.COMM_SELF with wrapped communicators.

    Collective over COMM_WORLD the first time: every rank must patch (it
    checks that all ranks agree on the settings that choose a call's path).
    Code that looks them up afterwards (``MPI.COMM_WORLD``, ``from mpi4py.MPI
    import COMM_WORLD``) gets the wrapped ones; they compare equal to the
    constants they replace.  A stock COMM_WORLD or COMM_SELF the program
    already holds (``comm = MPI.COMM_WORLD`` before patching) stays plain:
    patch() warns once when it finds one in ``__main__`` or in the code that
    called it (see `_held_stock_communicators`).  Idempotent."""
    _warn_if_held(sys._getframe(1))
    for name in _ORIGINAL:
        setattr(MPI, name, _wrapped(name))
    # Stock pickles its constants by name, and the name now gives the
    # wrapped ones: plain Intracomm objects pickle through cxlmpi meanwhile.
    copyreg.pickle(MPI.Intracomm, reduce_stock)
    from .. import config
    from ..communicator.stats import install_stats_hook

    install_stats_hook()
    cfg = config.get()
    check_settings(cfg)
    if not cfg.disable and _alloc_wanted(cfg):  # collective: every rank patches
        from ..resident.alloc import enable

        enable(_wrapped("COMM_WORLD"))


def _alloc_wanted(cfg: Config) -> bool:
    """CXLMPI_ALLOC, with auto settled alike on every rank (collective): on
    where every rank's pool memory gets huge pages, on which NumPy code runs
    as fast as on its own arrays."""
    if cfg.alloc is not None:
        return bool(cfg.alloc)
    from ..memory.pages import huge_pages

    return all(agree.allgather(_ORIGINAL["COMM_WORLD"], huge_pages(cfg.pool)[0]))


_warned = False  # the warning about communicators taken too early was given

# Frames of these packages are the machinery between the program and
# patch() (``import cxlmpi.auto`` runs through importlib), not the program.
_MACHINERY = ("cxlmpi", "importlib", "mpi4py", "runpy")


def _is_machinery(frame: FrameType) -> bool:
    return str(frame.f_globals.get("__name__", "")).split(".")[0] in _MACHINERY


def _program_namespaces(frame: FrameType | None) -> Iterator[tuple[str, dict]]:
    """(where, namespace) of the program's code that may hold communicators:
    ``__main__``'s globals, then the globals and locals of every caller on
    the stack outside cxlmpi, mpi4py and the import machinery."""
    main = sys.modules.get("__main__")
    if main is not None:
        yield "__main__", vars(main)
    while frame is not None:
        module = str(frame.f_globals.get("__name__", ""))
        if not _is_machinery(frame):
            yield module, frame.f_globals
            if frame.f_locals is not frame.f_globals:
                yield f"{module}.{frame.f_code.co_name}()", frame.f_locals
        frame = frame.f_back


def _held_stock_communicators(frame: FrameType | None) -> list[str]:
    """Names ("__main__.comm") of plain communicators on the handle of
    COMM_WORLD or COMM_SELF that the program holds in the namespaces of
    `_program_namespaces(frame)`: patching cannot reach them."""
    handles = {comm.handle for comm in _ORIGINAL.values()}
    found: list[str] = []
    for where, namespace in _program_namespaces(frame):
        for name, value in list(namespace.items()):
            if (isinstance(value, MPI.Comm) and not isinstance(value, CXLComm)
                    and value.handle in handles):
                label = f"{where}.{name}"
                if label not in found:
                    found.append(label)
    return found


def _warn_if_held(frame: FrameType | None) -> None:
    """Warn once when the program holds a stock COMM_WORLD/COMM_SELF that
    patching leaves plain (its collectives silently stay with MPI)."""
    global _warned
    if _warned or is_patched():
        return
    held = _held_stock_communicators(frame)
    if not held:
        return
    _warned = True
    message = (
        f"cxlmpi: {', '.join(held)} was taken from MPI before cxlmpi patched "
        "MPI.COMM_WORLD/COMM_SELF and stays a plain communicator: its collectives "
        "go to MPI, not the pool. Import cxlmpi.auto (or call cxlmpi.patch()) "
        "before taking MPI.COMM_WORLD, or use cxlmpi.wrap(comm).")
    # Point at the program's line that patched, past cxlmpi and importlib.
    while frame is not None and _is_machinery(frame):
        frame = frame.f_back
    if frame is None:
        warnings.warn(message, UserWarning, stacklevel=3)
        return
    warnings.warn_explicit(message, UserWarning, frame.f_code.co_filename, frame.f_lineno,
                           module=str(frame.f_globals.get("__name__", "")),
                           registry=frame.f_globals.setdefault("__warningregistry__", {}))


def unpatch() -> None:
    """Put the stock MPI.COMM_WORLD and MPI.COMM_SELF back."""
    for name, comm in _ORIGINAL.items():
        setattr(MPI, name, comm)
    if copyreg.dispatch_table.get(MPI.Intracomm) is reduce_stock:
        del copyreg.dispatch_table[MPI.Intracomm]


def is_patched() -> bool:
    """Whether MPI.COMM_WORLD is the wrapped one."""
    return isinstance(MPI.COMM_WORLD, CXLComm)



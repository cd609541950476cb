"""Patching when the program starts MPI, not before (``python -m cxlmpi``).

``python -m mpi4py`` imports nothing of MPI before the program: the
program's ``mpi4py.rc`` settings (``initialize``, ``threads``,
``thread_level``, ``errors``, ...) and its own ``MPI.Init_thread`` apply as
it wrote them.  The runner keeps that: `watch()` puts a finder in front of
the import system that sees the program's ``import mpi4py.MPI`` and patches
COMM_WORLD and COMM_SELF as soon as MPI is started:

- right after the import, where mpi4py started MPI there (its default);
- after the program's own ``MPI.Init``/``MPI.Init_thread`` returns, where it
  set ``mpi4py.rc.initialize = False``; a program that never starts MPI
  (MPI-4 sessions only) is never patched.

cxlmpi's own modules import mpi4py.MPI as they load, and patching needs
them whole: where the program imports cxlmpi before mpi4py.MPI, the patch
waits until the last cxlmpi module being imported has loaded.
"""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

__all__ = ["watch"]

_MPI = "mpi4py.MPI"


class _State:
    loading = 0        # cxlmpi modules being imported now
    pending = False    # MPI is started; patch when `loading` drops to 0
    done = False
    stock: dict[str, Callable[..., Any]] = {}   # MPI.Init/Init_thread, by name
    ours: dict[str, Callable[..., Any]] = {}    # what stands in for them


def watch() -> None:
    """Patch COMM_WORLD and COMM_SELF once the program has started MPI."""
    if sys.modules.get(_MPI) is not None:  # (something imported it already)
        _mpi_loaded(sys.modules[_MPI])
        return
    sys.meta_path.insert(0, _Finder())


def _mpi_loaded(mpi: ModuleType) -> None:
    if mpi.Is_initialized() and not mpi.Is_finalized():
        _started()
        return
    for name in ("Init", "Init_thread"):  # the program starts MPI itself
        _State.stock[name] = getattr(mpi, name)
        _State.ours[name] = _after(_State.stock[name])
        setattr(mpi, name, _State.ours[name])


def _after(stock: Callable[..., Any]) -> Callable[..., Any]:
    def init(*args: Any, **kwargs: Any) -> Any:
        result = stock(*args, **kwargs)
        _started()
        return result

    init.__doc__ = stock.__doc__
    return init


def _started() -> None:
    _State.pending = True
    if _State.loading == 0:
        _patch()


def _patch() -> None:
    if _State.done:
        return
    _State.done = True
    mpi = sys.modules[_MPI]
    for name, stock in _State.stock.items():
        if getattr(mpi, name) is _State.ours[name]:  # (not taken over by cxlmpi.startup)
            setattr(mpi, name, stock)
    from .entry import patch

    patch()


class _Finder(importlib.abc.MetaPathFinder):
    """Hands mpi4py.MPI and cxlmpi's modules to `_Loader`, found as the
    finders after it would find them."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname != _MPI and not fullname.startswith("cxlmpi."):
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _Loader(spec.loader, fullname == _MPI)
                return spec
        return None


class _Loader(importlib.abc.Loader):
    """The module's own loader, counting cxlmpi's modules in loading."""

    def __init__(self, loader: Any, is_mpi: bool) -> None:
        self._loader = loader
        self._is_mpi = is_mpi

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        if self._is_mpi:
            self._loader.exec_module(module)
            _mpi_loaded(module)
            return
        _State.loading += 1
        try:
            self._loader.exec_module(module)
        finally:
            _State.loading -= 1
        if _State.loading == 0 and _State.pending:
            _patch()

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, ...
        return getattr(self._loader, name)

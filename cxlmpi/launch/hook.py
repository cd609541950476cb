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
waits until the last cxlmpi module this thread is importing has loaded.
"""

from __future__ import annotations

import functools
import importlib.abc
import sys
import threading
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

__all__ = ["watch", "mpi_module", "stop"]

_MPI = "mpi4py.MPI"


class _State:
    lock = threading.RLock()      # (one thread patches; the others wait for it)
    threads = threading.local()   # .loading: the cxlmpi modules it imports now
    pending = False    # MPI is started; patch when this thread imports none
    done = False
    mpi: ModuleType | None = None   # (kept: a failed patch fails its import too)
    stock: dict[str, Callable[..., Any]] = {}   # MPI.Init/Init_thread, by name
    ours: dict[str, Callable[..., Any]] = {}    # what stands in for them


def watch() -> None:
    """Patch COMM_WORLD and COMM_SELF once the program has started MPI."""
    if any(isinstance(finder, _Finder) for finder in sys.meta_path):
        return   # (the runner run again: python -m cxlmpi -m cxlmpi ...)
    if sys.modules.get(_MPI) is not None:  # (something imported it already)
        _mpi_loaded(sys.modules[_MPI])
        return
    sys.meta_path.insert(0, _Finder())


def mpi_module() -> ModuleType | None:
    """mpi4py.MPI, once loaded (even where its import failed in the patch)."""
    return sys.modules.get(_MPI) or _State.mpi


def _loading() -> int:
    return getattr(_State.threads, "loading", 0)


def _mpi_loaded(mpi: ModuleType) -> None:
    _State.mpi = mpi
    if mpi.Is_initialized() and not mpi.Is_finalized():
        _started()
        return
    for name in ("Init", "Init_thread"):  # the program starts MPI itself
        _State.stock[name] = getattr(mpi, name)
        _State.ours[name] = _after(_State.stock[name])
        setattr(mpi, name, _State.ours[name])


def _after(stock: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(stock)
    def init(*args: Any, **kwargs: Any) -> Any:
        result = stock(*args, **kwargs)
        _started()
        return result

    return init


def _started() -> None:
    _State.pending = True
    if _loading() == 0:
        _patch()


def _patch() -> None:
    with _State.lock:
        if _State.done:
            return
        stop()
        from .entry import patch

        patch()


def stop() -> None:
    """Patch nothing (any more): the stock MPI.Init and MPI.Init_thread back."""
    _State.done = True
    mpi = _State.mpi
    for name, stock in _State.stock.items():
        if mpi is not None and getattr(mpi, name) is _State.ours[name]:
            setattr(mpi, name, stock)   # (not where cxlmpi.startup took it over)


class _Finder(importlib.abc.MetaPathFinder):
    """Hands mpi4py.MPI and cxlmpi's modules to `_Loader`, found as the
    finders after it would find them."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname != _MPI and not fullname.startswith("cxlmpi."):
            return None
        for finder in sys.meta_path:
            if isinstance(finder, _Finder) or not hasattr(finder, "find_spec"):
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
        threads = _State.threads
        threads.loading = _loading() + 1
        try:
            self._loader.exec_module(module)
        finally:
            threads.loading -= 1
        if threads.loading == 0 and _State.pending:
            _patch()

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, ...
        return getattr(self._loader, name)

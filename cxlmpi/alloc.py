"""``cxlmpi.alloc``: the NumPy allocation hook under the name the docs
gives it (``cxlmpi.alloc.enable()``, ``.stats()``); the hook itself is
:mod:`cxlmpi.resident.alloc`."""

from .resident.alloc import active, disable, enable, stats

__all__ = ["enable", "disable", "active", "stats"]

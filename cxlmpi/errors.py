"""The exceptions cxlmpi raises: one small hierarchy under CXLMPIError."""

from __future__ import annotations

__all__ = [
    "CXLMPIError",
    "CXLMPIConfigError",
    "CXLMPIMessageError",
    "CXLMPITimeoutError",
    "CXLMPIPeerError",
    "CXLMPIPoolError",
    "CXLMPIMismatchError",
]


class CXLMPIError(Exception):
    """Base of every error cxlmpi raises itself."""


class CXLMPIConfigError(CXLMPIError, ValueError):
    """A CXLMPI_* setting is malformed, or differs between ranks."""


class CXLMPIMessageError(CXLMPIError, ValueError):
    """A message's count or displacement puts it outside its buffer (or
    makes its size in bytes overflow): MPI would read or write past it."""


class CXLMPITimeoutError(CXLMPIError, TimeoutError):
    """A pool collective waited longer than CXLMPI_TIMEOUT for some ranks."""


class CXLMPIPeerError(CXLMPIError, ConnectionError):
    """A rank of the pool group died in the middle of a pool collective."""


class CXLMPIPoolError(CXLMPIError, OSError):
    """The pool could not be created, opened or mapped."""


class CXLMPIMismatchError(CXLMPIError, ValueError):
    """The ranks' calls of one collective do not match (message sizes,
    roots, ops, types or counts differ), which MPI forbids: raised on every
    rank of the pool, which stays usable."""

"""Dispatch: pool or pass-through, decided alike on every rank.

A call goes through the pool only when every argument it depends on is one
MPI requires to match on all ranks: the message size in bytes (count x type
size: type signatures must match), the element type of a reduction (ditto),
the op and the root (must be the same everywhere), the communicator's size.
Local properties (where a buffer lives, which message form a rank used) never
change the decision.
"""

from __future__ import annotations

from typing import Any

from mpi4py import MPI

from . import _message
from ._pool import OP_CODES, TYPE_CODES, reducer_defined

__all__ = ["parse", "op_code", "reduction_ok", "Message"]

Message = _message.Message

# Predefined MPI datatypes by kind; the type code follows from kind and size.
_SIGNED = ("SIGNED_CHAR", "SHORT", "INT", "LONG", "LONG_LONG", "INT8_T",
           "INT16_T", "INT32_T", "INT64_T", "AINT", "OFFSET", "COUNT")
_UNSIGNED = ("UNSIGNED_CHAR", "UNSIGNED_SHORT", "UNSIGNED", "UNSIGNED_LONG",
             "UNSIGNED_LONG_LONG", "UINT8_T", "UINT16_T", "UINT32_T",
             "UINT64_T")
_FLOAT = ("FLOAT", "DOUBLE")
_COMPLEX = ("C_FLOAT_COMPLEX", "C_DOUBLE_COMPLEX")
# Data movement only: no reduction is defined on text characters.
_OPAQUE = ("CHAR", "WCHAR")
MOVE_ONLY = -1


def _type_info() -> dict[int, tuple[int, int]]:
    info: dict[int, tuple[int, int]] = {}

    def add(names: tuple[str, ...], prefix: str | None) -> None:
        for name in names:
            dtype = getattr(MPI, name, None)
            if dtype is None or dtype == MPI.DATATYPE_NULL:
                continue
            size = dtype.Get_size()
            if prefix is None:
                code = MOVE_ONLY
            else:
                bits = size * 8 if prefix != "c" else size * 4
                code = TYPE_CODES.get(f"{prefix}{bits}", MOVE_ONLY)
            info[dtype.handle] = (code, size)

    add(_SIGNED, "i")
    add(_UNSIGNED, "u")
    add(_FLOAT, "f")
    add(_COMPLEX, "c")
    add(_OPAQUE, None)
    info[MPI.C_BOOL.handle] = (TYPE_CODES["bool"], MPI.C_BOOL.Get_size())
    info[MPI.BYTE.handle] = (TYPE_CODES["byte"], 1)
    if MPI.C_BOOL.Get_size() != 1:  # pragma: no cover - exotic ABI
        del info[MPI.C_BOOL.handle]
    return info


_OPS: dict[int, int] = {getattr(MPI, name).handle: code
                        for name, code in OP_CODES.items()}

_message.configure(_type_info(), MPI._typedict, MPI.Datatype, MPI.BYTE,
                   MPI.BOTTOM)

parse = _message.parse


def op_code(op: Any) -> int | None:
    """Kernel op code of a predefined MPI op, or None (user-defined ops,
    MINLOC/MAXLOC, REPLACE, NO_OP pass through)."""
    if not isinstance(op, MPI.Op):
        return None
    return _OPS.get(op.handle)


def reduction_ok(op: int, tcode: int) -> bool:
    """Whether the kernels define `op` on type `tcode` (else MPI reports)."""
    return tcode >= 0 and reducer_defined(op, tcode)


def overlap(a: Message, b: Message) -> bool:
    """Whether two messages' byte ranges overlap (aliased buffers)."""
    a0, b0 = a.address, b.address
    return a0 < b0 + b.nbytes and b0 < a0 + a.nbytes and a.nbytes and b.nbytes

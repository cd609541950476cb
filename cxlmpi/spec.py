"""What CXLMPI_POOL names (shm, numa:N, file:PATH, dax:DEVICE), parsed:
the one piece of cxlmpi.memory.backends that the settings need to check a value,
kept apart so that reading the settings imports no backend."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

__all__ = ["PoolSpec", "parse_spec"]


@dataclass(frozen=True)
class PoolSpec:
    """A parsed CXLMPI_POOL: `kind` is shm, numa, file or dax."""

    kind: str
    path: str = ""
    node: int = -1

    def __str__(self) -> str:
        if self.kind == "shm":
            return "shm"
        if self.kind == "numa":
            return f"numa:{self.node}"
        return f"{self.kind}:{self.path}"

    @property
    def shared_file(self) -> bool:
        """Whether pools are partitions of one file or device."""
        return self.kind in ("file", "dax")


def parse_spec(text: str) -> PoolSpec:
    """PoolSpec from 'shm', 'numa:1', 'file:/dev/shm/pool', 'dax:/dev/dax0.0'."""
    s = text.strip()
    kind, _, arg = s.partition(":")
    if kind == "shm" and not arg:
        return PoolSpec("shm")
    if kind == "numa" and re.fullmatch(r"\d+", arg):
        return PoolSpec("numa", node=int(arg))
    if kind in ("file", "dax") and arg:
        return PoolSpec(kind, path=os.path.abspath(arg))
    raise ValueError(f"not a pool: {text!r} (use shm, numa:N, file:PATH or "
                     f"dax:/dev/daxX.Y)")

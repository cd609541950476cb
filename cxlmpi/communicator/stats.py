"""Per-process counters of every intercepted collective."""

from __future__ import annotations

import sys
from typing import TextIO

__all__ = ["stats", "reset", "format_table", "print_at_exit", "install_stats_hook"]

#: What stats() appends to an object (pickle) collective's name: comm.bcast
#: is "bcast(obj)", comm.Bcast is "bcast".
OBJECT_SUFFIX = "(obj)"


def stats() -> dict[str, dict[str, float]]:
    """Figures of this process, keyed by lower-case collective name; the
    object collectives (``comm.bcast``, ``comm.allreduce``, ...) as
    ``"bcast(obj)"``, ``"allreduce(obj)"``, ...

    Each entry: ``pool_calls``, ``passthrough_calls``, ``nbytes`` (bytes moved
    through the pool; for objects, the frames of all ranks together),
    ``seconds`` (time in pool calls; with CXLMPI_STATS=1 in passed-through
    calls too -- timing those costs two clock reads per small call, so it is
    left off otherwise), ``learning_calls`` (calls, of either path, that
    adaptive selection timed to learn which path is fastest: exploring a
    new size or re-checking a decision; see cxlmpi.select) and
    ``zerocopy_calls`` (pool calls that read or wrote the ranks' own
    buffers in place: pool-resident arrays, no copy through the halves).
    The nonblocking object collectives (``comm.ibcast`` & co., an extension
    of mpi4py's API) appear as ``"ibcast(obj)"``, ...: ``pool_calls`` where
    this rank wrote a large pickle to the node heap or took one from it
    (CXLMPI_OBJECTS=1; ``nbytes``: those pickles' bytes, this rank's
    alone), ``passthrough_calls`` otherwise (``seconds`` with
    CXLMPI_STATS=1: posting, and their requests' own ``wait``/``test``);
    ``comm.ibarrier()``
    is ``Ibarrier`` and counts as ``"ibarrier"``.
    The nonblocking forms appear as ``"iallreduce"``, ``"ibcast"``, ...:
    ``pool_calls`` counts the calls posted to the pool (nonblocking ones and
    each Start of a persistent one), ``passthrough_calls`` those that went
    to MPI (a persistent one once, at its ``*_init``), ``seconds`` the time
    cxlmpi's own ``Wait``/``Test`` of their requests, or
    ``MPI.Request.Waitall`` on a list holding them, waited for the pool's
    worker (``Waitany``, ``Waitsome`` and ``Testall`` wait in MPI),
    ``zerocopy_calls`` the posted calls that ran zero-copy (counted as
    they end in the pool).
    The entry ``"coherence"`` counts ``flushed_lines``: cache lines flushed
    or invalidated for software coherence (CXLMPI_COHERENCE=sw or emulate, or a pool spanning hosts;
    0 in hw mode), and under CXLMPI_COHERENCE=emulate ``emulated``: the
    emulator's ``writebacks``, ``invalidates``, ``evictions`` and
    ``dropped`` lines (cxlmpi._pool.emulation())."""
    from .._pool import emulation, flushed_lines
    from .._shim import nonblocking_rows, stats_rows
    from .objects import figures
    from .objects_progress import figures as nonblocking_figures

    rows = dict(stats_rows())
    rows.update((name + OBJECT_SUFFIX, row) for name, row in figures().items())
    rows.update((name + OBJECT_SUFFIX, row) for name, row in nonblocking_figures().items())
    rows.update(("i" + name, row) for name, row in nonblocking_rows().items())
    out: dict[str, dict[str, float]] = {
        name: {"pool_calls": row[0], "passthrough_calls": row[1],
               "nbytes": row[2], "seconds": row[3],
               "learning_calls": row[4] if len(row) > 4 else 0,
               "zerocopy_calls": row[5] if len(row) > 5 else 0}
        for name, row in sorted(rows.items())
    }
    out["coherence"] = {"flushed_lines": int(flushed_lines())}
    emulated = emulation()
    if emulated["writebacks"] or emulated["invalidates"] or emulated["pools"]:
        out["coherence"]["emulated"] = {k: int(v) for k, v in emulated.items() if k != "pools"}
    return out


def reset() -> None:
    """Forget every count."""
    from .._shim import nonblocking_reset, stats_reset
    from .objects import reset_figures
    from .objects_progress import reset_figures as reset_nonblocking_figures

    stats_reset()
    nonblocking_reset()
    reset_figures()
    reset_nonblocking_figures()


def format_table(figures: dict[str, dict[str, float]] | None = None,
                 title: str = "") -> str:
    """The figures as a text table."""
    figures = stats() if figures is None else figures
    lines = []
    if title:
        lines.append(title)
    width = max(len("allreduce" + OBJECT_SUFFIX), *(len(name) for name in figures))
    lines.append(f"{'collective':<{width}} {'pool':>8} {'passthru':>9} {'learning':>9} "
                 f"{'zerocopy':>9} {'pool MiB':>10} {'seconds':>10}")
    for name, row in figures.items():
        if "pool_calls" not in row or not (row["pool_calls"] or row["passthrough_calls"]):
            continue
        lines.append(f"{name:<{width}} {row['pool_calls']:>8} "
                     f"{row['passthrough_calls']:>9} {row.get('learning_calls', 0):>9} "
                     f"{row.get('zerocopy_calls', 0):>9} "
                     f"{row['nbytes'] / 2**20:>10.1f} {row['seconds']:>10.4f}")
    return "\n".join(lines)


def print_at_exit(rank: int, stream: TextIO = sys.stderr) -> None:
    """Print this rank's table (registered with atexit by CXLMPI_STATS=1)."""
    stream.write(format_table(title=f"cxlmpi stats, rank {rank}:") + "\n")
    stream.flush()


_stats_hooked = False


def install_stats_hook() -> None:
    """With CXLMPI_STATS=1, print this rank's stats table at exit (once)."""
    global _stats_hooked
    from .. import config

    if _stats_hooked or not config.get().stats:
        return
    import atexit

    from mpi4py import MPI

    atexit.register(print_at_exit, MPI.COMM_WORLD.Get_rank())
    _stats_hooked = True

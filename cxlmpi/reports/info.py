"""``python -m cxlmpi --info``: version, MPI library, the pool, CPU features,
every CXLMPI_* variable and which collectives take the pool; ``--info
--markdown``: the reference's tables of settings and options (docs/reference/),
generated from cxlmpi.config.VARIABLES and cxlmpi.launch.command_line.OPTIONS."""

from __future__ import annotations

import os

from mpi4py import MPI

from .. import config
from .._pool import cpu_features
from ..launch.command_line import OPTIONS
from ..memory.pages import huge_pages
from . import admin

__all__ = ["report", "markdown", "POOL_TABLE"]

# Which calls the pool takes, and when (docs/reference/pool.md has it in full).
POOL_TABLE = (
    ("Reduce, Allreduce, Scan, Exscan", "message >= CXLMPI_THRESHOLD, predefined op"),
    ("Reduce_scatter_block, Reduce_scatter", "total >= CXLMPI_THRESHOLD, predefined op, "
     "recvcounts given"),
    ("Bcast, Allgather(v), Alltoall(v), Gather(v), Scatter(v)",
     "sizes in the CXLMPI_TUNING window (below)"),
    ("Gatherv, Scatterv, Alltoallv", "path and length agreed in a header step"),
    ("Barrier", "once the communicator has a pool"),
)


def report() -> str:
    """The --info text: version, MPI library, pool settings, CPU features,
    every variable (its value, default, and whether all ranks must share
    it), unknown CXLMPI_* variables, and the pool's windows."""
    from .._version import __version__

    cfg = config.get()
    # MPICH pads its fields ("MPICH Version:      5.0.2"): one space each.
    lib = " ".join(MPI.Get_library_version().splitlines()[0].split())
    feats = ", ".join(k for k, v in cpu_features().items() if v) or "none"
    lines = [
        f"cxlmpi {__version__}",
        f"mpi4py {__import__('mpi4py').__version__}; MPI library: {lib}",
        f"backend: {cfg.pool}   pool size: {cfg.pool_size} B   pool groups: "
        f"{cfg.pool_groups}   threshold: {cfg.threshold} B   coherence: {cfg.coherence}",
        f"pool memory: {admin.describe(cfg.pool)}",
        f"CPU features: {feats}",
        f"huge pages for pool arrays: {huge_pages(cfg.pool)[1]}",
        f"small calls passing through: {_straight(cfg)}",
        "",
    ]
    rows = [("variable", "value", "default", "ranks",
             "meaning (ranks: same = every rank must have the same value)")]
    for var in config.VARIABLES:
        value = os.environ.get(var.name)
        rows.append((var.name, "(unset)" if value is None else value, var.default or "(none)",
                     _ranks(var), config.plain(var.doc)))
    lines += _columns(rows)
    strays = config.unknown()
    if strays:
        lines.append("")
        lines.append("unknown CXLMPI_* variables (ignored):")
        for name, suggestion in strays:
            lines.append(f"  {name}={os.environ[name]}: "
                         f"{config.describe_unknown(name, suggestion)}")
    lines.append("")
    lines.append("")
    lines.append("through the pool (contiguous predefined-type buffers, ranks that share "
                 "a pool; everything else passes through to MPI):")
    for row in POOL_TABLE:
        lines.append(f"  {row[0]:<56} {row[1]}")
    lines.append(f"  a pool whose ranks run on several hosts: CXLMPI_HOSTS_THRESHOLD "
                 f"({cfg.hosts_threshold} B) in place of CXLMPI_THRESHOLD")
    if cfg.adaptive:
        from ..select import cache

        lines.append("adaptive selection (CXLMPI_TUNING=adaptive): each communicator times "
                     "MPI and the pool's variants per collective and size, and keeps the "
                     "fastest (across pool groups: MPI or the hierarchy).")
        lines += cache.describe_cache(cache.cache_path(cfg))
        cfg = config.Config({**os.environ, "CXLMPI_TUNING": "builtin"})
    lines.append(f"windows (bytes, all blocks together; CXLMPI_TUNING={cfg.tuning}):")
    for name, window in cfg.windows().items():
        shown = "MPI always" if window is None else \
            f"[{window[0]}, {'inf' if window[1] is None else window[1]})"
        lines.append(f"  {name:<22} {shown}")
    return "\n".join(lines)


def _ranks(var: config.Variable) -> str:
    """The ranks column: "same" where every rank must see the same value."""
    return "same" if var.agreed else "any"


def markdown() -> str:
    """The reference's generated tables, each between the comment lines that
    mark it there: every setting (variable, default, ranks, the options
    that set it, meaning), then every option of python -m cxlmpi."""
    settings = ["| variable | default | ranks | option | meaning |", "|---|---|---|---|---|"]
    for var in config.VARIABLES:
        flags = ", ".join(f"`{option.synopsis}`" for option in OPTIONS
                          if option.setting == var.name)
        default = f"`{var.default}`" if var.default else "(none)"
        settings.append(f"| `{var.name}` | {default} | {_ranks(var)} | {flags} | {var.doc} |")
    options = ["| option | meaning |", "|---|---|"]
    options += [f"| `{option.synopsis}` | {option.description} |" for option in OPTIONS]
    return "\n\n".join(_generated(name, rows) for name, rows in
                        (("settings", settings), ("options", options)))


def _generated(name: str, rows: list[str]) -> str:
    return "\n".join([f"<!-- {name}: python -m cxlmpi --info --markdown prints this table; "
                      f"regenerate it, never edit it -->", *rows, f"<!-- end of {name} -->"])


def _straight(cfg: config.Config) -> str:
    """How the calls that pass through reach MPI (see pyx/shim/direct.pxi)."""
    from .. import _shim

    if cfg.disable:
        return "through mpi4py (CXLMPI_DISABLE=1: cxlmpi is off)"
    if _shim.straight_calls()[0]:
        return ("straight to the MPI library's functions (messages of a predefined type; "
                "v-collectives and user-defined ops through mpi4py)")
    return ("through mpi4py (the MPI library's collectives were not found where mpi4py's "
            "calls resolve)")


def _columns(rows: list[tuple[str, ...]]) -> list[str]:
    """Rows as lines whose columns line up (each as wide as its widest
    cell; the last column is left as it is)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return [" ".join(f"{cell:<{width}}" for cell, width in zip(row, widths)) + " " + row[-1]
            for row in rows]

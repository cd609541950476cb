"""``python -m cxlmpi --info``: version, MPI library, the pool, CPU features,
the settings that differ from their defaults and which collectives take the
pool, on a screen; ``--info --all``: every CXLMPI_* variable and the
windows too; ``--info --cache``: the selection cache's entries for this
job (`cache_report`); ``--info --markdown``: the reference's tables of
settings and options (docs/reference/), generated from
cxlmpi.config.VARIABLES and cxlmpi.launch.command_line.OPTIONS;
``--version``: `version_lines`."""

from __future__ import annotations

import os

from mpi4py import MPI

from .. import config
from .._pool import cpu_features
from ..launch.command_line import OPTIONS
from ..memory.pages import huge_pages
from . import admin

__all__ = ["report", "markdown", "version_lines", "cache_report", "POOL_TABLE"]

# Which calls the pool takes, and when (docs/reference/pool.md has it in full).
POOL_TABLE = (
    ("Reduce, Allreduce, Scan, Exscan", "message >= CXLMPI_THRESHOLD, predefined op"),
    ("Reduce_scatter_block, Reduce_scatter", "total >= CXLMPI_THRESHOLD, predefined op, "
     "recvcounts given"),
    ("Bcast, Allgather(v), Alltoall(v), Gather(v), Scatter(v)",
     "sizes in the CXLMPI_TUNING window (below)"),
    ("Gatherv, Scatterv, Alltoallv", "path and length agreed in a header step"),
    ("Barrier", "with CXLMPI_ORDERING=0, once the communicator has a pool"),
    ("nonblocking (Iallreduce, ...) and persistent (Allreduce_init, ...)",
     "as the blocking form, >= CXLMPI_NONBLOCKING_THRESHOLD, under MPI_THREAD_MULTIPLE "
     "(Ialltoall, Igather(v), Iscatter(v), Ialltoallv: with CXLMPI_TUNING=pool only)"),
)


def _library() -> str:
    """The MPI library's first line, its padding gone ("MPICH Version:      5.0.2")."""
    return " ".join(MPI.Get_library_version().splitlines()[0].split())


def version_lines() -> list[str]:
    """``--version``: cxlmpi's version, the MPI library's, mpi4py's; one a line."""
    from .._version import __version__

    return [f"cxlmpi {__version__}", f"MPI library: {_library()}",
            f"mpi4py {__import__('mpi4py').__version__}"]


def report(everything: bool = False) -> str:
    """The --info text: version, MPI library, pool settings, CPU features,
    the settings that differ from their defaults (`everything`: every
    variable, its value, default, and whether all ranks must share it),
    unknown CXLMPI_* variables, which calls take the pool, and one line on
    the selection cache (`everything`: the windows too)."""
    from .._version import __version__

    cfg = config.get()
    feats = ", ".join(k for k, v in cpu_features().items() if v) or "none"
    lines = [
        f"cxlmpi {__version__}",
        f"mpi4py {__import__('mpi4py').__version__}; MPI library: {_library()}",
        f"backend: {cfg.pool}   pool size: {cfg.pool_size} B   pool groups: "
        f"{cfg.pool_groups}   threshold: {cfg.threshold} B   coherence: {cfg.coherence}",
        f"pool memory: {admin.describe(cfg.pool)}",
        f"CPU features: {feats}",
        f"huge pages for pool arrays: {huge_pages(cfg.pool)[1]}",
        f"small calls passing through: {_straight(cfg)}",
        "",
    ]
    lines += _settings_table() if everything else _changed_settings(cfg)
    strays = config.unknown()
    if strays:
        lines.append("")
        lines.append("unknown CXLMPI_* variables (ignored):")
        for name, suggestion in strays:
            lines.append(f"  {name}={os.environ[name]}: "
                         f"{config.describe_unknown(name, suggestion)}")
    lines.append("")
    lines.append("through the pool (contiguous predefined-type buffers, ranks that share "
                 "a pool; everything else passes through to MPI):")
    for row in POOL_TABLE:
        lines.append(f"  {row[0]:<56} {row[1]}")
    lines.append(f"  a pool whose ranks run on several hosts: CXLMPI_HOSTS_THRESHOLD "
                 f"({cfg.hosts_threshold} B) in place of CXLMPI_THRESHOLD")
    if cfg.adaptive:
        lines.append("adaptive selection (CXLMPI_TUNING=adaptive): each communicator times "
                     "MPI and the pool's variants per collective and size, and keeps the "
                     "fastest (across pool groups: MPI or the hierarchy).")
        lines.append(_cache_summary(cfg))
    if not everything:
        lines.append("(python -m cxlmpi --info --all: every setting and the windows; "
                     "--info --cache: the cache's entries)")
        return "\n".join(lines)
    if cfg.adaptive:
        cfg = config.Config({**os.environ, "CXLMPI_TUNING": "builtin"})
    lines.append(f"windows (bytes, all blocks together; CXLMPI_TUNING={cfg.tuning}):")
    for name, window in cfg.windows().items():
        shown = "MPI always" if window is None else \
            f"[{window[0]}, {'inf' if window[1] is None else window[1]})"
        lines.append(f"  {name:<22} {shown}")
    return "\n".join(lines)


def _settings_table() -> list[str]:
    """Every variable: its value, default, ranks and meaning, in columns."""
    rows = [("variable", "value", "default", "ranks",
             "meaning (ranks: same = every rank must have the same value)")]
    for var in config.VARIABLES:
        value = os.environ.get(var.name)
        rows.append((var.name, "(unset)" if value is None else value, var.default or "(none)",
                     _ranks(var), config.plain(var.doc)))
    return _columns(rows)


def _changed_settings(cfg: config.Config) -> list[str]:
    """A line per setting whose value differs from its default (the
    variable as set, and its summary)."""
    defaults = config.Config({})
    changed = [var for var in config.VARIABLES
               if getattr(cfg, var.key) != getattr(defaults, var.key)]
    if not changed:
        return [f"settings: all {len(config.VARIABLES)} at their defaults"]
    lines = [f"settings that differ from their defaults ({len(changed)} of "
             f"{len(config.VARIABLES)}):"]
    width = max(len(f"{var.name}={os.environ.get(var.name, '')}") for var in changed)
    for var in changed:
        shown = f"{var.name}={os.environ.get(var.name, '')}"
        lines.append(f"  {shown:<{width}}  (default {var.default or '(none)'}): "
                     f"{config.plain(var.summary)}")
    return lines


def _job_fingerprint(cfg: config.Config) -> tuple[dict, int | None]:
    """What the cache's entries for this job have in common (its key less
    the ranks), and the ranks: COMM_WORLD's size under a launcher with
    more than one process, None (any) for one process alone."""
    from ..select import cache

    nranks = MPI.COMM_WORLD.Get_size()
    fp = cache.fingerprint(nranks, MPI.Get_library_version(), cfg)
    fp.pop("ranks")
    return fp, (nranks if nranks > 1 else None)


def _split_cache(cfg: config.Config) -> tuple[str | None, dict, list[dict], int]:
    """(path, the file read, its entries that apply to this job, how many
    do not)."""
    from ..select import cache

    path = cache.cache_path(cfg)
    data = cache.read_cache(path, warn=False)
    fp, nranks = _job_fingerprint(cfg)
    mine = []
    for entry in data["machines"].values():
        machine = entry["machine"]
        same = all(machine.get(key) == value for key, value in fp.items())
        if same and (nranks is None or machine.get("ranks") == nranks):
            mine.append(entry)
    return path, data, mine, len(data["machines"]) - len(mine)


def _cache_summary(cfg: config.Config) -> str:
    """One line on the selection cache: where, and how many entries apply here."""
    path, data, mine, others = _split_cache(cfg)
    if path is None:
        return "selection cache: off (CXLMPI_CACHE)"
    if not data["machines"] and "ignored" not in data:
        return f"selection cache: {path}: nothing learned yet"
    ignored = " (part of the file is ignored: --info --cache says why)" \
        if "ignored" in data else ""
    return (f"selection cache: {path}: {len(mine)} entr{'y' if len(mine) == 1 else 'ies'} "
            f"for this machine, MPI and cxlmpi, {others} for others{ignored}")


def cache_report() -> str:
    """``--info --cache``: the selection cache's entries that apply to this
    job (this CPU and core count, MPI library, cxlmpi version, pool kind,
    coherence and chunk size; under a launcher, these ranks), a line per
    collective, size class and placement, and how many entries are for
    other jobs."""
    from ..select import cache

    cfg = config.get()
    path, data, mine, others = _split_cache(cfg)
    if path is None:
        return "selection cache: off (CXLMPI_CACHE)"
    _, nranks = _job_fingerprint(cfg)
    ranks = "any number of ranks (run it under mpiexec -n N for N ranks only)" \
        if nranks is None else f"{nranks} ranks"
    lines = [f"selection cache: {path}",
             f"entries for this job: {cache.cpu_model()}, {os.cpu_count()} cores, "
             f"{_library()}, pool {cfg.pool}, {ranks}: {len(mine)}"]
    if "ignored" in data:
        lines.append(f"  ignored: the file {data['ignored']}")
    lines += cache.describe_entries(mine)
    lines.append(f"entries for other machines, MPI libraries, versions or ranks: {others} "
                 f"(not shown)")
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

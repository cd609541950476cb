"""``python -m cxlmpi [options] (script.py | -m module | -c cmd | -) [args]``

Runs an unmodified mpi4py program with MPI.COMM_WORLD and MPI.COMM_SELF
wrapped.  Like ``python -m mpi4py``, an uncaught exception in any rank prints
its traceback and aborts the whole MPI job instead of leaving ranks hanging.
"""

from __future__ import annotations

import os
import sys

USAGE = """\
usage: python -m cxlmpi [options] <pyfile> [arg] ...
   or: python -m cxlmpi [options] -m <mod> [arg] ...
   or: python -m cxlmpi [options] -c <cmd> [arg] ...
   or: python -m cxlmpi [options] - [arg] ...
   or: python -m cxlmpi --info
   or: python -m cxlmpi [--pool SPEC] --pool-status | --pool-reset [all]

options:
  --stats            print per-collective statistics at exit (CXLMPI_STATS=1)
  --no-pool          pass every call through to MPI (CXLMPI_DISABLE=1)
  --alloc            NumPy places large arrays in the pool (CXLMPI_ALLOC=1)
  --threshold SIZE   smallest message through the pool (CXLMPI_THRESHOLD)
  --pool-size SIZE   bytes of each pool segment (CXLMPI_POOL_SIZE)
  --coherence MODE   hw or sw (CXLMPI_COHERENCE)
  --timeout SECONDS  pool wait limit (CXLMPI_TIMEOUT)
  --pool SPEC        shm, numa:N, file:PATH or dax:/dev/daxX.Y (CXLMPI_POOL)
  --pool-groups G    split the ranks sharing memory into G pools (CXLMPI_POOL_GROUPS)
  --info             print version, MPI library, settings and exit
  --pool-status      print the partition table of a pool file or device
  --pool-reset [all] free partitions whose jobs are gone (all: every partition,
                     and write a new table; only when no job uses the pool)
  -h, --help         show this help and exit
"""

_VALUE_OPTIONS = {
    "--pool": "CXLMPI_POOL",
    "--pool-groups": "CXLMPI_POOL_GROUPS",
    "--threshold": "CXLMPI_THRESHOLD",
    "--pool-size": "CXLMPI_POOL_SIZE",
    "--coherence": "CXLMPI_COHERENCE",
    "--timeout": "CXLMPI_TIMEOUT",
}


# Which calls the pool takes, and when (the same table as in the README).
POOL_TABLE = (
    ("Reduce, Allreduce, Scan, Exscan", "message >= CXLMPI_THRESHOLD, predefined op"),
    ("Reduce_scatter_block, Reduce_scatter", "total >= CXLMPI_THRESHOLD, predefined op, "
     "recvcounts given"),
    ("Bcast, Allgather(v), Alltoall(v), Gather(v), Scatter(v)",
     "sizes in the CXLMPI_TUNING window (below)"),
    ("Gatherv, Scatterv, Alltoallv", "path and length agreed in a header step"),
    ("Barrier", "once the communicator has a pool"),
)


def _usage(message: str | None = None) -> None:
    if message:
        sys.stderr.write(f"python -m cxlmpi: {message}\n")
    sys.stderr.write(USAGE)
    sys.exit(2 if message else 0)


def info() -> str:
    """Version, MPI library, pool settings, CPU features, every variable."""
    from mpi4py import MPI

    from . import __version__, config
    from ._pool import cpu_features

    cfg = config.get()
    # MPICH pads its fields ("MPICH Version:      5.0.2"): one space each.
    lib = " ".join(MPI.Get_library_version().splitlines()[0].split())
    feats = ", ".join(k for k, v in cpu_features().items() if v) or "none"
    lines = [
        f"cxlmpi {__version__}",
        f"mpi4py {__import__('mpi4py').__version__}; MPI library: {lib}",
        f"backend: {cfg.pool}   pool size: {cfg.pool_size} B   pool groups: "
        f"{cfg.pool_groups}   threshold: {cfg.threshold} B   coherence: {cfg.coherence}",
        f"pool memory: {_backend_line(cfg.pool)}",
        f"CPU features: {feats}",
        "",
    ]
    rows = [("variable", "value", "default", "ranks",
             "meaning (ranks: same = every rank must have the same value)")]
    for var in config.VARIABLES:
        value = os.environ.get(var.name)
        rows.append((var.name, "(unset)" if value is None else value, var.default,
                     "same" if var.agreed else "any", var.doc))
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
    lines.append("through the pool (contiguous predefined-type buffers, one-node "
                 "communicator; everything else passes through to MPI):")
    for row in POOL_TABLE:
        lines.append(f"  {row[0]:<56} {row[1]}")
    lines.append(f"windows (bytes, all blocks together; CXLMPI_TUNING={cfg.tuning}):")
    for name, window in cfg.windows().items():
        shown = "MPI always" if window is None else \
            f"[{window[0]}, {'inf' if window[1] is None else window[1]})"
        lines.append(f"  {name:<22} {shown}")
    return "\n".join(lines)


def _columns(rows: list[tuple[str, ...]]) -> list[str]:
    """Rows as lines whose columns line up (each as wide as its widest
    cell; the last column is left as it is)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return [" ".join(f"{cell:<{width}}" for cell, width in zip(row, widths)) + " " + row[-1]
            for row in rows]


def pool_admin(kind: str, everything: bool) -> int:
    """--pool-status / --pool-reset on the pool file or device of
    CXLMPI_POOL; returns the exit status."""
    import time

    from . import backends, config
    from .errors import CXLMPIError

    spec = backends.parse_spec(config.get().pool)
    if not spec.shared_file:
        sys.stderr.write(f"python -m cxlmpi: CXLMPI_POOL={spec} has no partition table "
                         f"(shm and numa pools are private segments, gone with their "
                         f"job); name a pool with --pool file:PATH or dax:DEVICE\n")
        return 2
    try:
        dev = backends.open_device(spec)
        if kind == "reset":
            freed = dev.reset(everything)
            what = "rewrote the table; " if everything else ""
            print(f"{spec}: {what}freed {len(freed)} partition(s)"
                  + (f": {freed}" if freed else ""))
            return 0
        dev.check_header(format_if_empty=False)
    except CXLMPIError as exc:
        sys.stderr.write(f"python -m cxlmpi: {exc}\n")
        return 1
    h = dev.header()
    entries = dev.entries()
    print(f"{spec}: {h['capacity']} bytes, alignment {h['align']}, table v{h['version']}, "
          f"id {h['uuid']}, {len(entries)} partition(s) in use")
    if entries:
        print(f"{'#':>3} {'state':<9} {'offset':>12} {'bytes':>12} {'ranks':>5} "
              f"{'host':<16} {'pid':>8} {'age s':>8}  stale")
    now = time.time_ns()
    for e in entries:
        host = e["host"] + ("" if e["this_host"] else " (other)")
        print(f"{e['index']:>3} {e['state']:<9} {e['offset']:>12} {e['nbytes']:>12} "
              f"{e['nranks']:>5} {host:<16} {e['pid']:>8} "
              f"{(now - e['since_ns']) / 1e9:>8.0f}  {'yes' if e['stale'] else 'no'}")
    return 0


def _backend_line(pool: str) -> str:
    """Where CXLMPI_POOL puts pools, for --info (never creates anything)."""
    from . import backends
    from .errors import CXLMPIError

    spec = backends.parse_spec(pool)
    if spec.kind == "shm":
        return "POSIX shared memory (/dev/shm), one private segment per pool"
    if spec.kind == "numa":
        try:
            backends.numa_check(spec.node)
        except CXLMPIError as exc:
            return f"unusable: {exc}"
        return f"POSIX shared memory bound to NUMA node {spec.node}"
    if spec.kind == "file" and not os.path.exists(spec.path):
        return (f"{spec.path} (does not exist yet: the first job creates it, "
                f"{backends.NEW_FILE_NBYTES >> 30} GiB sparse, mode 0600)")
    try:
        dev = backends.open_device(spec)
        dev.check_header(format_if_empty=False)
    except CXLMPIError as exc:
        return f"{spec.path}: {exc}"
    return (f"{spec.path}: {dev.capacity} bytes, alignment {dev.align}, "
            f"{len(dev.entries())} partition(s) in use (--pool-status)")


def _parse(argv: list[str]) -> tuple[str, list[str]]:
    """(command, args) from the command line: "info", "status", "reset"
    (args ["all"] or []) or "run" (args: the program's command line,
    ``[pyfile | -m mod | -c cmd | -] [arg] ...``); applies the options."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-h", "--help"):
            _usage()
        elif arg == "--info":
            return "info", []
        elif arg == "--pool-status":
            return "status", []
        elif arg == "--pool-reset":
            return "reset", ["all"] if argv[i + 1:i + 2] == ["all"] else []
        elif arg == "--stats":
            os.environ["CXLMPI_STATS"] = "1"
        elif arg == "--no-pool":
            os.environ["CXLMPI_DISABLE"] = "1"
        elif arg == "--alloc":
            os.environ["CXLMPI_ALLOC"] = "1"
        elif arg.split("=", 1)[0] in _VALUE_OPTIONS:
            name, eq, value = arg.partition("=")
            if not eq:
                i += 1
                if i == len(argv):
                    _usage(f"option {name} needs a value")
                value = argv[i]
            os.environ[_VALUE_OPTIONS[name]] = value
        elif arg in ("-m", "-c"):
            if i + 1 == len(argv):
                _usage(f"option {arg} needs an argument")
            return "run", argv[i:]
        elif arg == "-" or not arg.startswith("-"):
            return "run", argv[i:]
        else:
            _usage(f"unknown option {arg}")
        i += 1
    _usage("no program given")
    raise AssertionError  # unreachable


def main(argv: list[str] | None = None) -> None:
    """The command line entry point."""
    command, args = _parse(sys.argv[1:] if argv is None else argv)
    from . import config
    from .errors import CXLMPIConfigError

    try:
        config.reload()
    except CXLMPIConfigError as exc:
        sys.stderr.write(f"python -m cxlmpi: {exc}\n")
        sys.exit(2)
    if command == "info":
        print(info())
    elif command in ("status", "reset"):
        sys.exit(pool_admin(command, args == ["all"]))
    else:
        from .runner import run

        run(args)


if __name__ == "__main__":
    main()

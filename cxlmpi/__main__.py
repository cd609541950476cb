"""``python -m cxlmpi [options] (script.py | -m module | -c cmd | -) [args]``

Runs an unmodified mpi4py program with MPI.COMM_WORLD and MPI.COMM_SELF
wrapped.  Like ``python -m mpi4py``, an uncaught exception in any rank prints
its traceback and aborts the whole MPI job instead of leaving ranks hanging.

This module only reads the command line (options become CXLMPI_*
variables) and hands over: the program to cxlmpi.runner, --info to
cxlmpi.info, --pool-status and --pool-reset to cxlmpi.admin.
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
  --alloc            NumPy places large arrays in the pool (CXLMPI_ALLOC=1; the
                     default where pool memory gets huge pages: --info)
  --no-alloc         NumPy's own allocator for every array (CXLMPI_ALLOC=0)
  --threshold SIZE   smallest message through the pool (CXLMPI_THRESHOLD)
  --pool-size SIZE   bytes of each pool segment (CXLMPI_POOL_SIZE)
  --coherence MODE   auto, hw, sw or emulate (CXLMPI_COHERENCE)
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


def _usage(message: str | None = None) -> None:
    if message:
        sys.stderr.write(f"python -m cxlmpi: {message}\n")
    sys.stderr.write(USAGE)
    sys.exit(2 if message else 0)


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
        elif arg == "--no-alloc":
            os.environ["CXLMPI_ALLOC"] = "0"
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
    """The command line entry point: options, then one command --info
    (cxlmpi.info), --pool-status / --pool-reset (cxlmpi.admin) or a
    program to run (cxlmpi.runner)."""
    command, args = _parse(sys.argv[1:] if argv is None else argv)
    from . import config
    from .errors import CXLMPIConfigError

    try:
        config.reload()
    except CXLMPIConfigError as exc:
        sys.stderr.write(f"python -m cxlmpi: {exc}\n")
        sys.exit(2)
    if command == "info":
        from .info import report

        print(report())
    elif command == "status":
        from .admin import status

        sys.exit(status())
    elif command == "reset":
        from .admin import reset

        sys.exit(reset(everything=args == ["all"]))
    else:
        from .runner import run

        run(args)


if __name__ == "__main__":
    main()

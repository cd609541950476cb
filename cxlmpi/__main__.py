"""``python -m cxlmpi [options] (script.py | -m module | -c cmd | -) [args]``

Runs an unmodified mpi4py program with MPI.COMM_WORLD and MPI.COMM_SELF
wrapped.  Like ``python -m mpi4py``, an uncaught exception in any rank prints
its traceback and aborts the whole MPI job instead of leaving ranks hanging.

This module only hands over: the command line to cxlmpi.launch.command_line (its
options become CXLMPI_* variables), then the program to cxlmpi.launch.runner,
--version and --info to cxlmpi.reports.info, --pool-status and --pool-reset to cxlmpi.reports.admin.
"""

from __future__ import annotations

import sys

from .launch.command_line import parse


def main(argv: list[str] | None = None) -> None:
    """The command line entry point: options, then one command --version or
    --info (cxlmpi.reports.info), --pool-status / --pool-reset (cxlmpi.reports.admin) or a
    program to run (cxlmpi.launch.runner)."""
    command, args = parse(sys.argv[1:] if argv is None else argv)
    from . import config
    from .errors import CXLMPIConfigError

    try:
        config.reload()
    except CXLMPIConfigError as exc:
        sys.stderr.write(f"python -m cxlmpi: {exc}\n")
        sys.exit(2)
    if command in ("version", "info"):
        from mpi4py import MPI

        from .reports.info import cache_report, markdown, report, version_lines

        text = "\n".join(version_lines()) if command == "version" else \
            markdown() if args == ["--markdown"] else \
            cache_report() if args == ["--cache"] else report(everything=args == ["--all"])
        if MPI.COMM_WORLD.Get_rank() == 0:     # (under mpiexec: once, not once per rank)
            print(text)
    elif command == "status":
        from .reports.admin import status

        sys.exit(status())
    elif command == "reset":
        from .reports.admin import reset

        sys.exit(reset(everything=args == ["all"]))
    else:
        from .launch.runner import run

        run(args)


if __name__ == "__main__":
    main()

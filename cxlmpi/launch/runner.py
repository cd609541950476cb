"""Run a program as ``python -m mpi4py`` does, with cxlmpi patched in.

``run(["app.py", *args])`` (or ``["-m", mod, ...]``, ``["-c", cmd, ...]``,
``["-", ...]``) hands the command line to ``mpi4py.run.run_command_line``,
which sets sys.argv, sys.path and ``__main__`` as Python itself does;
MPI.COMM_WORLD and MPI.COMM_SELF are wrapped as soon as the program has
started MPI (`cxlmpi.launch.hook`), so that its ``mpi4py.rc`` settings
apply as under ``python -m mpi4py``.  An uncaught exception or
a non-zero ``sys.exit`` in any rank prints its traceback and aborts the
whole job at once instead of leaving the other ranks waiting.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

__all__ = ["run"]

_INIT_WAIT_S = 10.0   # a failed rank's MPI_Init, started only to abort the job


def run(args: list[str]) -> None:
    """Run the program of `args` (``[pyfile | -m mod | -c cmd | -] [arg] ...``)
    with COMM_WORLD and COMM_SELF wrapped once it starts MPI; returns when it
    ends normally."""
    from mpi4py.run import run_command_line

    from .hook import watch

    watch()
    # Running the program is mpi4py.run's; aborting stays ours.  mpi4py.run
    # (main) calls set_abort_status here, which only records the status:
    # mpi4py calls MPI_Abort when the interpreter finalizes, after Python
    # has joined the program's non-daemon threads - so a rank that fails
    # while a worker thread of its waits for work never aborts, and the
    # job hangs (test_failure_with_a_live_thread_aborts_job).  Ours prints
    # the traceback, waits for the launcher to read it, and aborts now.
    try:
        run_command_line(args)
    except SystemExit as exc:
        code = _exit_code(exc)
        if code != 0:
            _abort(code)
        raise
    except KeyboardInterrupt as exc:
        _abort(128 + signal.SIGINT, exc)  # the shell's status, as mpi4py.run gives
    except BaseException as exc:  # noqa: BLE001 - any error aborts the job
        _abort(1, exc)


def _exit_code(exc: SystemExit) -> int:
    """The status `sys.exit(x)` asks for, as Python computes it (a
    non-integer is printed, status 1)."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    sys.stderr.write(f"{exc.code}\n")
    return 1


def _abort(code: int, exc: BaseException | None = None) -> None:
    """Print the traceback (if any) and abort every rank of the job."""
    if exc is not None:
        import traceback

        traceback.print_exception(type(exc), exc, exc.__traceback__)
    _drain_output()
    try:
        mpi = _started_mpi()
        if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
            mpi.COMM_WORLD.Abort(code)
    finally:
        os._exit(code)


def _started_mpi() -> Any:
    """mpi4py.MPI, started: a rank that failed before the program started
    MPI starts it here (under a launcher of several ranks, its peers may
    wait in MPI_Init for it: MPICH's do, for ever), patching nothing; if
    MPI_Init itself waits too long, the rank exits without it."""
    from .hook import mpi_module, stop

    mpi = mpi_module()
    if mpi is not None and (mpi.Is_initialized() or mpi.Is_finalized()):
        return mpi
    if int(os.environ.get("PMI_SIZE") or os.environ.get("OMPI_COMM_WORLD_SIZE") or 1) < 2:
        return None
    import threading

    stop()
    watchdog = threading.Timer(_INIT_WAIT_S, os._exit, (1,))
    watchdog.daemon = True
    watchdog.start()
    from mpi4py import MPI

    if not MPI.Is_initialized():
        MPI.Init()
    return MPI


def _drain_output(timeout_s: float = 2.0) -> None:
    """Wait (briefly) until the launcher has read what this rank wrote to
    stdout and stderr: MPI_Abort may otherwise end the job before the
    traceback is forwarded."""
    import fcntl
    import struct
    import termios
    import time

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    deadline = time.monotonic() + timeout_s
    for fd in (1, 2):
        while time.monotonic() < deadline:
            try:
                raw = fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0")
            except OSError:
                break  # not a pipe or socket: nothing to wait for
            if struct.unpack("i", raw)[0] == 0:
                break
            time.sleep(0.005)

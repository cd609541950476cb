"""Run one mpi4py program under stock MPI and under cxlmpi, side by side.

    python tools/compare.py [-n 2] [--repeat 3] program.py [-- program args]

Runs ``mpiexec -n N python program.py`` and ``mpiexec -n N python -m cxlmpi
--stats program.py`` alternately (--repeat times each), then prints both wall
times (medians), the program's own ``TIME`` line when it prints one (each
with the speedup as the ratio of the medians and as the median of the run
pairs' ratios: `paired_speedup`), whether the outputs agree (stdout minus
timing and '#' lines), and rank 0's cxlmpi statistics.  Exits 1 when the
outputs differ.

What the program prints (to stdout, once: from rank 0):

  TIME <seconds>    the time of the part worth comparing (its first such
                    line, at the start of a line): the "program TIME" row
  RESULT ...        (or any other line) compared between the two runs, so
                    print a checksum of the answer; the last compared line
                    is shown after "results agree"

Lines starting with '#', TIME lines and lines mentioning "time" or
"second(s)" are not compared (--ignore sets that pattern).

Both runs get OMP_NUM_THREADS=1 unless it is set already: a program that
imports NumPy with threaded BLAS on every rank ran 3.8-22 s instead of
0.66 s on 2 ranks, stock and cxlmpi alike, too noisy to compare.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_IGNORE = r"^\s*#|^\s*TIME\b|(?i:\bseconds?\b|\btime\b)"


def _mpiexec() -> list[str]:
    env = os.environ.get("MPIEXEC")
    if env:
        return env.split()
    local = Path(sys.executable).parent / "mpiexec"
    found = str(local) if local.exists() else shutil.which("mpiexec")
    if not found:
        sys.exit("compare: no mpiexec found (set MPIEXEC)")
    return [found]


def _run(cmd: list[str], env: dict[str, str]) -> tuple[float, str, str, int]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    return time.perf_counter() - t0, proc.stdout, proc.stderr, proc.returncode


def _program_time(stdout: str) -> float | None:
    m = re.search(r"^TIME\s+([0-9.eE+-]+)", stdout, re.M)
    return float(m.group(1)) if m else None


def _kept(stdout: str, ignore: re.Pattern[str]) -> list[str]:
    return [line for line in stdout.splitlines() if not ignore.search(line)]


def _rank0_stats(stderr: str) -> str:
    m = re.search(r"^cxlmpi stats, rank 0:\n(?:(?!cxlmpi stats).*\n?)*", stderr, re.M)
    return m.group(0).rstrip() if m else "(no stats printed)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", "--np", type=int, default=2, help="ranks (default 2)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each (default 3)")
    ap.add_argument("--ignore", default=DEFAULT_IGNORE,
                    help="regex of output lines not compared (timings)")
    ap.add_argument("--mpiexec-args", default="", help="extra mpiexec arguments")
    ap.add_argument("program")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    opts = ap.parse_args(argv)
    args = opts.args[1:] if opts.args[:1] == ["--"] else opts.args

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env.setdefault("OMP_NUM_THREADS", "1")  # see the docstring
    launch = [*_mpiexec(), *opts.mpiexec_args.split(), "-n", str(opts.np)]
    cmds = {
        "stock MPI": [*launch, sys.executable, opts.program, *args],
        "cxlmpi": [*launch, sys.executable, "-m", "cxlmpi", "--stats",
                   opts.program, *args],
    }
    walls: dict[str, list[float]] = {k: [] for k in cmds}
    ptimes: dict[str, list[float]] = {k: [] for k in cmds}
    outputs: dict[str, str] = {}
    stderr_cxl = ""
    print(f"compare: {opts.program} {' '.join(args)} on {opts.np} ranks, "
          f"{opts.repeat} runs each, alternating, "
          f"OMP_NUM_THREADS={env['OMP_NUM_THREADS']}", flush=True)
    for i in range(opts.repeat):
        for label, cmd in cmds.items():
            wall, out, err, rc = _run(cmd, env)
            if rc != 0:
                sys.stderr.write(f"{label} run failed (exit {rc}):\n{err[-4000:]}\n")
                return 2
            walls[label].append(wall)
            ptime = _program_time(out)
            if ptime is not None:
                ptimes[label].append(ptime)
            outputs.setdefault(label, out)
            if label == "cxlmpi":
                stderr_cxl = err
            print(f"  run {i + 1}: {label:<9} wall {wall:7.2f} s"
                  + (f"  program TIME {ptime:7.3f} s" if ptime is not None else ""),
                  flush=True)

    ignore = re.compile(opts.ignore)
    kept = {k: _kept(v, ignore) for k, v in outputs.items()}
    agree = kept["stock MPI"] == kept["cxlmpi"]
    print()
    print(f"{'':<22}{'stock MPI':>12}{'cxlmpi':>12}{'speedup':>10}{'per pair':>10}")
    rows = [("wall time (s)", walls)]
    if all(ptimes.values()):
        rows.append(("program TIME (s)", ptimes))
    for name, table in rows:
        stock = statistics.median(table["stock MPI"])
        shim = statistics.median(table["cxlmpi"])
        pairs = paired_speedup(table["stock MPI"], table["cxlmpi"])
        print(f"{name:<22}{stock:>12.3f}{shim:>12.3f}{stock / shim:>9.2f}x{pairs:>9.2f}x")
    print()
    if agree:
        shown = kept["cxlmpi"][-1] if kept["cxlmpi"] else "(no output)"
        print(f"results agree: yes   ({shown})")
    else:
        print("results agree: NO")
        for label, lines in kept.items():
            print(f"  {label}: " + " | ".join(lines[-5:]))
    print()
    print(_rank0_stats(stderr_cxl))
    return 0 if agree else 1


def paired_speedup(stock: list[float], shim: list[float]) -> float:
    """The median of stock/cxlmpi over the runs taken in turn (run i of
    each side, one after the other): where the machine drifts within a
    job (a VM whose neighbours come and go: the stock runs of one job
    took 4.35 s at first and 2.96 s at the end), the ratio of the two
    medians mixes that drift in; each pair's ratio holds little of it."""
    return statistics.median(s / c for s, c in zip(stock, shim))


if __name__ == "__main__":
    sys.exit(main())

"""Run one mpi4py program under stock MPI and under cxlmpi, side by side.

    python tools/compare.py [-n 2] [--repeat 3] [--control] [--json FILE] [--quiet]
        [cxlmpi options: --alloc, --threshold SIZE, ...] program.py [-- program args]

Runs ``mpiexec -n N python program.py`` and ``mpiexec -n N python -m cxlmpi
--stats [cxlmpi options] program.py`` alternately (--repeat times each),
then prints both wall times (medians), the program's own ``TIME`` line when
it prints one, each with two speedups, which of them to trust and why
(`judge`), whether the outputs agree (stdout minus timing and '#' lines),
and rank 0's cxlmpi statistics.  Exits 1 when the outputs differ.

The two speedups: the ratio of the medians (stock median / cxlmpi median)
and the median of the run pairs' ratios (`paired_speedup`: run i of each
side, taken one after the other).  Trust the pairs' figure: a machine that
drifts during the job (neighbours of a VM coming and going) moves the two
medians apart but each pair's two runs alike.  Where the two differ by more
than the pairs' spread, the machine drifted.  Figures within ~10 % of 1.0x
on a 2-core machine (5 % on a larger one) are noise: --repeat narrows
that, and --control measures it: a third run each time with
``CXLMPI_DISABLE=1`` (cxlmpi in place, every call to MPI), which shows what
"no change" looks like here.

Every option of ``python -m cxlmpi`` that sets a setting (listed above:
--alloc, --threshold SIZE, --pool-size SIZE, ...) goes before the program
and is passed to the cxlmpi runs (and the control).

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

It says how long it will take as soon as it can (after the first run: its
time x the runs; after the first round: that round's time x --repeat) and
shows each run as it ends, with the time elapsed and left; --quiet prints
only the results.  --json FILE writes the
runs, both speedups, the verdict and where they were taken (machine, CPU,
MPI, versions, the command) for the documentation's performance page.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DEFAULT_IGNORE = r"^\s*#|^\s*TIME\b|(?i:\bseconds?\b|\btime\b)"
STOCK, SHIM, CONTROL = "stock MPI", "cxlmpi", "control"


def noise_floor(cores: int) -> float:
    """The relative difference below which a speedup is noise: ~10 % on a
    machine of 2 cores (where the ranks share the cores with the system and
    the launcher: runs of one program spread that much), 5 % on a larger one."""
    return 0.10 if cores <= 2 else 0.05


def paired_speedup(stock: list[float], shim: list[float]) -> float:
    """The median of stock/cxlmpi over the runs taken in turn (run i of
    each side, one after the other): where the machine drifts within a
    job (a VM whose neighbours come and go: the stock runs of one job
    took 4.35 s at first and 2.96 s at the end), the ratio of the two
    medians mixes that drift in; each pair's ratio holds little of it."""
    return statistics.median(s / c for s, c in zip(stock, shim))


def judge(stock: list[float], shim: list[float], cores: int,
          control: list[float] | None = None) -> dict[str, Any]:
    """Which speedup to trust and what it says, from the times of the runs
    (seconds, run i of each side one after the other): {"trust":
    "paired", "speedup", "ratio_of_medians", "paired", "pairs" (each
    pair's ratio), "drifted" (the two figures differ by more than the
    pairs' spread, half their range), "noise" (the floor used), "verdict" ("faster",
    "slower", "no clear difference"), "lines" (the explanation, in
    words)}."""
    ratio = statistics.median(stock) / statistics.median(shim)
    pairs = [s / c for s, c in zip(stock, shim)]
    paired = statistics.median(pairs)
    low, high = min(pairs), max(pairs)
    # the pairs' spread: half their range either side of the median pair
    drifted = abs(ratio - paired) > max((high - low) / 2, 0.005)
    noise = noise_floor(cores)
    lines = [f"trust the per-pair speedup, {paired:.2f}x: each pair's two runs ran one "
             f"after the other, so a machine that speeds up or slows down during the "
             f"job changes both alike; the ratio of the medians ({ratio:.2f}x) mixes "
             f"that drift in."]
    spread = f"{low:.2f}x-{high:.2f}x" if len(pairs) > 1 else f"{low:.2f}x, one pair"
    if drifted:
        lines.append(f"here the two differ by more than the pairs' spread ({spread}, "
                     f"±{(high - low) / 2:.2f}x): "
                     f"the machine drifted (stock MPI's runs took {min(stock):.2f}-"
                     f"{max(stock):.2f} s), and only the per-pair figure holds.")
    else:
        lines.append(f"here the two agree within the pairs' spread ({spread}): the "
                     f"machine held steady.")
    if abs(paired - 1) < noise:
        verdict = "no clear difference"
        lines.append(f"verdict: no clear difference: {paired:.2f}x is within the noise "
                     f"(figures within ~{noise:.0%} of 1.0x are noise on a machine of "
                     f"{cores} core{'s' if cores != 1 else ''}); more --repeat narrows it.")
    else:
        verdict = "faster" if paired > 1 else "slower"
        every = (low > 1) if paired > 1 else (high < 1)
        lines.append(f"verdict: cxlmpi is {verdict}: {paired:.2f}x"
                     + (f", every pair agreeing ({spread})." if every and len(pairs) > 1
                        else f", but the pairs range {spread}: run more --repeat."
                        if len(pairs) > 1 else " (one pair: run more --repeat)."))
    off = None
    if control is not None:
        off = paired_speedup(stock, control)
        lines.append(f"control, cxlmpi with CXLMPI_DISABLE=1 (in place, every call to "
                     f"MPI): {off:.2f}x per pair: what no change looks like here (the "
                     f"noise and the shim's own cost).")
    else:
        lines.append("to see what no change looks like here, --control adds a run with "
                     "CXLMPI_DISABLE=1 (cxlmpi in place, every call to MPI) to each pair.")
    return {"trust": "paired", "speedup": paired, "ratio_of_medians": ratio,
            "paired": paired, "pairs": pairs, "drifted": drifted, "noise": noise,
            "verdict": verdict, "control": off, "lines": lines}


# ------------------------------------------------------------ running


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


def _seconds(value: float) -> str:
    return f"{value:.0f} s" if value < 120 else f"{value / 60:.1f} min"


class _CxlmpiOption(argparse.Action):
    """An option of ``python -m cxlmpi``: collected, in order, for its runs."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        given = list(getattr(namespace, "cxlmpi", None) or [])
        given += [option_string] if values is None or values == [] else \
            [f"{option_string}={values}"]
        namespace.cxlmpi = given


def build_parser() -> argparse.ArgumentParser:
    """compare.py's command line; cxlmpi's setting options come from
    cxlmpi.launch.command_line.OPTIONS (the table its usage text reads)."""
    from cxlmpi.launch.command_line import OPTIONS

    ap = argparse.ArgumentParser(
        prog="tools/compare.py", description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 2)[2], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", "--np", type=int, default=2, help="ranks (default 2)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each (default 3)")
    ap.add_argument("--control", action="store_true",
                    help="a third run each time: cxlmpi with CXLMPI_DISABLE=1 (the noise)")
    ap.add_argument("--json", metavar="FILE",
                    help="write the runs, speedups, verdict and metadata as JSON")
    ap.add_argument("--quiet", action="store_true",
                    help="no estimate or progress lines: only the results")
    ap.add_argument("--ignore", default=DEFAULT_IGNORE,
                    help="regex of output lines not compared (timings)")
    ap.add_argument("--mpiexec-args", default="", help="extra mpiexec arguments")
    group = ap.add_argument_group("cxlmpi's options (python -m cxlmpi --help), passed to "
                                  "its runs")
    for option in OPTIONS:
        if not option.setting or option.setting == "CXLMPI_STATS":
            continue
        group.add_argument(*option.flags, action=_CxlmpiOption, dest="cxlmpi",
                           nargs=None if option.metavar else 0,
                           metavar=option.metavar or None,
                           help=option.description.replace("%", "%%"))
    ap.add_argument("program")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    return ap


def _commands(opts: argparse.Namespace, args: list[str]) -> dict[str, list[str]]:
    launch = [*_mpiexec(), *opts.mpiexec_args.split(), "-n", str(opts.np)]
    runner = [*launch, sys.executable, "-m", "cxlmpi", "--stats", *(opts.cxlmpi or [])]
    cmds = {STOCK: [*launch, sys.executable, opts.program, *args],
            SHIM: [*runner, opts.program, *args]}
    if opts.control:
        cmds[CONTROL] = [*runner, "--no-pool", opts.program, *args]
    return cmds


def _say(opts: argparse.Namespace, text: str) -> None:
    if not opts.quiet:
        print(text, flush=True)


def run_all(opts: argparse.Namespace, cmds: dict[str, list[str]], env: dict[str, str]
            ) -> tuple[list[dict[str, Any]], dict[str, str], str] | int:
    """Every run, alternating: ([{arm, run, wall_s, program_time_s}],
    the first stdout of each arm, the last cxlmpi stderr), or the exit
    status of a failed run.  Says how long it will take after the first
    round and shows each run as it ends (unless --quiet)."""
    runs: list[dict[str, Any]] = []
    outputs: dict[str, str] = {}
    stderr_cxl = ""
    start = time.perf_counter()
    total = opts.repeat * len(cmds)
    _say(opts, f"compare: {len(cmds)} runs a round, {opts.repeat} rounds: {total} runs; "
               f"how long they take is known after the first")
    for i in range(opts.repeat):
        for label, cmd in cmds.items():
            wall, out, err, rc = _run(cmd, env)
            if rc != 0:
                sys.stderr.write(f"{label} run failed (exit {rc}):\n{err[-4000:]}\n")
                return 2
            ptime = _program_time(out)
            runs.append({"arm": label, "run": i + 1, "wall_s": wall, "program_time_s": ptime})
            outputs.setdefault(label, out)
            if label == SHIM:
                stderr_cxl = err
            elapsed = time.perf_counter() - start
            left = elapsed / len(runs) * (total - len(runs))
            _say(opts, f"  run {i + 1}/{opts.repeat}: {label:<9} wall {wall:7.2f} s"
                 + (f"  program TIME {ptime:7.3f} s" if ptime is not None else "")
                 + f"   [{_seconds(elapsed)} elapsed, ~{_seconds(left)} left]")
            if len(runs) == 1 and total > 1:
                _say(opts, f"  (the first run took {_seconds(elapsed)}: about "
                           f"{_seconds(elapsed * total)} for all {total} runs)")
        if i == 0 and opts.repeat > 1:
            elapsed = time.perf_counter() - start
            _say(opts, f"  (a round took {_seconds(elapsed)}: about "
                       f"{_seconds(elapsed * opts.repeat)} in all, "
                       f"{_seconds(elapsed * (opts.repeat - 1))} more)")
    return runs, outputs, stderr_cxl


def _table(runs: list[dict[str, Any]], arms: list[str], cores: int
           ) -> tuple[list[str], dict[str, Any]]:
    """The rows of wall time and program TIME (when every run printed one):
    lines to print, and {row: figures} for --json."""
    lines = [f"{'':<22}{'stock MPI':>12}{'cxlmpi':>12}{'speedup':>10}{'per pair':>10}"
             + (f"{'control':>10}" if CONTROL in arms else "")]
    rows = {"wall time (s)": "wall_s"}
    if all(r["program_time_s"] is not None for r in runs):
        rows["program TIME (s)"] = "program_time_s"
    summary: dict[str, Any] = {}
    for name, key in rows.items():
        times = {arm: [r[key] for r in runs if r["arm"] == arm] for arm in arms}
        result = judge(times[STOCK], times[SHIM], cores, times.get(CONTROL))
        stock, shim = statistics.median(times[STOCK]), statistics.median(times[SHIM])
        control = f"{paired_speedup(times[STOCK], times[CONTROL]):>9.2f}x" \
            if CONTROL in arms else ""
        lines.append(f"{name:<22}{stock:>12.3f}{shim:>12.3f}{stock / shim:>9.2f}x"
                     f"{result['paired']:>9.2f}x{control}")
        summary[key] = {"medians": {arm: statistics.median(times[arm]) for arm in arms},
                        **result}
    return lines, summary


def metadata(opts: argparse.Namespace, argv: list[str], cmds: dict[str, list[str]],
             env: dict[str, str]) -> dict[str, Any]:
    """Where and how the figures were taken."""
    from mpi4py import MPI

    import cxlmpi
    from cxlmpi.select.cache import cpu_model

    return {
        "tool": "tools/compare.py",
        "command": shlex.join([sys.executable, "tools/compare.py", *argv]),
        "commands": {arm: shlex.join(cmd) for arm, cmd in cmds.items()},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(), "cpu": cpu_model(), "cores": os.cpu_count(),
        "ranks": opts.np, "repeat": opts.repeat, "cxlmpi_options": opts.cxlmpi or [],
        "OMP_NUM_THREADS": env["OMP_NUM_THREADS"],
        "cxlmpi_version": cxlmpi.__version__,
        "mpi4py_version": __import__("mpi4py").__version__,
        "mpi_library": " ".join(MPI.Get_library_version().splitlines()[0].split()),
        "python_version": platform.python_version(),
    }


def main(argv: list[str] | None = None) -> int:
    """Entry point; the exit status: 0, 1 (outputs differ), 2 (a run failed)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    opts = build_parser().parse_args(argv)
    args = opts.args[1:] if opts.args[:1] == ["--"] else opts.args
    if opts.repeat < 1:
        sys.exit("compare: --repeat must be at least 1")

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env.setdefault("OMP_NUM_THREADS", "1")  # see the docstring
    cmds = _commands(opts, args)
    passed = f", cxlmpi {' '.join(opts.cxlmpi)}" if opts.cxlmpi else ""
    print(f"compare: {shlex.join([opts.program, *args])} on {opts.np} ranks, "
          f"{opts.repeat} runs each, alternating, "
          f"OMP_NUM_THREADS={env['OMP_NUM_THREADS']}{passed}", flush=True)
    done = run_all(opts, cmds, env)
    if isinstance(done, int):
        return done
    runs, outputs, stderr_cxl = done

    ignore = re.compile(opts.ignore)
    kept = {k: _kept(v, ignore) for k, v in outputs.items()}
    agree = all(lines == kept[STOCK] for lines in kept.values())
    cores = os.cpu_count() or 1
    lines, summary = _table(runs, list(cmds), cores)
    print()
    print("\n".join(lines))
    print()
    trusted = summary.get("program_time_s") or summary["wall_s"]
    which = "program TIME" if "program_time_s" in summary else "wall time"
    print(f"which speedup ({which}):")
    for line in trusted["lines"]:
        print(textwrap.fill(line, 100, initial_indent="  ", subsequent_indent="    "))
    print()
    if agree:
        shown = kept[SHIM][-1] if kept[SHIM] else "(no output)"
        print(f"results agree: yes   ({shown})")
    else:
        print("results agree: NO")
        for label, out in kept.items():
            print(f"  {label}: " + " | ".join(out[-5:]))
    print()
    stats = _rank0_stats(stderr_cxl)
    print(stats)
    if opts.json:
        report = {"metadata": metadata(opts, argv, cmds, env), "runs": runs,
                  "summary": summary, "trusted": which, "results_agree": agree,
                  "stats": stats}
        with open(opts.json, "w") as f:
            json.dump(report, f, indent=1)
            f.write("\n")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())

"""The performance page's figures and tables, generated at build time from
the committed results files (results/*/*.json), never typed by hand.

Each folder of results/ is one measuring session on one machine (its
machine.txt, one line, says which where the metadata does not); each JSON
file in it is what ``python -m cxlmpi.bench --json FILE`` wrote.  A file
whose settings have ``CXLMPI_DISABLE`` on is a *control*: the same job with
the pool turned off (every call to MPI), whose speedups show the machine's
noise.  It is set beside the run of the same folder with the same buffers
and data (``bench.buffers``, ``bench.data_varying``).

For every run: one figure (a panel per collective, one speedup scale for
all of them with 1.0 marked, the control beside it, the rounds' spread as a
band) and one table, each saying the machine, CPU, ranks, MPI library,
date and the command that reproduces it.

    python docs/_ext/cxlmpi_performance.py    # writes docs/_generated/, as the build does
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results"
OUT = ROOT / "docs" / "_generated"
PAGE = OUT / "performance-results.md"
NOT_RECORDED = "not recorded"


@dataclass
class Run:
    """One results file: its metadata and its records by (op, size)."""

    path: Path
    meta: dict[str, Any]
    records: list[dict[str, Any]]
    control: Run | None = field(default=None)

    @property
    def is_control(self) -> bool:
        return bool(self.meta.get("settings", {}).get("CXLMPI_DISABLE"))

    @property
    def kind(self) -> tuple[Any, Any]:
        bench = self.meta.get("bench", {})
        return bench.get("buffers"), bench.get("data_varying")

    @property
    def name(self) -> str:
        return f"{self.path.parent.name}/{self.path.stem}"

    def ops(self) -> list[str]:
        return list(dict.fromkeys(r["op"] for r in self.records))

    def by_key(self) -> dict[tuple[str, int], dict[str, Any]]:
        return {(r["op"], r["size"]): r for r in self.records}


def _files(kind: str) -> list[tuple[Path, dict[str, Any]]]:
    """(path, data) of every results file of `kind`: "sweep" (python -m
    cxlmpi.bench --json), "overlap" (... --overlap --json), "program"
    (tools/compare.py --json), "objects" (tools/bench_objects.py --json) or
    "setup" (tools/bench_setup.py --json), by folder."""
    out = []
    for folder in sorted(p for p in RESULTS.iterdir() if p.is_dir()) if RESULTS.is_dir() else []:
        for path in sorted(folder.glob("*.json")):
            data = json.loads(path.read_text())
            meta = data.get("metadata", {})
            if meta.get("tool") == "tools/compare.py":
                found = "program"
            elif meta.get("tool") == "tools/bench_objects.py":
                found = "objects"
            elif meta.get("tool") == "tools/bench_setup.py":
                found = "setup"
            elif meta.get("tool") == "cxlmpi.bench":
                found = "overlap" if meta.get("mode") == "overlap" else "sweep"
            else:
                raise ValueError(f"{path}: not a results file of python -m cxlmpi.bench "
                                 f"--json, tools/compare.py --json, "
                                 f"tools/bench_objects.py --json or "
                                 f"tools/bench_setup.py --json")
            if found == kind:
                out.append((path, data))
    return out


def load(kind: str = "sweep") -> list[Run]:
    """The runs of results/ (of `kind`: see _files), controls attached to the
    run they control; a control without a run stands alone."""
    runs = []
    by_folder: dict[Path, list[Run]] = {}
    for path, data in _files(kind):
        by_folder.setdefault(path.parent, []).append(Run(path, data["metadata"],
                                                         data["records"]))
    for found in by_folder.values():
        controls = [run for run in found if run.is_control]
        for run in found:
            if run.is_control:
                continue
            match = [c for c in controls if c.kind == run.kind]
            if match:
                run.control = match[0]
                controls.remove(match[0])
            runs.append(run)
        runs += controls
    return runs


def command(run: Run) -> str:
    """The command line that reproduces the run (the control's: the same
    with CXLMPI_DISABLE=1)."""
    meta = run.meta
    words = " ".join(meta.get("command", ["python", "-m", "cxlmpi.bench"]))
    prefix = "CXLMPI_DISABLE=1 " if run.is_control else ""
    return f"{prefix}mpiexec -n {meta.get('ranks', '?')} {words}"


def describe(run: Run) -> str:
    """Machine, CPU, ranks, MPI, date: one line."""
    meta = run.meta
    about = run.path.parent / "machine.txt"
    machine = meta.get("machine") or (about.read_text().strip() if about.exists() else
                                      f"host {meta.get('host', NOT_RECORDED)!r}")
    bench = meta.get("bench", {})
    data = "data varying between calls" if bench.get("data_varying") else "the same data"
    return (f"machine: {machine}; CPU: {meta.get('cpu') or NOT_RECORDED}; "
            f"{meta.get('ranks', '?')} ranks; MPI: {meta.get('mpi_library', NOT_RECORDED)}; "
            f"date: {meta.get('date', NOT_RECORDED)}; cxlmpi {meta.get('cxlmpi_version', '?')}, "
            f"{bench.get('buffers', '?')} buffers, {data}, median of "
            f"{bench.get('rounds', '?')} rounds")


def size_label(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def round_speedups(record: dict[str, Any]) -> list[float]:
    """stock / cxlmpi of each round (the spread the median hides)."""
    return [s / c for s, c in zip(record.get("rounds_stock_avg_us", []),
                                  record.get("rounds_cxlmpi_avg_us", [])) if c > 0]


#: How the table marks calls that did not all take the pool (as the figure does).
PATH_MARKS = {"mpi": " ✕", "mixed": " ◆"}


def table(run: Run) -> str:
    """Collectives down, sizes across; each cell: cxlmpi's speedup, and the
    control's in parentheses."""
    sizes = sorted({r["size"] for r in run.records if r["op"] != "Barrier"})
    mine = run.by_key()
    theirs = run.control.by_key() if run.control else {}
    lines = ["| collective | " + " | ".join(size_label(s) for s in sizes) + " |",
             "|---|" + "---:|" * len(sizes)]
    for op in run.ops():
        cells = []
        for size in sizes if op != "Barrier" else [0]:
            record = mine.get((op, size))
            if record is None:
                cells.append("")
                continue
            control = theirs.get((op, size))
            cell = f"{record['speedup']:.2f}x" + PATH_MARKS.get(record.get("path"), "")
            if control is not None:
                cell += f" / {control['speedup']:.2f}x"
            cells.append(cell)
        cells += [""] * (len(sizes) - len(cells))
        lines.append(f"| {op} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(run: Run, path: Path) -> None:
    """One panel per collective on one shared log speedup scale, 1.0 marked:
    cxlmpi's median speedup (● through the pool, ✕ passed to MPI, ◆ both),
    the spread of its rounds as a band, the control dashed beside it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = run.ops()
    columns = 4
    rows = math.ceil(len(ops) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.2 * columns, 2.4 * rows + 0.8),
                             sharey=True, squeeze=False)
    control = run.control.by_key() if run.control else {}
    every = [r["speedup"] for r in run.records] + [r["speedup"] for r in control.values()]
    spread = [s for r in run.records for s in round_speedups(r)]
    low = min(every + spread + [1.0]) / 1.15
    high = max(every + spread + [1.0]) * 1.15
    markers = {"pool": "o", "mpi": "x", "mixed": "D"}
    for ax, op in zip(axes.flat, ops):
        records = sorted((r for r in run.records if r["op"] == op), key=lambda r: r["size"])
        xs = [max(r["size"], 1) for r in records]
        ax.axhline(1.0, color="black", linewidth=0.8)
        bands = [round_speedups(r) or [r["speedup"]] for r in records]
        ax.fill_between(xs, [min(b) for b in bands], [max(b) for b in bands],
                        color="tab:blue", alpha=0.15, linewidth=0)
        ax.plot(xs, [r["speedup"] for r in records], color="tab:blue", linewidth=1.2)
        for x, r in zip(xs, records):
            ax.plot([x], [r["speedup"]], marker=markers.get(r.get("path"), "o"),
                    color="tab:blue", linestyle="none", markersize=5)
        theirs = [control.get((op, r["size"])) for r in records]
        if any(theirs):
            ax.plot([x for x, c in zip(xs, theirs) if c], [c["speedup"] for c in theirs if c],
                    color="gray", linestyle="--", linewidth=1, marker=".")
        ax.set_title(op, fontsize=9)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_ylim(low, high)
        if op == "Barrier":
            ax.set_xticks([1], ["no data"])
        else:
            ax.set_xticks(xs[::max(1, len(xs) // 4)],
                          [size_label(x) for x in xs[::max(1, len(xs) // 4)]], fontsize=7)
        ticks = [t for t in (0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 50) if low <= t <= high]
        ax.set_yticks(ticks, [f"{t:g}x" for t in ticks], fontsize=7)
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    for ax in list(axes.flat)[len(ops):]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel("stock / cxlmpi", fontsize=8)
    fig.suptitle("speedup (above 1: cxlmpi faster) — blue: cxlmpi (● pool, ✕ MPI, ◆ both; "
                 "band: rounds' spread); gray dashed: control (pool off)", fontsize=8)
    fig.text(0.5, 0.004, describe(run) + "\n" + command(run), ha="center", fontsize=6.5)
    fig.tight_layout(rect=(0, 0.05, 1, 0.96))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary(run: Run) -> str:
    """How many figures were above 1, and the control's spread: the
    numbers a reader checks first."""
    speedups = [r["speedup"] for r in run.records]
    text = (f"{sum(s >= 1.0 for s in speedups)} of {len(speedups)} figures at 1.00x or above, "
            f"median {statistics.median(speedups):.2f}x")
    if run.control:
        floor = sorted(r["speedup"] for r in run.control.records)
        deciles = statistics.quantiles(floor, n=10) if len(floor) > 1 else floor * 9
        text += (f"; the control (pool off: MPI against itself) read {floor[0]:.2f}x to "
                 f"{floor[-1]:.2f}x, 80 % of its figures within {deciles[0]:.2f}x to "
                 f"{deciles[-1]:.2f}x: a figure inside that band says nothing either way")
    return text + "."


def generate(plots: bool = True, write: bool = True) -> str:
    """The page's generated part: written to PAGE (with its figures) unless
    `write` is false."""
    if write:
        OUT.mkdir(exist_ok=True)
    parts = []
    for run in load():
        title = f"{run.name}" + (" (control)" if run.is_control and not run.control else "")
        parts += [f"## {title}", "", describe(run) + ".", "", "```sh", command(run)]
        if run.control:
            parts.append(command(run.control))
        parts += ["```", "", summary(run), ""]
        image = f"perf-{run.path.parent.name}-{run.path.stem}.png"
        if plots:
            if write:
                plot(run, OUT / image)
            parts += [f"```{{figure}} /_generated/{image}", f":alt: speedup per collective "
                      f"and size, {run.name}", "", f"{run.name}: {describe(run)}.", "```", ""]
        parts += ["Each cell: cxlmpi's speedup (stock time / cxlmpi time, median of the "
                  "rounds; ✕: the calls went to MPI, ◆: some did)"
                  + (" / the control's." if run.control else "."), "",
                  table(run), ""]
    parts += overlap_part() + programs_part() + objects_part() + setup_part()
    if not parts:
        parts = ["No results files are committed yet (results/*/*.json).", ""]
    text = "\n".join(parts)
    if write:
        PAGE.write_text(text)
    return text


def overlap_part() -> list[str]:
    """Per run of `python -m cxlmpi.bench --overlap`: a table of the
    nonblocking collectives with compute between post and wait."""
    parts = []
    for run in load("overlap"):
        theirs = run.control.by_key() if run.control else {}
        title = f"{run.name}" + (" (control)" if run.is_control and not run.control else "")
        parts += [f"## Overlap: {title}", "", describe(run) + ".", "", "```sh", command(run)]
        if run.control:
            parts.append(command(run.control))
        posted = all("cxlmpi_blocking_us" in r for r in run.records)
        started = all("cxlmpi_persistent_us" in r for r in run.records)
        parts += ["```", "", "Per nonblocking collective and size: the pure time of a call "
                  "posted and waited for at once, stock / cxlmpi"
                  + ("; cxlmpi's pure time over its blocking call's (the price of the "
                     "posted form)" if posted else "")
                  + ("; a Start + Wait of its persistent form (`Allreduce_init` & co., set "
                     "up once) over the blocking call" if started else "")
                  + "; OSU's overlap (compute "
                  "between post and wait, as long as the pure time"
                  + ("; here the thread waits off its core, as for a GPU kernel or I/O, "
                     "instead of computing" if run.meta.get("bench", {}).get("compute")
                     == "wait" else "")
                  + "); and the speedup of "
                  "post + compute + wait (stock time / cxlmpi time)"
                  + (" / the control's." if run.control else "."), "",
                  "| collective | size | pure (µs) | " + ("posted / blocking | " if posted else "")
                  + ("persistent / blocking | " if started else "") + "overlap | speedup |",
                  "|---|---:|---:|" + ("---:|" if posted else "") + ("---:|" if started else "")
                  + "---:|---:|"]
        for r in run.records:
            control = theirs.get((r["op"], r["size"]))
            parts.append(
                f"| {r['op']} | {size_label(r['size'])} | {r['stock_pure_us']:.0f} / "
                f"{r['cxlmpi_pure_us']:.0f} | "
                + (f"{r['cxlmpi_pure_us'] / r['cxlmpi_blocking_us']:.2f}x | " if posted else "")
                + (f"{r['cxlmpi_persistent_us'] / r['cxlmpi_blocking_us']:.2f}x | "
                   if started else "")
                + f"{r['stock_overlap_pct']:.0f} % / "
                f"{r['cxlmpi_overlap_pct']:.0f} % | {r['speedup']:.2f}x"
                + (f" / {control['speedup']:.2f}x" if control else "") + " |")
        parts.append("")
    return parts


def programs_part() -> list[str]:
    """Per tools/compare.py results file: the program, the command, the
    speedup to trust and the control's."""
    files = _files("program")
    if not files:
        return []
    parts = ["## Whole programs", "", "| program | ranks | speedup (per pair) | control "
             "| verdict | results agree | date, CPU |", "|---|---:|---:|---:|---|---|---|"]
    commands = []
    for path, data in files:
        meta, summary = data["metadata"], data["summary"]
        key = "program_time_s" if "program_time_s" in summary else "wall_s"
        trusted = summary[key]
        control = trusted.get("control")
        if control is None:   # (files written before compare.py recorded it)
            arms = {arm: [r[key] for r in data["runs"] if r["arm"] == arm]
                    for arm in ("stock MPI", "control")}
            if arms["control"]:
                control = statistics.median(s / c for s, c in zip(arms["stock MPI"],
                                                                 arms["control"]))
        parts.append(f"| `{path.parent.name}/{path.stem}` | {meta.get('ranks', '?')} | "
                     f"{trusted['paired']:.2f}x | "
                     + (f"{control:.2f}x" if isinstance(control, float) else "—")
                     + f" | {trusted['verdict']} | {'yes' if data['results_agree'] else 'NO'}"
                     f" | {meta.get('date', NOT_RECORDED)}, {meta.get('cpu') or NOT_RECORDED} |")
        commands.append(meta.get("command", "tools/compare.py"))
    return parts + ["", "Commands:", "", "```sh", *commands, "```", ""]


def objects_part() -> list[str]:
    """Per tools/bench_objects.py results file: the nonblocking object
    collectives with their large pickles through the node heap, against
    stock's blocking calls and against the same calls through MPI."""
    parts = []
    for path, data in _files("objects"):
        meta = data["metadata"]
        parts += [f"## Nonblocking object collectives: `{path.parent.name}/{path.stem}`", "",
                  f"{meta['ranks']} ranks, {meta.get('date', NOT_RECORDED)}, "
                  f"{meta.get('cpu') or NOT_RECORDED}, {meta.get('mpi', NOT_RECORDED)}.", "",
                  "```sh", meta["command"], "```", "",
                  "A numpy array sent as the object, posted and waited back to back (median "
                  "of the rounds, the slowest rank): stock mpi4py's blocking call (it has no "
                  "nonblocking one), cxlmpi's call with its large pickles through the node "
                  "heap, and the same call through MPI point-to-point (below "
                  "`CXLMPI_OBJECTS_THRESHOLD`, 256 KiB, both of cxlmpi's go through "
                  "MPI: their difference is the noise).", "",
                  "| call | size | stock (µs) | heap (µs) | MPI (µs) | stock / heap | "
                  "MPI / heap |", "|---|---:|---:|---:|---:|---:|---:|"]
        for r in data["rows"]:
            parts.append(f"| {r['call']} | {r['size']} | {r['stock_us']:.0f} | "
                         f"{r['heap_us']:.0f} | {r['mpi_us']:.0f} | "
                         f"{r['stock_over_heap']:.2f}x | {r['mpi_over_heap']:.2f}x |")
        parts.append("")
    return parts


def setup_part() -> list[str]:
    """Per folder of tools/bench_setup.py results: a new communicator's
    first collective (where cxlmpi sets its pool up), stock and cxlmpi."""
    by_folder: dict[str, list[tuple[Path, dict[str, Any]]]] = {}
    for path, data in _files("setup"):
        by_folder.setdefault(path.parent.name, []).append((path, data))
    parts = []
    for folder, files in by_folder.items():
        meta = files[0][1]["metadata"]
        parts += [f"## A new communicator's first collective: `{folder}`", "",
                  f"{meta['ranks']} ranks, {meta.get('cpu') or NOT_RECORDED}, "
                  f"{meta.get('mpi', NOT_RECORDED)}; `{folder}/machine.txt` says what each "
                  f"file ran.", "", "```sh", meta["command"], "```", "",
                  "The slowest rank's first `Allreduce` on a new communicator (median over "
                  "the communicators): kept alive to the end, or each freed before the next "
                  "(its pool taken over by the next).", "",
                  "| file | date | mode | stock (µs) | cxlmpi (µs) |",
                  "|---|---|---|---:|---:|"]
        for path, data in files:
            for r in data["rows"]:
                parts.append(f"| {path.stem} | {data['metadata'].get('date', NOT_RECORDED)} "
                             f"| {r['mode']} | {r['stock_us']:.1f} | {r['cxlmpi_us']:.1f} |")
        parts.append("")
    return parts


def setup(app: Any) -> dict[str, Any]:
    app.connect("builder-inited", lambda app: generate())
    return {"parallel_read_safe": True, "parallel_write_safe": True}


if __name__ == "__main__":
    print(generate())

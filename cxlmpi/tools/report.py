"""What the benchmark writes (cxlmpi.tools.bench): the table, CSV, JSON,
the plot, and the progress lines on stderr."""

from __future__ import annotations

import csv
import json
import math
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["format_size", "format_table", "write_csv", "write_json", "plot_figure",
           "write_plot", "plural", "align_rows", "Progress", "format_duration", "PATH_MARKERS",
           "PATH_LABELS",
           "CSV_FIELDS"]


def format_size(nbytes: int) -> str:
    """'8 B', '64 KiB', '16 MiB', '1 GiB'; plain bytes when not a whole unit."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def _us(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    if value < 100:
        return f"{value:.2f}"
    if value < 10000:
        return f"{value:.1f}"
    return f"{value:.0f}"


def format_table(records: Sequence[dict[str, Any]], validated: bool) -> str:
    """The records as an aligned text table."""
    head = ["op", "size", "stock us", "min/max", "cxlmpi us", "min/max", "speedup",
            "memcpy us", "cxlmpi/memcpy", "path", "chosen (learning calls)"] + \
        (["check"] if validated else [])
    rows = [head]
    for r in records:
        ratio = r["cxlmpi_per_memcpy"]
        row = [r["op"], format_size(r["size"]) if r["op"] != "Barrier" else "-",
               _us(r["stock_avg_us"]), f"{_us(r['stock_min_us'])}/{_us(r['stock_max_us'])}",
               _us(r["cxlmpi_avg_us"]), f"{_us(r['cxlmpi_min_us'])}/{_us(r['cxlmpi_max_us'])}",
               f"{r['speedup']:.2f}x", _us(r["memcpy_avg_us"]),
               "-" if ratio is None else f"{ratio:.2f}x", r["path"],
               "-" if r.get("choice") is None else
               f"{r['choice']} ({r.get('learning_calls', 0)})"]
        if validated:
            row.append("ok" if r["valid"] else "FAIL")
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) if i < 2 else cell.rjust(w)
                       for i, (cell, w) in enumerate(zip(row, widths))).rstrip()
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


CSV_FIELDS = ("op", "size", "requested_size", "total_bytes", "dtype", "count", "ranks",
              "iterations", "warmup", "rounds",
              "stock_avg_us", "stock_min_us", "stock_max_us",
              "cxlmpi_avg_us", "cxlmpi_min_us", "cxlmpi_max_us", "speedup",
              "memcpy_avg_us", "memcpy_min_us", "memcpy_max_us", "cxlmpi_per_memcpy",
              "path", "pool_calls", "passthrough_calls", "learning_calls", "choice", "buffers",
              "data_varying", "valid")


def write_csv(path: str, records: Sequence[dict[str, Any]]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(records)


def write_json(path: str, records: Sequence[dict[str, Any]], metadata: dict[str, Any]) -> None:
    with open(path, "w") as f:
        json.dump({"metadata": metadata, "records": list(records)}, f, indent=1,
                  default=str)
        f.write("\n")


# How cxlmpi ran the calls of a record ("path"), as a marker of its points.
PATH_MARKERS = {"pool": "o", "view": "D", "mixed": "s", "mpi": "x"}
PATH_LABELS = {"pool": "cxlmpi: pool", "view": "cxlmpi: by reference",
               "mixed": "cxlmpi: pool and MPI", "mpi": "cxlmpi: passed to MPI"}
STOCK_COLOUR, SHIM_COLOUR, MEMCPY_COLOUR = "0.45", "tab:blue", "0.7"


def _round_speedups(record: dict[str, Any]) -> list[float]:
    """stock / cxlmpi of each round (the two alternate in every round)."""
    pairs = zip(record.get("rounds_stock_avg_us") or [], record.get("rounds_cxlmpi_avg_us") or [])
    return [s / c for s, c in pairs if c]


# The speedup ticks offered (log scale): powers of two, and finer ones where
# the shared range is narrow; those within it are shown.
SPEEDUP_TICKS = tuple(2.0 ** k for k in range(-6, 7))
FINE_TICKS = (0.5, 2 / 3, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0)


def speedup_ticks(scale: tuple[float, float]) -> list[float]:
    """The ticks of the shared speedup scale `scale`."""
    offered = FINE_TICKS if scale[1] / scale[0] < 4 else SPEEDUP_TICKS
    return [t for t in offered if scale[0] <= t <= scale[1]]


def speedup_range(records: Sequence[dict[str, Any]]) -> tuple[float, float]:
    """The speedup scale every panel shares: the medians of all records and
    1.0, with a margin (log scale).  The rounds' spread does not widen it:
    its whiskers are clipped to it, so one noisy round never squeezes the
    medians of every panel into a sliver."""
    values = [r["speedup"] for r in records if r.get("speedup") and math.isfinite(r["speedup"])]
    low, high = min([1.0, *values]), max([1.0, *values])
    return low / 1.3, high * 1.3


def _whiskers(ax: Any, x: Sequence[float], spans: Sequence[tuple[float, float]],
              colour: str, label: str, clip: tuple[float, float] | None = None) -> None:
    """Thin vertical lines from the fastest to the slowest round at each x
    (clipped to `clip`, the panel's range), behind the medians."""
    if not spans:
        return
    lo = [a if clip is None else min(max(a, clip[0]), clip[1]) for a, _ in spans]
    hi = [b if clip is None else min(max(b, clip[0]), clip[1]) for _, b in spans]
    ax.vlines(x, lo, hi, colors=colour, lw=1.0, alpha=0.55, label=label, zorder=1)


def _span(median: float | None, values: Sequence[float]) -> tuple[float, float]:
    """(min, max) of the rounds (the median alone when there are none)."""
    values = [v for v in values if v is not None]
    return (min(values), max(values)) if values else (median or 0.0, median or 0.0)


def plot_figure(records: Sequence[dict[str, Any]],
                metadata: dict[str, Any] | None = None) -> Figure:
    """A matplotlib Figure of `records` (as ``--json`` writes them): one
    panel per collective measured (in the order measured, Barrier too),
    each a latency plot (stock, cxlmpi and memcpy, µs, log scale) above a
    speedup plot (stock / cxlmpi).  The speedup plots share one log scale
    (`speedup_range`) with 1.0 drawn and the side above it (cxlmpi faster)
    shaded apart from the side below.  Points are the medians of the
    rounds, at the measured sizes only (x ticks at exactly those; Barrier,
    which has no size, is one point over "no message"); the spread over the
    rounds is a thin whisker from the fastest to the slowest round, clipped
    to the panel; cxlmpi's marker says how it ran the calls (PATH_MARKERS).
    Axes are labelled "<op> latency" or "<op> speedup"
    (``Axes.get_label()``); the medians are Line2D labelled by series
    ("stock", "memcpy", PATH_LABELS), the whiskers LineCollections
    labelled "<series> spread".  Needs matplotlib 3.7 or later (the
    optional ``[bench]`` extra)."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator

    ops = list(dict.fromkeys(r["op"] for r in records))
    if not ops:
        raise ValueError("nothing to plot: no record")
    scale = speedup_range(records)
    ncols = min(4, len(ops))
    nrows = math.ceil(len(ops) / ncols)
    fig = Figure(figsize=(3.9 * ncols, 4.2 * nrows + 1.1), layout="constrained")
    grid = fig.add_gridspec(nrows, ncols)
    paths_seen: list[str] = []
    for i, op in enumerate(ops):
        rows = sorted((r for r in records if r["op"] == op), key=lambda r: r["size"])
        sized = rows[0]["size"] > 0
        xs = [r["size"] if sized else 0 for r in rows]
        cell = grid[i // ncols, i % ncols].subgridspec(2, 1, height_ratios=[3, 2], hspace=0)
        lat = fig.add_subplot(cell[0], label=f"{op} latency")
        gain = fig.add_subplot(cell[1], sharex=lat, label=f"{op} speedup")
        lat.set_title(op, fontsize="medium")
        for label, colour, marker in (("stock", STOCK_COLOUR, "s"),
                                      ("memcpy", MEMCPY_COLOUR, "_")):
            points = [(x, r[f"{label}_avg_us"], r.get(f"rounds_{label}_avg_us") or [])
                      for x, r in zip(xs, rows) if r.get(f"{label}_avg_us")]
            if points:
                _whiskers(lat, [p[0] for p in points], [_span(p[1], p[2]) for p in points],
                          colour, f"{label} spread")
                lat.plot([p[0] for p in points], [p[1] for p in points], ls="none",
                         marker=marker, color=colour, ms=5, label=label, zorder=2)
        gain.axhspan(1.0, scale[1], color="tab:green", alpha=0.07, lw=0)
        gain.axhspan(scale[0], 1.0, color="tab:red", alpha=0.07, lw=0)
        gain.axhline(1.0, color="black", lw=0.9, label="1.0x", zorder=1.5)
        for path in PATH_MARKERS:
            group = [(x, r) for x, r in zip(xs, rows) if r["path"] == path]
            if not group:
                continue
            if path not in paths_seen:
                paths_seen.append(path)
            x = [g[0] for g in group]
            style = dict(ls="none", marker=PATH_MARKERS[path], color=SHIM_COLOUR, ms=6,
                         mfc="none" if path == "mpi" else SHIM_COLOUR,
                         label=PATH_LABELS[path], zorder=2)
            _whiskers(lat, x, [_span(r["cxlmpi_avg_us"], r.get("rounds_cxlmpi_avg_us") or [])
                               for _, r in group], SHIM_COLOUR, f"{PATH_LABELS[path]} spread")
            lat.plot(x, [r["cxlmpi_avg_us"] for _, r in group], **style)
            _whiskers(gain, x, [_span(r["speedup"], _round_speedups(r)) for _, r in group],
                      SHIM_COLOUR, f"{PATH_LABELS[path]} spread", clip=scale)
            gain.plot(x, [r["speedup"] for _, r in group], **style)
        lat.set_yscale("log")
        low, high = lat.get_ylim()
        if high < 10 * low:     # at least a decade: labelled ticks, never 2x10^1
            middle = math.sqrt(low * high)
            lat.set_ylim(middle / 5, middle * 5)
        lat.yaxis.set_minor_formatter(NullFormatter())
        lat.grid(True, which="major", alpha=0.3)
        lat.tick_params(labelbottom=False)
        if i % ncols == 0:
            lat.set_ylabel("µs per call")
            gain.set_ylabel("speedup (stock / cxlmpi)")
        gain.set_yscale("log")
        gain.set_ylim(*scale)
        gain.yaxis.set_major_locator(FixedLocator(speedup_ticks(scale)))
        gain.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.3g}x"))
        gain.yaxis.set_minor_locator(NullLocator())
        if sized:
            gain.set_xscale("log", base=2)
            gain.xaxis.set_major_locator(FixedLocator(xs))
            gain.xaxis.set_minor_locator(NullLocator())
            gain.set_xticks(xs, [format_size(s) for s in xs], fontsize="x-small",
                            rotation=90 if len(xs) > 4 else 0)
            gain.set_xlim(xs[0] / 1.5, xs[-1] * 1.5)
        else:
            gain.set_xticks([0], ["no message"], fontsize="x-small")
            gain.set_xlim(-1, 1)
        gain.grid(True, axis="y", alpha=0.3)
        if i // ncols == nrows - 1 or i + ncols >= len(ops):
            gain.set_xlabel("message size")
    handles: list[Any] = [Line2D([], [], ls="", marker="s", color=STOCK_COLOUR,
                                 label="stock MPI")]
    handles += [Line2D([], [], ls="", marker=PATH_MARKERS[p], color=SHIM_COLOUR,
                       mfc="none" if p == "mpi" else SHIM_COLOUR, label=PATH_LABELS[p])
                for p in paths_seen]
    handles += [Line2D([], [], ls="", marker="_", color=MEMCPY_COLOUR, label="memcpy (reference)"),
                Line2D([], [], color="0.4", lw=1.0, alpha=0.55,
                       label="fastest to slowest round"),
                Patch(color="tab:green", alpha=0.15, label="cxlmpi faster"),
                Patch(color="tab:red", alpha=0.15, label="cxlmpi slower")]
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 8),
               fontsize="small", frameon=False)
    title = "points: median of the rounds; speedup = stock / cxlmpi, one scale for all"
    if metadata:
        library = metadata["mpi_library"].split(",")[0].replace(" Version:", "")
        title = (f"cxlmpi {metadata['cxlmpi_version']} vs stock {library}, "
                 f"{plural(metadata['ranks'], 'rank')}, {metadata['bench']['buffers']} buffers"
                 + (f", {metadata['cpu']}" if metadata.get("cpu") else "")
                 + (f", {metadata['date'][:10]}" if metadata.get("date") else "")
                 + f"\n{title}")
        if metadata.get("command_line"):
            fig.text(0.5, 0.0, metadata["command_line"], ha="center", va="bottom",
                     fontsize="x-small", family="monospace", color="0.3")
    fig.suptitle(title, fontsize="medium")
    return fig


def write_plot(path: str, records: Sequence[dict[str, Any]], metadata: dict[str, Any]) -> None:
    """Save `plot_figure(records, metadata)` to `path` (PNG, SVG, PDF: by
    the suffix)."""
    plot_figure(records, metadata).savefig(path, dpi=120)


def align_rows(rows: list[list[str]], left: int = 1) -> str:
    """A plain-text table of `rows` (the first one the header, ruled under
    it): the first `left` columns aligned left, the others right."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) if i < left else cell.rjust(w)
                       for i, (cell, w) in enumerate(zip(row, widths))).rstrip()
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def plural(count: int, noun: str) -> str:
    """'1 rank', '2 ranks'."""
    return f"{count} {noun}{'' if count == 1 else 's'}"



def format_duration(seconds: float) -> str:
    """'45 s', '2.7 min', '1.2 h'."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


class Progress:
    """'[i/n] op size  (12 s elapsed, ~30 s left)' lines on stderr (rank
    0): one overwritten line on a terminal, one line each otherwise.  The
    time left is the plan's estimate of the steps left (`estimates`:
    seconds per step; none: every step alike), scaled by how long the steps
    done took against their estimate (weighed against the plan until a
    fifth of it is done: one short step says little)."""

    def __init__(self, total: int, enabled: bool,
                 estimates: Sequence[float] | None = None) -> None:
        self.total, self.enabled, self.done = total, enabled, 0
        self.tty = enabled and sys.stderr.isatty()
        self.estimates = list(estimates) if estimates else [1.0] * total
        self.start = time.perf_counter()

    def left_s(self, finished: int, elapsed: float) -> float:
        """Seconds left after `finished` steps took `elapsed`."""
        planned_done = sum(self.estimates[:finished])
        planned_left = sum(self.estimates[finished:])
        prior = (planned_done + planned_left) / 5
        return planned_left * (elapsed + prior) / (planned_done + prior or 1.0)

    def step(self, text: str) -> None:
        self.done += 1
        if not self.enabled:
            return
        elapsed = time.perf_counter() - self.start
        left = self.left_s(self.done - 1, elapsed)
        line = (f"[{self.done}/{self.total}] {text}  ({format_duration(elapsed)} elapsed, "
                f"~{format_duration(left)} left)")
        sys.stderr.write(f"\r\033[K{line}" if self.tty else line + "\n")
        sys.stderr.flush()

    def close(self) -> float:
        """End the progress lines; the seconds since the start."""
        if self.tty:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
        return time.perf_counter() - self.start

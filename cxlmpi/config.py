"""Every CXLMPI_* setting in one place: its type, default and meaning.

Settings are read from the environment once, on first use; `reload()` reads
them again (tests, and `python -m cxlmpi` after applying its options).  Every
rank of a job must see the same values: the pool path is chosen from them.
"""

from __future__ import annotations

import os
import re
import stat
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable, TextIO

from ._pool import COLLECTIVES  # the intercepted collectives, by index (pyx/cxl_codes.h)
from .errors import CXLMPIConfigError

__all__ = ["Variable", "VARIABLES", "AGREED", "INTERNAL", "Config", "get", "reload",
           "parse_size", "plain", "unknown", "describe_unknown", "on_change"]

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10,
          "M": 1 << 20, "MB": 1 << 20, "MIB": 1 << 20,
          "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}


_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([KMG]?I?B?)$")


def parse_size(text: str) -> int:
    """Bytes from '65536', '64K', '64KiB', '16M', '1G' (powers of two)."""
    m = _SIZE.match(text.strip().upper())
    if m is None or m.group(2) not in _UNITS:
        raise ValueError(f"not a size: {text!r} (use e.g. 65536, 64K, 16M, 1G)")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def _parse_bool(text: str) -> bool:
    s = text.strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"not a boolean: {text!r} (use 1 or 0)")


def _parse_alloc(text: str) -> bool | None:
    """CXLMPI_ALLOC: True, False, or None for auto."""
    if text.strip().lower() == "auto":
        return None
    return _parse_bool(text)


COHERENCE_MODES = ("auto", "hw", "sw", "emulate")


def _parse_coherence(text: str) -> str:
    s = text.strip().lower()
    if s not in COHERENCE_MODES:
        raise ValueError(f"not a coherence mode: {text!r} (use auto, hw, sw or emulate)")
    return s


EMULATE_FAULTS = ("none", "skip-flush", "skip-invalidate")


def _parse_fault(text: str) -> str:
    s = text.strip().lower()
    if s not in EMULATE_FAULTS:
        raise ValueError(f"not an emulator fault: {text!r} (use none, skip-flush or "
                         f"skip-invalidate)")
    return s


def _parse_seed(text: str) -> int:
    value = int(text, 0)
    if value < 0 or value >= 1 << 64:
        raise ValueError(f"not a seed: {text!r} (use an integer from 0 to 2**64 - 1)")
    return value


def _parse_backend(text: str) -> str:
    from .spec import parse_spec

    return str(parse_spec(text))


def _parse_groups(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(f"not a number of pool groups: {text!r} (use 1 or more)")
    return value


def _parse_seconds(text: str) -> float:
    value = float(text)
    if not 0.01 <= value <= 60:
        raise ValueError(f"not a heartbeat period: {text!r} (use 0.01 to 60 seconds)")
    return value


def _parse_beats(text: str) -> int:
    value = int(text)
    if value < 5:
        raise ValueError(f"not a number of heartbeats: {text!r} (use 5 or more)")
    return value


def _parse_timeout(text: str) -> float:
    value = float(text)
    if value < 0:
        raise ValueError(f"negative timeout: {text!r}")
    return value


@dataclass(frozen=True)
class Variable:
    """One setting, described once: environment name, parser (its type),
    default (as text), meaning, and whether every rank must see the same
    value (`agreed`: it decides which path a call takes or how the pool is
    laid out, so ranks that disagree would take different paths and
    deadlock).  `agreed` has no default: every setting says it
    deliberately.  `doc` is one paragraph, Markdown (`code`, *see also*):
    its first sentence is the summary that the command line's usage text
    shows; the settings reference (docs/reference/settings.md) and --info
    print all of it (cxlmpi.reports.info)."""

    name: str
    parse: Callable[[str], Any]
    default: str
    doc: str
    agreed: bool

    @property
    def key(self) -> str:
        """Attribute name on `Config` (CXLMPI_POOL_SIZE -> pool_size)."""
        return self.name[len("CXLMPI_"):].lower()

    @property
    def summary(self) -> str:
        """The first sentence of `doc`, without its full stop."""
        return self.doc.split(". ", 1)[0].rstrip(".")


def plain(markdown: str) -> str:
    """A setting's doc (or any of its sentences) as plain text: without
    backquotes and emphasis."""
    return markdown.replace("`", "").replace("*", "")


VARIABLES: tuple[Variable, ...] = (
    Variable("CXLMPI_POOL", _parse_backend, "shm",
             "Where pools live: `shm`, `numa:N`, `file:PATH` or `dax:/dev/daxX.Y`. `shm`: "
             "POSIX shared memory, one private segment per pool; `numa:N`: the same, pages "
             "bound to NUMA node *N* (a CXL expander in system-ram mode is a CPU-less "
             "node); `file:PATH`: a file on tmpfs, hugetlbfs or an fsdax mount, "
             "partitioned between jobs; `dax:/dev/daxX.Y`: a devdax device, partitioned "
             "between jobs. See *Use a CXL device* in the docs.",
             agreed=True),
    Variable("CXLMPI_POOL_GROUP", str, "",
             "A `file:` or `dax:` pool shared by the users of this group (name or gid). "
             "The file or device must belong to the group, and nobody outside it may read "
             "or write it; files cxlmpi creates are then mode 0660 in that group. Unset: "
             "pool memory is its owner's alone (0600). A rank that cannot open the pool "
             "fails the set-up on every rank. See *The safety model* in the docs.",
             agreed=False),
    Variable("CXLMPI_HEARTBEAT", _parse_seconds, "0.1",
             "Seconds between a process's heartbeats. These are counters in its control "
             "lines, its partition-table entries and the table lock it holds, advanced by "
             "a thread of its own, by which observers on other hosts or in other "
             "containers (where its pid means nothing) see that it lives.",
             agreed=False),
    Variable("CXLMPI_LEASE_BEATS", _parse_beats, "30",
             "Heartbeats an observer waits for (by its own monotonic clock) before it "
             "judges a process whose counter stood still gone. A pool collective waiting "
             "on it then raises `CXLMPIPeerError`, and its partitions may be reclaimed.",
             agreed=False),
    Variable("CXLMPI_POOL_GROUPS", _parse_groups, "1",
             "Split the ranks that share memory into this many pool groups (consecutive "
             "ranks). Collectives then run hierarchically (in each pool, then MPI among "
             "group leaders), as across hosts.",
             agreed=True),
    Variable("CXLMPI_POOL_SIZE", parse_size, "64M",
             "Bytes of each communicator's pool segment (control lines plus two data "
             "halves per rank). Larger messages are pipelined, never refused. Its control "
             "lines and slots are reserved in /dev/shm (or the pool file) when it is "
             "created: a pool that does not fit leaves the communicator with MPI, with "
             "one warning.",
             agreed=True),
    Variable("CXLMPI_ARENA_SIZE", parse_size, "1G",
             "Bytes per rank for pool-resident arrays (`cxlmpi.empty` & co., the NumPy "
             "hook) in the node heap (0: none). One budget for every communicator that "
             "shares it (a pool made before the heap has arenas of its own); address "
             "space only until used, each array's block reserved as it is handed out.",
             agreed=True),
    Variable("CXLMPI_ZEROCOPY_THRESHOLD", parse_size, "256K",
             "Smallest Bcast, reduction or gather (bytes) that first asks, in one control "
             "step, where every rank's buffers live, so that pool arrays are used in "
             "place.",
             agreed=True),
    Variable("CXLMPI_THRESHOLD", parse_size, "4K",
             "Smallest message (bytes) that goes through the pool; smaller ones pass "
             "through to MPI.",
             agreed=True),
    Variable("CXLMPI_HOSTS_THRESHOLD", parse_size, "0",
             "Smallest message (bytes) that goes through a pool whose ranks run on "
             "several hosts (a `file:` or `dax:` pool that hosts share, where MPI would "
             "cross the network). By default every size may take the pool, and adaptive "
             "selection still times MPI against it.",
             agreed=True),
    Variable("CXLMPI_TUNING", str, "adaptive",
             "Which path each call takes: `adaptive`, `builtin`, `pool` or a tuning file. "
             "`adaptive`: each communicator measures stock MPI and the pool's variants on "
             "its first calls of each collective, size class and buffer placement, keeps "
             "the fastest and re-checks it now and then (see `CXLMPI_CACHE` and *Path "
             "selection*). The others pin the choice: `builtin` (the table of sizes shipped "
             "as `cxlmpi/builtin-tuning.json`), `pool` (every size ≥ `CXLMPI_THRESHOLD`: "
             "for tests), or the path of a JSON file `{\"allgather\": [lo, hi], "
             "\"gather\": null, ...}` (bytes, `null` = no bound; a collective mapped to "
             "`null` stays with MPI), which `python -m cxlmpi.tune --output FILE` writes.",
             agreed=True),
    Variable("CXLMPI_CACHE", str, "~/.cache/cxlmpi/selection.json",
             "Where adaptive selection remembers what it learned, per machine (CPU model, "
             "cores, ranks per pool, MPI library, cxlmpi version, pool kind); `off`: "
             "nowhere. Rank 0 reads it when a communicator's pool is set up and hands it "
             "to the others, and writes what settled when the communicator is freed or "
             "the job ends; `python -m cxlmpi.tune` fills it.",
             agreed=False),
    Variable("CXLMPI_CHUNK_SIZE", parse_size, "256K",
             "Bytes each rank publishes per pipeline step.",
             agreed=True),
    Variable("CXLMPI_RSAG_THRESHOLD", parse_size, "64K",
             "Smallest reduction (bytes) that uses reduce-scatter + allgather instead of "
             "every rank reducing everything (three ranks or more).",
             agreed=True),
    Variable("CXLMPI_TIMEOUT", _parse_timeout, "300",
             "Seconds a pool collective waits for the other ranks before raising "
             "`CXLMPITimeoutError` (0: wait forever). The error names the collective, the "
             "communicator and the missing ranks.",
             agreed=False),
    Variable("CXLMPI_COHERENCE", _parse_coherence, "auto",
             "How caches are kept coherent: `auto`, `hw`, `sw` or `emulate`. `hw`: caches "
             "are coherent; `sw`: flush written lines and invalidate before reads (CXL "
             "memory shared by hosts without hardware coherence); `auto`: `sw` for a pool "
             "whose ranks MPI sees on more than one host (its communicator spans several "
             "`COMM_TYPE_SHARED` groups), `hw` otherwise (`hw` across hosts only when set "
             "explicitly); `emulate`: `sw` on memory made to behave like caches without "
             "coherence, to test the protocol on one host (see *Coherence* in the docs).",
             agreed=True),
    Variable("CXLMPI_EMULATE_SEED", _parse_seed, "0",
             "With `CXLMPI_COHERENCE=emulate`: the seed of the emulated caches' random "
             "evictions of dirty lines (each rank mixes in its rank).",
             agreed=False),
    Variable("CXLMPI_EMULATE_FAULT", _parse_fault, "none",
             "With `CXLMPI_COHERENCE=emulate`, for tests: `none`, `skip-flush` or "
             "`skip-invalidate`. `skip-flush` drops every write-back of data lines, "
             "`skip-invalidate` every invalidation (control lines are spared); the suite "
             "then fails, which shows that the emulator catches a missing step.",
             agreed=False),
    Variable("CXLMPI_OBJECTS", _parse_bool, "0",
             "Send large object (pickle) collectives through the pool: the blocking ones "
             "(`comm.bcast`, ...) as pool collectives, the nonblocking ones' (`comm.ibcast`, "
             "...) large pickles through the node heap. Off by default: settling the "
             "blocking ones' path costs small calls a header step and a second pickling "
             "(measured 1.5–2.4x stock on a float `allreduce`).",
             agreed=True),
    Variable("CXLMPI_ALLOC", _parse_alloc, "auto",
             "Whether NumPy places arrays of `CXLMPI_ZEROCOPY_THRESHOLD` bytes and more in "
             "the node heap (NEP 49 allocation hook), used in place by every "
             "communicator: `1`, `0` or `auto`. `auto`: on where every rank's pool memory "
             "gets huge pages (`--info` says), off elsewhere: on 4 KiB pages TLB-bound "
             "code runs slower on pool arrays than on NumPy's own.",
             agreed=True),
    Variable("CXLMPI_ALLOC_THRESHOLD", parse_size, "0",
             "Smallest array (bytes) the NumPy hook places in the pool (0: "
             "`CXLMPI_ZEROCOPY_THRESHOLD`). Apart from it, it tells what the pool "
             "allocator gains from what zero copy gains: with "
             "`CXLMPI_ZEROCOPY_THRESHOLD=1024G` the arrays are in the pool and the "
             "collectives copy. Where each rank's buffers live is exchanged in a header "
             "step of every call that could use them in place.",
             agreed=False),
    Variable("CXLMPI_PROGRESS", _parse_bool, "1",
             "While a rank waits in the pool it calls MPI progress now and then, so that a "
             "peer waiting on it in MPI (RMA, a large send, a nonblocking collective) is "
             "served. `0` turns that off, only to measure its cost: a program can then "
             "hang (see *Architecture and protocol* in the docs).",
             agreed=True),      # (a rank with it on sets a helper communicator up)
    Variable("CXLMPI_ORDERING", _parse_bool, "1",
             "A pool collective orders the rank's earlier MPI traffic as stock MPI's own "
             "collective would. It ends with an MPI barrier on a private communicator, so "
             "that what a rank's peers sent through MPI before it (an eager send, an RMA "
             "epoch's completion) has reached the rank when it leaves; Barrier itself "
             "goes to MPI. `0` drops it, for programs that never rely on that order.",
             agreed=True),      # (a rank with it on makes MPI calls its peers must match)
    Variable("CXLMPI_NONBLOCKING", _parse_bool, "1",
             "Nonblocking and persistent collectives (`Iallreduce`, `Allreduce_init`, ...) "
             "go through the pool under the blocking forms' rules, run by one worker "
             "thread per communicator's pool while the program computes, behind real MPI "
             "requests. It needs MPI started with `MPI_THREAD_MULTIPLE` (mpi4py's "
             "default); elsewhere, or with `0`, they all go to MPI.",
             agreed=True),
    Variable("CXLMPI_NONBLOCKING_THRESHOLD", parse_size, "64K",
             "Smallest nonblocking or persistent collective (bytes, all blocks together) "
             "that goes through the pool; smaller ones go to MPI (but under "
             "`CXLMPI_TUNING=pool` `Igatherv`, `Iscatterv` and `Ialltoallv`, whose sizes "
             "only some ranks know: any size; `Ibarrier` and `Barrier_init` always go to "
             "MPI). A posted call pays a "
             "generalized request, which smaller calls do not earn back (measured "
             "with `python -m cxlmpi.bench --overlap`; the figures are on the "
             "*Performance* page).",
             agreed=True),
    Variable("CXLMPI_OBJECTS_THRESHOLD", parse_size, "256K",
             "Under `CXLMPI_OBJECTS=1`, the smallest pickle of a nonblocking object "
             "collective (`comm.ibcast`, ...) that goes through the node heap; smaller "
             "ones go through MPI point-to-point, which was as fast or faster below it "
             "(`tools/bench_objects.py`).",
             agreed=True),
    Variable("CXLMPI_STATS", _parse_bool, "0",
             "Print a table of calls, bytes and time per collective at exit. The object "
             "collectives (`comm.bcast`, ...) appear as `bcast(obj)` & co.",
             agreed=False),
    Variable("CXLMPI_DISABLE", _parse_bool, "0",
             "Pass every call through to MPI; the shim stays in place. Calls go through "
             "mpi4py's own methods, none of cxlmpi's straight to the library, so that it "
             "also rules those out when something looks wrong (0.1–0.4 µs more per call "
             "than stock on the 2-core VM: 0.93x at 2–8 KiB).",
             agreed=True),
)


#: CXLMPI_* names that are not settings but are read on purpose, so that
#: they never draw the unknown-variable warning.  Keep this set small: a
#: name here is one a user can misspell a setting into without being told.
INTERNAL: dict[str, str] = {
    "CXLMPI_SYSFS": "the /sys tree that device sizes and alignments are read "
                    "from (the tests' stand-in for a devdax device)",
    "CXLMPI_EXPECT_FLUSH": "tests: the suite runs with CXLMPI_COHERENCE=sw and "
                           "checks that lines were flushed",
    "CXLMPI_TEST_OPENMPI": "tests: the suite runs on Open MPI (make test-openmpi)",
}


def unknown(environ: dict[str, str] | None = None) -> list[tuple[str, str | None]]:
    """The CXLMPI_* variables of the environment that cxlmpi does not read
    (neither a setting of VARIABLES nor INTERNAL), sorted, each with the
    closest setting's name (None: nothing close): a misspelled setting is
    otherwise ignored without a word."""
    import difflib

    env = os.environ if environ is None else environ
    # Compared without the prefix every name shares, which would make any
    # two look alike.
    known = [var.key.upper() for var in VARIABLES]
    out = []
    for name in sorted(env):
        if not name.startswith("CXLMPI_") or name in _KEYS or name in INTERNAL:
            continue
        close = difflib.get_close_matches(name[len("CXLMPI_"):], known, n=1, cutoff=0.6)
        out.append((name, "CXLMPI_" + close[0] if close else None))
    return out


def describe_unknown(name: str, suggestion: str | None) -> str:
    """One line about an unknown variable, for the warning and --info."""
    hint = f"did you mean {suggestion}?" if suggestion else "no setting has a similar name"
    return f"{name} is not a cxlmpi setting and is ignored ({hint})"


_warned = False


def _warn_unknown(stream: TextIO | None = None) -> None:
    """Once per process (on rank 0 of COMM_WORLD when MPI runs, so that a
    job prints it once): a line on stderr per unknown CXLMPI_* variable."""
    global _warned
    if _warned:
        return
    _warned = True
    found = unknown()
    if not found:
        return
    mpi = sys.modules.get("mpi4py.MPI")  # (importing it here could start MPI)
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        if mpi.COMM_WORLD.Get_rank() != 0:
            return
    elif _launcher_rank() not in (None, 0):
        return
    stream = sys.stderr if stream is None else stream
    for name, suggestion in found:
        stream.write(f"cxlmpi: warning: {describe_unknown(name, suggestion)}; "
                     f"`python -m cxlmpi --info` lists the settings\n")
    stream.flush()


def _launcher_rank() -> int | None:
    """This process's rank as the launcher tells it (MPICH's hydra, Open
    MPI's prterun, Slurm), before MPI is started; None outside a launcher."""
    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return None


#: The settings every rank must agree on (checked when a pool is set up and
#: when cxlmpi is patched in), derived from the table: never kept by hand.
AGREED: tuple[str, ...] = tuple(var.name for var in VARIABLES if var.agreed)
_KEYS = {var.name: var.key for var in VARIABLES}


class Config:
    """The settings in force; one attribute per variable (see VARIABLES)."""

    pool: str
    pool_group: str
    heartbeat: float
    lease_beats: int
    pool_groups: int
    pool_size: int
    arena_size: int
    zerocopy_threshold: int
    threshold: int
    hosts_threshold: int
    tuning: str
    cache: str
    chunk_size: int
    rsag_threshold: int
    timeout: float
    coherence: str
    emulate_seed: int
    emulate_fault: str
    objects: bool
    alloc: bool | None   # None: auto (where pool memory gets huge pages)
    alloc_threshold: int
    progress: bool
    ordering: bool
    nonblocking: bool
    nonblocking_threshold: int
    objects_threshold: int
    stats: bool
    disable: bool

    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        for var in VARIABLES:
            text = env.get(var.name, var.default)
            try:
                value = var.parse(text)
            except ValueError as exc:
                raise CXLMPIConfigError(f"{var.name}={text!r}: {exc}") from None
            setattr(self, var.key, value)
        if self.chunk_size < 64:
            raise CXLMPIConfigError("CXLMPI_CHUNK_SIZE must be at least 64 bytes")

    def windows(self, hosts: bool = False) -> dict[str, tuple[int, int | None] | None]:
        """Per collective, the sizes in bytes (all blocks together) that go
        through the pool: (lo, hi) for lo <= nbytes < hi (hi None: no upper
        bound), or None: never (MPI is faster there).  `hosts`: for a pool
        whose ranks run on several hosts -- CXLMPI_HOSTS_THRESHOLD is the
        floor, and the builtin table (measured against MPI over shared
        memory) does not apply."""
        table = {} if hosts and self.tuning == "builtin" else self.tuning_table()
        floor = self.floor(hosts)
        out: dict[str, tuple[int, int | None] | None] = {}
        for name in COLLECTIVES:
            window = table.get(name, [None, None])
            if window is None:
                out[name] = None
                continue
            low = floor if window[0] is None else max(window[0], floor)
            out[name] = (low, window[1])
        return out

    def floor(self, hosts: bool) -> int:
        """The smallest message through the pool: CXLMPI_HOSTS_THRESHOLD on
        a pool whose ranks run on several hosts, else CXLMPI_THRESHOLD."""
        return self.hosts_threshold if hosts else self.threshold

    @property
    def adaptive(self) -> bool:
        """Whether each communicator picks its paths by measuring them
        (CXLMPI_TUNING=adaptive) rather than by a pinned table."""
        return self.tuning == "adaptive"

    def tuning_table(self) -> dict[str, Any]:
        """The windows CXLMPI_TUNING names, as written ({collective: [lo,
        hi] or None}; a collective not in it: CXLMPI_THRESHOLD and up)."""
        if self.tuning in ("pool", "adaptive"):
            return {}
        if self.tuning == "builtin":
            return dict(BUILTIN_WINDOWS)
        return _read_tuning(self.tuning)

    def agreed(self) -> dict[str, Any]:
        """The value of every setting of AGREED, as ranks compare them:
        CXLMPI_TUNING by the table it names (the same table may lie at
        different paths on different hosts)."""
        out = {name: getattr(self, _KEYS[name]) for name in AGREED}
        if "CXLMPI_TUNING" in out:
            out["CXLMPI_TUNING"] = (self.adaptive, sorted(self.tuning_table().items()))
        return out

    def as_dict(self) -> dict[str, Any]:
        """Every setting by variable name."""
        return {var.name: getattr(self, var.key) for var in VARIABLES}


def _read_tuning(path: str) -> dict[str, Any]:
    import json

    try:   # (O_NONBLOCK: a FIFO must not hang the job; it is then refused)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with open(fd) as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(f"{path} is not a regular file")
            table = json.load(f)
    except (OSError, ValueError, RecursionError) as exc:
        raise CXLMPIConfigError(f"CXLMPI_TUNING={path!r}: {exc}") from None
    if not isinstance(table, dict):
        raise CXLMPIConfigError(f"CXLMPI_TUNING={path!r}: expected a JSON object")
    for name, window in table.items():
        if name not in COLLECTIVES:
            raise CXLMPIConfigError(f"CXLMPI_TUNING={path!r}: unknown collective {name!r}")
        if window is not None and not (
                isinstance(window, list) and len(window) == 2
                and all(v is None or (type(v) is int and 0 <= v < 1 << 63) for v in window)):
            raise CXLMPIConfigError(
                f"CXLMPI_TUNING={path!r}: {name}: expected [lo, hi] (bytes or null) or null")
    return table


# The built-in windows: a tuning file shipped with the package, read like
# any CXLMPI_TUNING file.  Measured with python -m cxlmpi.bench at 2 ranks
# on the first development machine: where MPI's own single-copy (kernel-assisted)
# transfers beat copying through the pool for private buffers, the
# collective stays with MPI.  [lo, hi]: bytes, null = CXLMPI_THRESHOLD / no
# upper bound; null: never through the pool.
BUILTIN_TUNING = os.path.join(os.path.dirname(__file__), "builtin-tuning.json")
BUILTIN_WINDOWS: dict[str, list[int | None] | None] = _read_tuning(BUILTIN_TUNING)

_config: Config | None = None
# Held while the settings are read and handed to the listeners: threads
# whose first calls come at once must all see them applied (a thread that
# found them published before the hot path had its windows passed its
# call to MPI while its peer set a pool up: a hang).
_reading = threading.RLock()


def get() -> Config:
    """The settings in force (read from the environment on first use)."""
    cfg = _config
    if cfg is None:
        with _reading:
            cfg = _config if _config is not None else reload()
    return cfg


def reload() -> Config:
    """Read the settings from the environment again."""
    global _config
    with _reading:
        cfg = Config()
        _apply(cfg)
        _config = cfg      # published once applied
        _warn_unknown()
    return cfg


# Who is told when the settings are read (the compiled hot path registers
# itself: config imports nothing of cxlmpi's that imports config back).
_listeners: list[Callable[[Config], None]] = []


def on_change(listener: Callable[[Config], None]) -> None:
    """Call `listener(cfg)` with the settings in force (at once if they have
    been read) and again whenever they are read anew."""
    _listeners.append(listener)
    if _config is not None:
        listener(_config)


def _apply(cfg: Config) -> None:
    for listener in _listeners:
        listener(cfg)

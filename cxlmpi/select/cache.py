"""The selection cache file (CXLMPI_CACHE): what adaptive selection
(cxlmpi.select) settled, per machine, read when a communicator's pool is
set up and written when it is freed.

The file decides which path a job's calls take and its size classes index
the compiled route table, so it is trusted only as far as it is checked:

- it is read only when it is this user's own regular file, writable by
  nobody else (opened without following a link, without waiting on a FIFO,
  checked on the descriptor that is read), and at most MAX_NBYTES long;
- every value is checked before it is used: known collectives and
  placements, size keys that name a size class of the route table, known
  path names, finite timings within [MIN_SECONDS, MAX_SECONDS];
- anything else is ignored -- the whole file, or the entries that fail --
  with one warning per file and process (a cache never stops a job);
- it is written as a new file of mode 0600 renamed over the old one, in a
  directory made 0700 where cxlmpi makes it.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import os
import platform
import re
import stat
import sys
import tempfile
from typing import Any

from .. import config
from .._version import __version__
from .classes import NCLASSES, PLACEMENTS, class_floor, code_of, size_class
from .learner import Learner

__all__ = ["cache_path", "fingerprint", "load_cache", "read_cache", "save_cache",
           "describe_cache", "describe_entries", "cpu_model", "MAX_NBYTES", "MIN_SECONDS",
           "MAX_SECONDS"]

#: The largest cache file read (a full cache of every class is ~1 MiB).
MAX_NBYTES = 16 << 20
#: The range of a believable cached time per call: no collective call takes
#: less than a nanosecond (a smaller figure would hold its path until a
#: re-check's looks pushed it out), none an hour.
MIN_SECONDS = 1e-9
MAX_SECONDS = 3600.0
_SIZE_KEY = re.compile(r"(0|[1-9][0-9]{0,19})")

_warned: set[str] = set()
# The file validated last, (path, identity), and what `read_cache` made of
# it (read-only): a communicator's set-up reads the cache, and every
# communicator's first blocking collective sets one up.
_last_valid: list[Any] = [None, None]
# The machine entry of `_last_valid` that `load_cache` read last, and what it
# made of it (read-only)
_last_loaded: list[Any] = [None, None]


def cache_path(cfg: config.Config | None = None) -> str | None:
    """Where the cache file is (CXLMPI_CACHE), None when it is off."""
    cfg = config.get() if cfg is None else cfg
    path = cfg.cache
    if path.lower() in ("", "off", "none", "0"):
        return None
    return os.path.expanduser(path)


@functools.lru_cache(maxsize=1)
def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what platform says (read
    once: every communicator's set-up asks)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def fingerprint(nranks: int, mpi_library: str, cfg: config.Config,
                groups: list[int] | None = None) -> dict[str, Any]:
    """What a cache entry is valid for: this machine, the ranks of the pool,
    the MPI library, cxlmpi's version, the pool's backend and coherence;
    across pool groups, the ranks of each group (`groups`)."""
    fp = {"cpu": cpu_model(), "cores": os.cpu_count() or 0, "ranks": nranks,
          "mpi": " ".join(mpi_library.splitlines()[0].split()) if mpi_library else "",
          "cxlmpi": __version__, "pool": cfg.pool, "coherence": cfg.coherence,
          "chunk": cfg.chunk_size}
    if groups is not None:
        fp["groups"] = groups
    return fp


def _key(fp: dict[str, Any]) -> str:
    return json.dumps(fp, sort_keys=True)


# ------------------------------------------------------------------ reading


def _warn(path: str, problem: str) -> None:
    """One warning per cache file and process: the file, or some of its
    entries, were ignored."""
    if path in _warned:
        return
    _warned.add(path)
    sys.stderr.write(f"cxlmpi: warning: the selection cache {path} {problem}; "
                     f"ignored (adaptive selection learns afresh). Remove the file, or "
                     f"set CXLMPI_CACHE to a file of your own (off: none); this warning "
                     f"is not repeated.\n")
    sys.stderr.flush()


def _refusal(st: os.stat_result) -> str | None:
    """Why a cache file of status `st` is not read, None when it is."""
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_uid != os.geteuid():
        return f"belongs to user {st.st_uid}, not to this user ({os.geteuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by other users (mode {stat.S_IMODE(st.st_mode):o}; chmod 600)"
    if st.st_size > MAX_NBYTES:
        return f"is larger than {MAX_NBYTES} bytes"
    return None


def _read_text(path: str, known: tuple[int, ...] = ()) -> tuple[str | None,
                                                                  tuple[int, ...]]:
    """The file's text, None when it is missing or its identity is `known`
    (not read again), and the identity of what was read (device, inode,
    size, times; () for none); OSError (whose message says why) when it is
    there but not to be read."""
    try:
        seen = os.lstat(path)
    except FileNotFoundError:
        return None, ()
    why = "is a symbolic link" if stat.S_ISLNK(seen.st_mode) else _refusal(seen)
    if why:
        raise OSError(why)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        why = _refusal(st)
        if why is None and (st.st_dev, st.st_ino) != (seen.st_dev, seen.st_ino):
            why = "changed while it was opened"
        if why:
            raise OSError(why)
        identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if identity == known:
            return None, identity
        chunks, left = [], MAX_NBYTES + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        if left <= 0:
            raise OSError(f"is larger than {MAX_NBYTES} bytes")
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8"), identity


def _seconds(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    seconds = float(value)
    return seconds if math.isfinite(seconds) and MIN_SECONDS <= seconds <= MAX_SECONDS \
        else None


def _path_name(value: Any) -> bool:
    if not isinstance(value, str) or len(value) > 64:
        return False
    try:
        code_of(value)
    except ValueError:
        return False
    return True


def _entry(entry: Any) -> dict[str, Any] | None:
    """A class's cached decision ({"best", "runner_up", "seconds"}) when
    every value in it is one cxlmpi writes, else None."""
    if not isinstance(entry, dict) or not set(entry) <= {"best", "runner_up", "seconds"} \
            or not _path_name(entry.get("best")):
        return None
    runner = entry.get("runner_up")
    if runner is not None and not _path_name(runner):
        return None
    seconds = entry.get("seconds", {})
    if not isinstance(seconds, dict):
        return None
    checked = {}
    for name, value in seconds.items():
        if not _path_name(name) or _seconds(value) is None:
            return None
        checked[name] = _seconds(value)
    return {"best": entry["best"], "runner_up": runner, "seconds": checked}


def _size_class(size: Any) -> int | None:
    """The size class a size key names (the class's floor in bytes, as
    cxlmpi writes it), None unless it is one of the route table's."""
    if not isinstance(size, str) or not _SIZE_KEY.fullmatch(size):
        return None
    sc = size_class(int(size))
    return sc if sc < NCLASSES and class_floor(sc) == int(size) else None


def _decisions(table: Any) -> tuple[dict[str, Any], int]:
    """The valid part of a machine's "decisions", and how many entries
    (or whole tables) were dropped."""
    if not isinstance(table, dict):
        return {}, 1
    out: dict[str, Any] = {}
    dropped = 0
    for name, sizes in table.items():
        if name not in config.COLLECTIVES or not isinstance(sizes, dict):
            dropped += 1
            continue
        for size, places in sizes.items():
            if _size_class(size) is None or not isinstance(places, dict):
                dropped += 1
                continue
            for pl, entry in places.items():
                checked = _entry(entry) if pl in PLACEMENTS else None
                if checked is None:
                    dropped += 1
                    continue
                out.setdefault(name, {}).setdefault(size, {})[pl] = checked
    return out, dropped


def _machine(entry: Any) -> tuple[dict[str, Any] | None, int]:
    """A machine's entry with only its valid decisions, and how many
    parts were dropped (None: the whole entry)."""
    if not isinstance(entry, dict) or set(entry) != {"machine", "decisions"} or \
            not isinstance(entry["machine"], dict):
        return None, 1
    decisions, dropped = _decisions(entry["decisions"])
    return {"machine": entry["machine"], "decisions": decisions}, dropped


def read_cache(path: str | None, warn: bool = True) -> dict[str, Any]:
    """The valid part of the cache file ({"machines": {key: {"machine": fp,
    "decisions": {collective: {size: {placement: entry}}}}}}); empty when
    it is missing or not to be read.  Whatever was left out draws one
    warning (`warn`) and is counted in "ignored" (a reason, or a count of
    entries)."""
    return copy.deepcopy(_valid(path, warn))


def _valid(path: str | None, warn: bool) -> dict[str, Any]:
    """`read_cache`, shared: not to be changed.  A file read and validated
    before, unchanged since, is not validated again."""
    if path is None:
        return {"machines": {}}
    try:
        last = _last_valid[0]
        text, identity = _read_text(path, last[1] if last and last[0] == path else ())
        if identity and text is None:   # (the file validated last)
            out = _last_valid[1]
        else:
            out = _parse(text)
            _last_valid[:] = [(path, identity), out] if identity else [None, None]
    except (OSError, ValueError) as exc:   # (UnicodeError is a ValueError)
        why = str(exc) if isinstance(exc, OSError) and not exc.errno else \
            f"could not be read ({type(exc).__name__}: {exc})"
        out = {"machines": {}, "ignored": why}
    if warn and "ignored" in out:
        _warn(path, out["ignored"])
    return out


def _parse(text: str | None) -> dict[str, Any]:
    """The valid part of a cache file's text (None: no file)."""
    out: dict[str, Any] = {"machines": {}}
    if text is None:
        return out
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        out["ignored"] = f"could not be read ({type(exc).__name__}: {exc})"
        return out
    machines = data.get("machines") if isinstance(data, dict) else None
    if not isinstance(machines, dict):
        out["ignored"] = "is not a cache of cxlmpi's (no \"machines\" table)"
        return out
    dropped = len(set(data) - {"machines"})
    for key, entry in machines.items():
        machine, lost = _machine(entry)
        dropped += lost
        if machine is not None:
            out["machines"][key] = machine
    if dropped:
        out["ignored"] = f"has {dropped} entr{'y' if dropped == 1 else 'ies'} that " \
            f"cxlmpi does not write (unknown collectives or paths, size classes out " \
            f"of range, timings that are not finite and positive)"
    return out


def load_cache(path: str | None, fp: dict[str, Any]) -> dict[tuple[int, int, int], Any]:
    """The cached decisions of machine `fp`: {(collective index, size
    class, placement): entry}, every one checked (`read_cache`); empty when
    there are none or the file is not to be read (a cache never stops a
    job)."""
    machine = _valid(path, True)["machines"].get(_key(fp))
    if machine is not None and _last_loaded[0] is machine:   # (its file unchanged)
        return dict(_last_loaded[1])
    out: dict[tuple[int, int, int], Any] = {}
    for name, sizes in (machine or {}).get("decisions", {}).items():
        for size, places in sizes.items():
            sc = _size_class(size)
            for pl, entry in places.items():
                out[(config.COLLECTIVES.index(name), sc, PLACEMENTS.index(pl))] = entry
    _last_loaded[:] = [machine, out]
    return dict(out)


def describe_cache(path: str | None) -> list[str]:
    """The cached decisions, a line per machine and class."""
    if path is None:
        return ["adaptive selection cache: off (CXLMPI_CACHE)"]
    data = read_cache(path, warn=False)
    machines = data["machines"]
    lines = [f"adaptive selection cache: {path} "
             f"({len(machines)} machine{'s' if len(machines) != 1 else ''})"]
    if "ignored" in data:
        lines.append(f"  ignored: the file {data['ignored']}")
    return lines + describe_entries(list(machines.values()))


def describe_entries(entries: list[dict[str, Any]]) -> list[str]:
    """Machine entries of `read_cache`: a line per machine, then a line per
    collective and placement with the path chosen from each size class on
    where it changes ("bcast private: mpi from 0 B, pool from 64 KiB")
    (``python -m cxlmpi --info --cache``)."""
    lines = []
    for entry in entries:
        fp = entry["machine"]
        groups = fp.get("groups")
        ranks = f"{fp.get('ranks', '?')} ranks per pool" if not groups else \
            f"{fp.get('ranks', '?')} ranks in pool groups of {groups}"
        lines.append(f"  {fp.get('cpu', '?')}, {fp.get('cores', '?')} cores, {ranks}, "
                     f"{fp.get('mpi', '?')}, "
                     f"cxlmpi {fp.get('cxlmpi', '?')}, pool {fp.get('pool', '?')}:")
        runs: dict[tuple[str, str], list[tuple[int, str]]] = {}
        for name, sizes in sorted(entry["decisions"].items(),
                                  key=lambda kv: config.COLLECTIVES.index(kv[0])):
            for size, places in sorted(sizes.items(), key=lambda kv: int(kv[0])):
                for pl, d in sorted(places.items()):
                    run = runs.setdefault((name, pl), [])
                    if not run or run[-1][1] != d["best"]:
                        run.append((int(size), d["best"]))
        for (name, pl), run in runs.items():
            lines.append(f"    {name:<21} {pl:<7} " + ", ".join(
                f"{best} from {_size_text(size)}" for size, best in run))
    return lines


def _size_text(nbytes: int) -> str:
    """'0 B', '64 KiB', '16 MiB' (a size class's floor: a power of two)."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


# ------------------------------------------------------------------ writing


def _make_private_dirs(directory: str) -> None:
    """Make `directory` and the missing folders above it, each 0700 (not
    the umask's mode: under umask 000 os.makedirs makes them 0777, and
    anyone could swap the cache for a file of theirs -- which `read_cache`
    would refuse, but the user's choices would be lost)."""
    missing = []
    while directory and not os.path.isdir(directory):
        missing.append(directory)
        parent = os.path.dirname(directory)
        if parent == directory:
            break
        directory = parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            continue
        os.chmod(folder, 0o700)   # (mkdir's mode is masked by the umask)


def save_cache(path: str | None, fp: dict[str, Any],
               learned: dict[tuple[int, int, int], Learner]) -> bool:
    """Merge the settled `learned` classes into the valid part of the cache
    file (atomically: a reader sees the old file or the new one, mode
    0600); False when it could not be written (a cache never stops a
    job)."""
    if path is None or not learned:
        return False
    try:
        directory = os.path.dirname(os.path.abspath(path))
        _make_private_dirs(directory)
        data = read_cache(path)
        data.pop("ignored", None)
        entry = data["machines"].setdefault(_key(fp), {"machine": fp, "decisions": {}})
        table = entry["decisions"]
        for (which, sc, pl), learner in sorted(learned.items()):
            if learner.choice() is None:
                continue
            table.setdefault(config.COLLECTIVES[which], {}).setdefault(
                str(class_floor(sc)), {})[PLACEMENTS[pl]] = learner.as_cache()
        # (mkstemp: a new file, O_EXCL, mode 0600)
        fd, tmp = tempfile.mkstemp(prefix=".cxlmpi-cache-", suffix=".json", dir=directory)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=1, sort_keys=True)
                f.write("\n")
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
    except (OSError, ValueError, TypeError):
        return False
    return True

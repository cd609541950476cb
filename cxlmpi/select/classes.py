"""What adaptive selection chooses among: a class (collective x size class
x placement), its candidate paths and their codes, and how many calls a
timed run of a class spans.  Plain functions of the class, the same on
every rank; the codes are those the compiled route table holds
(`cxlmpi.select.interface`)."""

from __future__ import annotations

import functools

from .._pool import MPI_PATH, NCLASSES, NEW, SLOW, VARIANT_FLAGS, size_class

__all__ = ["MPI_PATH", "STREAM", "BIGCHUNK", "RSAG", "FLAT", "PLACEMENTS", "NCLASSES",
           "SLOW", "NEW", "CUT_SHORT", "code_name", "code_of", "size_class", "class_floor",
           "candidates", "run_length", "first_run", "first_skip", "untimed_half"]

# Path codes (pyx/cxl_codes.h): MPI_PATH is stock MPI; 1 + flags is the
# pool with the variant flags; size classes: `size_class`, NCLASSES of them.
STREAM, BIGCHUNK, RSAG, FLAT = (VARIANT_FLAGS[n] for n in ("stream", "bigchunk", "rsag", "flat"))
_FLAG_NAMES = tuple((bit, name) for name, bit in VARIANT_FLAGS.items())

PLACEMENTS = ("private", "pool")

# Routes' codes (pyx/cxl_codes.h) SLOW, "no decision: ask the Selector"
# (cxlmpi._shim.Routes), and NEW, a class no call has met yet: its first
# call opens a timed run on MPI by itself, `first_run` calls long, without a
# header step -- whose cost (20-70 us in place: the step and the selector's
# bookkeeping) is many of a cheap class's calls, and is paid again by the
# next header step, which carries the run's time to every rank.
# What a rank reports for a run that a header step cut short in its untimed
# first half (nanoseconds per call; no call of any path takes 1 ns): the
# largest report wins, so where every rank was cut short all learn it.
CUT_SHORT = 1

STREAM_MIN = 16 << 10    # the smallest class that tries streaming stores
RUN_BYTES = 4 << 20      # a timed run: calls moving about this many bytes ...
MAX_RUN = 16             # ... but at most this many calls
FIRST_RUN_BYTES = 1 << 20   # a class's first run, on MPI: calls moving this much ...
FIRST_RUN_CALLS = 100    # ... but at most this many (see first_run) ...
FIRST_RUN_MIN = 8        # ... and at least this many

# Collectives by family (config.COLLECTIVES names).
_MOVE = ("bcast", "allgather", "allgatherv", "gather", "gatherv", "scatter", "scatterv",
         "alltoall", "alltoallv")
_REDUCE = ("reduce", "allreduce")
_REDUCE_SCATTER = ("reduce_scatter_block", "reduce_scatter")


def code_name(code: int) -> str:
    """'mpi', 'pool', 'pool+stream', 'pool+stream+bigchunk', ..."""
    if code == MPI_PATH:
        return "mpi"
    flags = code - 1
    return "+".join(["pool"] + [name for bit, name in _FLAG_NAMES if flags & bit])


@functools.lru_cache(maxsize=256)
def code_of(name: str) -> int:
    """The inverse of code_name (ValueError for a name it never makes)."""
    if name == "mpi":
        return MPI_PATH
    parts = name.split("+")
    if parts[0] != "pool":
        raise ValueError(f"unknown path {name!r}")
    names = dict((n, bit) for bit, n in _FLAG_NAMES)
    try:
        flags = sum(names[p] for p in set(parts[1:]))
    except KeyError:
        raise ValueError(f"unknown path {name!r}") from None
    return 1 + flags


def class_floor(sc: int) -> int:
    return 1 << sc if sc else 0


def candidates(name: str, nbytes: int, nranks: int, zerocopy: bool, chunk: int,
               streaming: bool = True, variants: bool = True) -> list[int]:
    """`paths` (a new list)."""
    return list(paths(name, nbytes, nranks, zerocopy, chunk, streaming, variants))


@functools.lru_cache(maxsize=1024)
def paths(name: str, nbytes: int, nranks: int, zerocopy: bool, chunk: int,
          streaming: bool = True, variants: bool = True) -> tuple[int, ...]:
    """The paths worth trying for a class, in the order they are tried:
    stock MPI first (the reference every other is judged against), then the
    pool variants (`variants` False: the pool's one path, as across pool
    groups).  Identical on every rank: it depends only on the class and on
    the pool (its ranks, its chunk)."""
    pool = 1
    if name == "barrier" or name in ("scan", "exscan") or zerocopy or not variants:
        return (MPI_PATH, pool)
    out = [MPI_PATH]
    big = nbytes > chunk
    # Streaming stores pay once the message leaves the caches, and from a
    # few pages wherever the readers run on cores that do not share the
    # writer's cache: they snoop every line of a regular copy out of it.
    # On one 2-vCPU VM a 64 KiB Bcast through the pool took 3.6, 11-12 or
    # 38-39 us by where the vCPUs ran (one job to the next), with streaming
    # stores 7-8 us in every job (stock MPI 10-16 us); at 16 KiB 2.1-10.9
    # against 3.5-3.9 us (stock 7-8 us).
    stream = streaming and nbytes >= STREAM_MIN
    large = nbytes >= 4 << 20
    if name in _REDUCE:
        flat, rsag = 1 + FLAT, 1 + RSAG
        out += [flat, rsag] if nranks > 2 else [flat]
        if stream:
            out += [c + STREAM for c in list(out[1:])]
        if nranks <= 2:
            out.append(rsag)
        return tuple(out)
    if name in _MOVE or name in _REDUCE_SCATTER:
        variants = [pool]
        if stream:
            variants.append(1 + STREAM)
        if big and name in _MOVE:
            variants.append(1 + BIGCHUNK)
        if stream and big:
            variants.append(1 + STREAM + BIGCHUNK)
        # the likeliest first: large messages stream
        return tuple(out + (variants[::-1] if large else variants))
    return (MPI_PATH, pool)



def run_length(sc: int) -> int:
    """Calls of a timed run of size class `sc`: RUN_BYTES' worth (see
    Selector._run)."""
    return max(1, min(MAX_RUN, RUN_BYTES // max(class_floor(sc), 1)))


def first_run(sc: int) -> int:
    """Calls of the run that a class of size class `sc` opens on MPI by
    itself, 0 where its first call asks in a header step (large classes:
    the pool first, see Learner.next_try).  FIRST_RUN_BYTES' worth of
    calls, at least FIRST_RUN_MIN, at most FIRST_RUN_CALLS: the header step
    that reports the run costs 30-150 us in place, 15-70 calls of 4 KiB (2
    ranks, AMD EPYC VM), so a cheap class's first 100 calls take stock
    MPI's path and time alone, and exploring begins after them, paid as it
    goes.  Only its second half is timed (`first_skip`)."""
    if run_length(sc) <= 1:
        return 0
    return max(FIRST_RUN_MIN, min(FIRST_RUN_CALLS, FIRST_RUN_BYTES // max(class_floor(sc), 1)))


@functools.lru_cache(maxsize=1)
def first_runs() -> tuple[tuple[int, ...], tuple[int, ...]]:
    """`first_run` and `first_skip` of every size class (what each new
    communicator's route table starts from)."""
    return (tuple(first_run(sc) for sc in range(NCLASSES)),
            tuple(first_skip(sc) for sc in range(NCLASSES)))


def first_skip(sc: int) -> int:
    """Calls after the first run's opening one that only restart its timing
    (cxlmpi._shim.Routes.run_skip): the first half.  MPI warms up over a
    class's first calls, not in its first alone: ranks leave the cold
    opening call apart (the next call's time on the early rank holds the
    gap), and MPI's own buffers for that size are touched over the next
    few (a 64 KiB Alltoall's calls on 4 ranks, 16 cores: 341, 80, 51, 80,
    252, 150, 69, 53, 52, 39, then 34-40 us).  Timed from its third call,
    a 4-call first run made MPI's first look 68 us, the pool (45 us) led,
    and the class ran the pool for hundreds of calls."""
    calls = first_run(sc)
    return untimed_half(calls) if calls else 0


def untimed_half(calls: int) -> int:
    """Of a run of `calls` that opens with a class's cold first call, the
    calls after the opening one that only restart its timing: the first
    half (at least one; 8 calls: 3 untimed after the opening one, 4
    timed)."""
    return max(1, (calls - 2) // 2)

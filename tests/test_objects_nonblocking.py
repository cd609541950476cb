"""Nonblocking object collectives: comm.ibcast, igather, iscatter,
iallgather, ialltoall, ireduce, iallreduce, ibarrier (an extension of
mpi4py's API).

Each test runs tests/scripts/objects_nonblocking.py as a whole MPI job:
every result is compared with the blocking object collective of stock
mpi4py on the same data, and the job checks that cxlmpi.stats() counted
every call it made.
"""

from __future__ import annotations

import json

import pytest
from harness import SMALL_POOL_ENV, run_mpi

SCRIPT = "tests/scripts/objects_nonblocking.py"
# The blocking object collectives between posts go through the pool (small
# thresholds): the nonblocking calls interleave with pool collectives.
POOL = {**SMALL_POOL_ENV, "CXLMPI_CACHE": "off"}


def result(env: dict[str, str], nranks: int, scenario: str, timeout: float = 300) -> dict:
    proc = run_mpi(nranks, [SCRIPT, scenario], env=env, timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, proc.stdout + proc.stderr
    return json.loads(lines[0][len("RESULT "):])


@pytest.mark.parametrize("nranks", [1, 2, 3, 4])
def test_every_form_equals_stock(nranks: int) -> None:
    """Every form, many in flight on one communicator, completed in a
    shuffled order by the request's wait and test and by MPI.Request.waitall
    / waitany / testall in lists with stock isend/irecv requests; blocking
    object and buffer collectives on the same communicator between posts;
    dicts and lists holding numpy arrays, strings, 8 MiB arrays; sums of
    arrays, strings, a list concatenation (rank order) and MPI.MAX: every
    result is stock's."""
    out = result(POOL, nranks, "each")
    assert out["ok"], out["problems"]
    if nranks > 1:   # (on one rank a call completes when posted)
        assert out["thread"], out
        assert out["blocking_pooled"] > 0, out   # (interleaved with pool calls)


def test_each_rank_completes_in_its_own_order() -> None:
    """The same calls completed in a different order on every rank."""
    out = result(POOL, 3, "crossed")
    assert out["ok"], out["problems"]


def test_many_rounds_in_flight() -> None:
    """200 rounds of every form on one communicator, four calls in flight:
    the private communicator's tags go on matching the calls in order."""
    out = result(POOL, 2, "rounds")
    assert out["ok"], out["problems"]


def test_posting_is_local() -> None:
    """On a new communicator rank 0 posts, then sends rank 1 the message
    it waits for before posting the same call: a post that waited for its
    peers (a blocking MPI_Comm_dup of the private communicator) would hang."""
    out = result(POOL, 3, "local", timeout=120)
    assert out["ok"], out["problems"]


def test_stock_waitall_alone_completes_them() -> None:
    """8 MiB objects of every form completed by MPI.Request.waitall alone,
    never by the requests' own methods: the progress thread receives the
    large frames and completes the requests, and waitall returns the
    objects."""
    out = result(POOL, 3, "stock")
    assert out["ok"], out["problems"]
    assert out["thread"], out


def test_the_communicator_freed_with_calls_in_flight() -> None:
    """Calls posted, the communicator freed, then waited: each completes,
    the private duplicate is freed after the last; a new communicator works
    after it."""
    out = result(POOL, 3, "free")
    assert out["ok"], out["problems"]


@pytest.mark.parametrize("level, thread", [("multiple", True), ("serialized", False)])
def test_the_requests_own_methods_at_any_thread_level(level: str, thread: bool) -> None:
    """The requests' own wait and test, and ObjectRequest.waitall over a
    list mixed with stock requests, complete them with or without the
    progress thread (below MPI_THREAD_MULTIPLE there is none)."""
    out = result({**POOL, "MPI4PY_RC_THREAD_LEVEL": level}, 3, "own")
    assert out["ok"], out["problems"]
    assert out["thread"] is thread, out


def test_with_cxlmpi_disabled() -> None:
    """CXLMPI_DISABLE=1: the methods still work (they use MPI anyway),
    every blocking call passes through."""
    out = result({**POOL, "CXLMPI_DISABLE": "1"}, 3, "each")
    assert out["ok"], out["problems"]
    assert out["blocking_pooled"] == 0, out


@pytest.mark.parametrize("nranks, coherence", [(2, "auto"), (3, "auto"), (3, "emulate")])
def test_large_frames_go_through_the_node_heap(nranks: int, coherence: str) -> None:
    """Under CXLMPI_OBJECTS=1, on a communicator with a pool, every form
    with 256 KiB to 1.5 MiB objects (arrays in a dict, in a list, a
    bytearray, a long string) moves its frames through the node heap:
    stock's results, every call counted as a pool call on every rank; with
    the arena full, MPI carries them (pass-through calls).  `emulate`:
    memory without coherent caches, the frames written back and dropped."""
    env = {**POOL, "CXLMPI_ARENA_SIZE": "16M", "CXLMPI_COHERENCE": coherence}
    out = result(env, nranks, "heap")
    assert out["ok"], out["problems"]


@pytest.mark.parametrize("nranks, objects", [(2, "1"), (3, "1"), (2, "0")])
def test_a_result_is_not_the_frame_peers_read(nranks: int, objects: str) -> None:
    """A root's ibcast and every rank's iallgather and iallreduce: the
    root waits, changes its results in place, and only then do its peers
    take their frames (no progress thread: in their wait); they get what
    was sent, as under stock mpi4py, whose root gets its own copy -- the
    frames in the node heap, or (CXLMPI_OBJECTS=0) sent by MPI."""
    env = {**POOL, "CXLMPI_ARENA_SIZE": "16M", "MPI4PY_RC_THREAD_LEVEL": "serialized",
           "CXLMPI_OBJECTS": objects}
    out = result(env, nranks, "alias", timeout=120)
    assert out["ok"], out["problems"]


@pytest.mark.parametrize("level", ["multiple", "serialized"])
def test_a_heap_set_up_after_the_post(level: str) -> None:
    """COMM_WORLD's pool is set up by a blocking Allreduce that the
    receivers of an ibcast enter after posting it and the sender before:
    the header names a heap a receiver may not map yet when it comes (its
    progress thread tries again later; its wait comes after the set-up)."""
    env = {**POOL, "CXLMPI_ARENA_SIZE": "16M", "MPI4PY_RC_THREAD_LEVEL": level}
    out = result(env, 3, "late", timeout=120)
    assert out["ok"], out["problems"]


@pytest.mark.parametrize("level", ["multiple", "serialized"])
def test_heap_frames_waited_after_their_communicator_is_freed(level: str) -> None:
    """An ibcast and an iallgather whose frames lie in the node heap, their
    communicator freed before they are waited (MPI allows it): each
    completes with stock's result (the heap is found among those the rank
    mapped when it posted)."""
    env = {**POOL, "CXLMPI_ARENA_SIZE": "16M", "MPI4PY_RC_THREAD_LEVEL": level}
    out = result(env, 2, "freed", timeout=120)
    assert out["ok"], out["problems"]


def test_errors_raise_at_the_post() -> None:
    """An invalid root (MPI.Exception), a scatter or alltoall of the wrong
    number of objects (ValueError, stock's message), an unpicklable object
    (the pickler's TypeError): raised when posted, and the communicator
    goes on."""
    out = result(POOL, 2, "errors")
    assert out["ok"], out["problems"]

"""The arena allocator behind pool-resident arrays, on a one-rank pool in
this process (the collectives on pool arrays run in tests/mpi/test_resident.py)."""

from __future__ import annotations

import gc
import os
import random
import threading

import numpy as np
import pytest
from cxlmpi._pool import Pool

ARENA = 1 << 20


@pytest.fixture
def pool():
    p = Pool.create(0, 1, 64 * 1024, arena_nbytes=ARENA)
    p.unlink()
    yield p
    p.close()


def test_first_fit_alignment_and_coalescing(pool) -> None:
    bufs = [pool.allocate(n) for n in (1, 100, 70000, 64, 4096)]
    assert [b.nbytes for b in bufs] == [1, 100, 70000, 64, 4096]
    assert all(b.offset % 64 == 0 for b in bufs) and bufs[2].offset % 4096 == 0
    spans = sorted((b.offset, b.offset + b.nbytes) for b in bufs)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    first = bufs[0].offset
    del bufs
    assert pool.arena_free() == ARENA          # all back, merged into one block
    assert pool.allocate(ARENA).offset == first


def test_full_arena_names_the_setting(pool) -> None:
    keep = pool.allocate(ARENA // 2)
    with pytest.raises(MemoryError, match="CXLMPI_ARENA_SIZE"):
        pool.allocate(ARENA // 2 + 4096)
    del keep
    pool.allocate(ARENA)


def test_random_allocations_never_overlap(pool) -> None:
    rng = random.Random(5)
    live: list = []
    for _ in range(2000):
        if live and rng.random() < 0.45:
            live.pop(rng.randrange(len(live)))
            continue
        try:
            live.append(pool.allocate(rng.choice([8, 100, 3000, 65536, 200000])))
        except MemoryError:
            live.pop(0)
    spans = sorted((b.offset, b.offset + b.nbytes) for b in live)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    live.clear()
    assert pool.arena_free() == ARENA


def test_threads_allocate_at_once(pool) -> None:
    errors: list = []

    def work(seed: int) -> None:
        rng = random.Random(seed)
        mine = []
        for _ in range(500):
            try:
                b = pool.allocate(rng.choice([64, 1000, 8192]))
                np.frombuffer(b, np.uint8)[:] = seed
                mine.append(b)
                if len(mine) > 8:
                    old = mine.pop(0)
                    if not np.all(np.frombuffer(old, np.uint8) == seed):
                        errors.append("overwritten")
            except MemoryError:
                mine.clear()
    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and pool.arena_free() == ARENA


def test_arrays_keep_the_pool_mapped(pool) -> None:
    a = np.frombuffer(pool.allocate(800), np.float64)
    a[:] = 3
    pool.close()                     # the communicator is gone ...
    assert pool.closed
    a += 1                           # ... its arrays stay valid
    assert float(a.sum()) == 400.0
    with pytest.raises(ValueError, match="closed"):
        pool.allocate(8)


def test_views_are_read_only(pool) -> None:
    owner = pool.allocate(64)
    view = pool.view(owner.offset, 64)
    arr = np.frombuffer(view, np.uint8)
    assert not arr.flags.writeable
    with pytest.raises(ValueError):
        arr[0] = 1
    with pytest.raises(ValueError):
        arr.setflags(write=True)
    with pytest.raises(TypeError):
        memoryview(view)[0:1] = b"x"
    with pytest.raises(ValueError, match="outside"):
        pool.view(0, 64)              # the header, not an arena


def test_residency_is_by_address(pool) -> None:
    b = pool.allocate(1000)
    assert pool.offset_of(b.address, 1000) == b.offset
    assert pool.offset_of(b.address + 10, 990) == b.offset + 10
    private = np.zeros(10)
    assert pool.offset_of(private.__array_interface__["data"][0], 80) == -1
    assert pool.offset_of(b.address, ARENA * 4) == -1


def _no_overlap(bufs: list) -> bool:
    spans = sorted((b.offset, b.offset + b.nbytes) for b in bufs)
    return all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))


class _Cycle:
    """Garbage that only the cycle collector frees."""

    def __init__(self, buf) -> None:
        self.buf = buf
        self.me = self


def test_collection_inside_allocate_never_overlaps(pool) -> None:
    """A pool array held only by a garbage cycle, freed by a collection that
    runs inside `allocate`: later arrays never overlap live ones, and every
    byte comes back.  (The collector runs at the first fresh container
    allocation once its count is past the threshold: collections are held
    off while the count grows, and CPython's list and tuple freelists are
    drained so that `allocate`'s own containers are fresh.)"""
    block = 64 * 1024
    inside = []
    allocating = [False]

    def seen(phase: str, info: dict) -> None:
        if phase == "start" and allocating[0]:
            inside.append(info["generation"])

    gc.collect()
    gc.callbacks.append(seen)
    try:
        for _ in range(5):
            gc.disable()
            first = pool.allocate(block)
            _Cycle(np.frombuffer(pool.allocate(block), np.uint8))  # garbage, in between
            third = pool.allocate(block)
            drain = ([(i, -i) for i in range(5000)], [[i] for i in range(500)])
            allocating[0] = True
            gc.enable()
            try:
                fourth = pool.allocate(block)
            finally:
                allocating[0] = False
            del drain
            gc.collect()
            live = [first, third, fourth]
            try:
                while True:
                    live.append(pool.allocate(block))
            except MemoryError:
                pass
            assert _no_overlap(live)
            assert pool.arena_free() < block
            del first, third, fourth, live
            gc.collect()
            assert pool.arena_free() == ARENA
    finally:
        gc.enable()
        gc.callbacks.remove(seen)
    if not inside:
        pytest.skip("this Python never collected inside allocate")


def test_threads_and_collections_never_overlap(pool) -> None:
    """Threads allocating while collections free cycle-held arrays at any
    point: live arrays never overlap and keep their contents."""
    errors: list = []
    thresholds = gc.get_threshold()
    gc.set_threshold(5)

    def work(seed: int) -> None:
        rng = random.Random(seed)
        mine = []
        for _ in range(300):
            try:
                b = pool.allocate(rng.choice([64, 1000, 8192]))
            except MemoryError:
                mine.clear()
                continue
            np.frombuffer(b, np.uint8)[:] = seed
            if rng.random() < 0.5:
                _Cycle(b)
            else:
                mine.append(b)
            if len(mine) > 6:
                old = mine.pop(0)
                if not np.all(np.frombuffer(old, np.uint8) == seed):
                    errors.append("overwritten")
    try:
        threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        gc.set_threshold(*thresholds)
    gc.collect()
    assert errors == [] and pool.arena_free() == ARENA


def _in_child(body) -> None:
    """Run `body()` in a forked child; fail with its exception, if any."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            body()
            msg = b"ok"
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            msg = repr(exc).encode()
        os.write(write, msg)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        msg = f.read()
    os.waitpid(pid, 0)
    assert msg == b"ok", msg.decode()


def test_forked_child_leaves_the_parent_pool_alone(pool) -> None:
    """A forked child cannot allocate from its parent's arena (it would get
    the parent's next array), and its frees and close are no-ops there."""
    inherited = pool.allocate(4096)
    np.frombuffer(inherited, np.uint8)[:] = 5
    go_read, go_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(go_write)
            os.read(go_read, 1)                  # the parent has allocated
            try:
                child = pool.allocate(4096)
            except ValueError:
                child = None
            else:
                np.frombuffer(child, np.uint8)[:] = 7
            del child
            pool.close()
            code = 0
        finally:
            os._exit(code)
    os.close(go_read)
    parent = pool.allocate(4096)
    np.frombuffer(parent, np.uint8)[:] = 1
    free = pool.arena_free()
    os.write(go_write, b"x")
    os.close(go_write)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert np.all(np.frombuffer(parent, np.uint8) == 1)
    assert np.all(np.frombuffer(inherited, np.uint8) == 5)
    assert pool.arena_free() == free and not pool.closed
    more = pool.allocate(4096)
    assert _no_overlap([inherited, parent, more])


def test_forked_child_frees_inherited_arrays_as_no_ops(pool) -> None:
    inherited = pool.allocate(8192)
    keep = pool.allocate(8192)
    free = pool.arena_free()

    def body() -> None:
        nonlocal inherited
        inherited = None                         # a no-op for the parent's arena
        with pytest.raises(ValueError, match="fork"):
            pool.allocate(64)
        pool.close()
    _in_child(body)
    assert pool.arena_free() == free
    del inherited
    assert pool.arena_free() == free + 8192
    assert _no_overlap([keep, pool.allocate(8192)])

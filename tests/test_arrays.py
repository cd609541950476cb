"""The arena allocator behind pool-resident arrays, on a one-rank pool in
this process (the collectives on pool arrays run in tests/mpi/test_resident.py)."""

from __future__ import annotations

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

"""Nonblocking object collectives (comm.ibcast & co.) against stock mpi4py.

    mpiexec -n N python tests/scripts/objects_nonblocking.py SCENARIO

Every result is compared with what the blocking object collective of a
plain duplicate of COMM_WORLD (stock mpi4py) returns for the same data;
rank 0 prints one line ``RESULT {json}`` with ``ok``, the problems found,
and what cxlmpi.stats() counted.  Scenarios:

  each      every form (ibarrier too), several in flight, completed in an order shuffled
            alike on every rank (a shared seed) by every way there is (the
            request's wait and test, MPI.Request.waitall / waitany /
            testall with stock requests in the same list), blocking object
            and buffer collectives on the same communicator between posts;
            small objects, numpy arrays inside dicts and lists, strings, and
            8 MiB arrays
  crossed   the same calls completed in a different order on every rank
  rounds    200 rounds of every form on one communicator, a few in flight
  free      the communicator freed with calls in flight, then a new one
  own       only the requests' own wait/test and ObjectRequest.waitall
            (what works below MPI_THREAD_MULTIPLE, where there is no
            progress thread)
  local     posting is local: on a new communicator (whose private
            duplicate is not made yet) rank 0 posts, then sends rank 1 the
            message it waits for before it posts the same call
  stock     8 MiB objects completed by stock MPI.Request.waitall alone:
            the progress thread receives the large frames
  heap      every form with 256 KiB arrays inside its objects, on a
            communicator whose pool is set up (CXLMPI_OBJECTS=1): each
            frame travels through the node heap, and every call must be
            counted as a pool call (its sizes differing per rank and call);
            then the same with the heap full, where MPI carries them, and
            with rank 0's arena alone full (both paths in one call)
  alias     (below MPI_THREAD_MULTIPLE: a peer takes a frame only in its
            wait) a root's ibcast and every rank's iallgather and iallreduce
            waited, their results changed in place, and only then waited by
            the peers: the peers get what was sent
  late      COMM_WORLD's pool set up by a blocking Allreduce that one rank
            enters after posting, the sender before: the header names a
            heap the receiver does not map yet when it comes
  freed     frames in the node heap (COMM_WORLD's pool holds it) still to be
            taken when their communicator is freed, as MPI allows
  errors    an invalid root, a scatter with the wrong number of objects,
            an unpicklable object: each raises stock's error at the post,
            on the ranks that made it, and the communicator goes on
"""

from __future__ import annotations

import json
import random
import sys

import numpy as np
from mpi4py import MPI

import cxlmpi
from cxlmpi.communicator import objects_progress
from cxlmpi.communicator.objects_nb import ObjectRequest

SCENARIO = sys.argv[1]
SEED = 20240540
BIG_NBYTES = 8 << 20
world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
comm = cxlmpi.wrap(world.Dup())
plain = world.Dup()   # stock mpi4py: the reference
problems: list[str] = []
calls: dict[str, int] = {}


def same(got, want) -> bool:
    """Deep equality: dicts, lists, tuples, numpy arrays (dtype, shape, values)."""
    if isinstance(want, np.ndarray):
        return (isinstance(got, np.ndarray) and got.dtype == want.dtype
                and got.shape == want.shape and np.array_equal(got, want))
    if isinstance(want, dict):
        return (isinstance(got, dict) and got.keys() == want.keys()
                and all(same(got[k], want[k]) for k in want))
    if isinstance(want, (list, tuple)):
        return (type(got) is type(want) and len(got) == len(want)
                and all(same(g, w) for g, w in zip(got, want)))
    return type(got) is type(want) and got == want


def check(what: str, got, want) -> None:
    if not same(got, want):
        problems.append(f"{what}: rank {rank} got {str(got)[:120]}, stock "
                        f"{str(want)[:120]}")


def item(k: int, r: int, big: bool = False):
    """A different object for every call `k` and rank `r`."""
    base = np.arange(16, dtype=np.int64) * (k + 1) + r
    obj = {"k": k, "rank": r, "name": f"call {k} from rank {r}", "array": base,
           "nested": [base.astype(np.float64) / 2, ("t", r), {"s": "x" * (r + 1)}]}
    if big:
        obj["big"] = np.full(BIG_NBYTES // 8, float(k + r))
    return obj


def summable(k: int, r: int, big: bool = False):
    """What MPI.SUM adds up exactly (whole numbers in float arrays)."""
    n = BIG_NBYTES // 8 if big else 33
    return np.arange(n, dtype=np.float64) % 1000 + 10 * r + k


# The forms: name -> (post on comm, the same blocking call on plain).  Each
# takes the call's number k (the data differs from call to call).
def forms(k: int, big: bool = False) -> dict:
    root = k % size
    return {
        "ibcast": (lambda c: c.ibcast(item(k, rank, big) if rank == root else None, root),
                   lambda: plain.bcast(item(k, rank, big) if rank == root else None, root)),
        "igather": (lambda c: c.igather(item(k, rank, big), root),
                    lambda: plain.gather(item(k, rank, big), root)),
        "iscatter": (lambda c: c.iscatter([item(k, q, big) for q in range(size)]
                                          if rank == root else None, root),
                     lambda: plain.scatter([item(k, q, big) for q in range(size)]
                                           if rank == root else None, root)),
        "iallgather": (lambda c: c.iallgather(f"rank {rank} call {k}" if k % 2 else
                                              item(k, rank, big)),
                       lambda: plain.allgather(f"rank {rank} call {k}" if k % 2 else
                                               item(k, rank, big))),
        "ialltoall": (lambda c: c.ialltoall([item(k, q, big and q == 0) for q in range(size)]),
                      lambda: plain.alltoall([item(k, q, big and q == 0)
                                              for q in range(size)])),
        "ireduce": (lambda c: c.ireduce(summable(k, rank, big), MPI.SUM, root),
                    lambda: plain.reduce(summable(k, rank, big), MPI.SUM, root)),
        "iallreduce": (lambda c: c.iallreduce(summable(k, rank, big)),
                       lambda: plain.allreduce(summable(k, rank, big))),
        # ops on Python objects other than arrays: rank order matters for a
        # list concatenation (associative, not commutative)
        "iallreduce-list": (lambda c: c.iallreduce([rank, k], lambda a, b: a + b),
                            lambda: plain.allreduce([rank, k], lambda a, b: a + b)),
        "ireduce-max": (lambda c: c.ireduce((rank * 7 + k) % 5, MPI.MAX, root),
                        lambda: plain.reduce((rank * 7 + k) % 5, MPI.MAX, root)),
        "iallreduce-str": (lambda c: c.iallreduce(f"<{rank}:{k}>", MPI.SUM),
                           lambda: plain.allreduce(f"<{rank}:{k}>", MPI.SUM)),
        # (the communicator's Ibarrier: counted as "ibarrier", not here)
        "ibarrier": (lambda c: c.ibarrier(), lambda: plain.barrier()),
    }


def count(name: str) -> None:
    """One more call of the object collective `name` (for the stats check)."""
    method = name.split("-")[0]
    if method != "ibarrier":
        calls[method] = calls.get(method, 0) + 1


def post_all(k0: int, big: tuple[str, ...] = ()) -> list[tuple[str, object, object]]:
    """Post every form once (those named in `big` with 8 MiB arrays), a
    blocking object or buffer collective on the same communicator between
    posts; (what, request, stock's result)."""
    posted = []
    large = forms(k0, True)
    for i, (name, (nb, stock)) in enumerate(forms(k0).items()):
        if name in big:
            nb, stock = large[name]
        req = nb(comm)
        count(name)
        posted.append((f"{name} k={k0}", req, stock()))
        between = i % 3
        if between == 0:
            check(f"blocking bcast after {name}", comm.bcast(item(i, rank), i % size),
                  plain.bcast(item(i, rank), i % size))
        elif between == 1:
            check(f"blocking allreduce after {name}", comm.allreduce(summable(i, rank)),
                  plain.allreduce(summable(i, rank)))
        else:
            out, ref = np.zeros(64), np.zeros(64)
            comm.Allreduce(np.arange(64.0) + rank, out)
            plain.Allreduce(np.arange(64.0) + rank, ref)
            check(f"blocking Allreduce after {name}", out, ref)
    return posted


def finish(posted: list, order_seed: int) -> None:
    """Complete the requests in a shuffled order (`order_seed`), a few at a
    time, each group by one of the ways there are: the request's wait, a
    test loop, MPI.Request.waitall / waitany / testall with a stock
    point-to-point exchange in the same list (groups of the same sizes,
    completed the same ways, on every rank)."""
    todo = list(posted)
    random.Random(order_seed).shuffle(todo)
    rng = random.Random(SEED)   # (groups and ways alike on every rank: the stock
    while todo:                 # exchanges match)
        group = todo[:rng.randint(1, 4)]
        todo = todo[len(group):]
        how = rng.choice(["wait", "test", "waitall", "waitany", "testall"])
        reqs = [req for _, req, _ in group]
        if how == "wait":
            got = [req.wait() for req in reqs]
        elif how == "test":
            got = []
            for req in reqs:
                flag, obj = req.test()
                while not flag:
                    flag, obj = req.test()
                got.append(obj)
        else:
            # a stock exchange in the same list: a ring of isend/irecv
            mine = {"from": rank, "how": how}
            stock = [plain.isend(mine, (rank + 1) % size, 7),
                     plain.irecv(source=(rank - 1) % size, tag=7)]
            every = reqs + stock
            if how == "waitall":
                results = MPI.Request.waitall(every)
            elif how == "testall":
                flag, results = MPI.Request.testall(every)
                while not flag:
                    flag, results = MPI.Request.testall(every)
            else:
                results = [None] * len(every)
                pending = list(range(len(every)))
                while pending:
                    index, obj = MPI.Request.waitany([every[i] for i in pending])
                    results[pending.pop(index)] = obj
            got = results[:len(reqs)]
            check(f"stock irecv beside {how}", results[-1],
                  {"from": (rank - 1) % size, "how": how})
        for (what, _, want), obj in zip(group, got):
            check(f"{what} by {how}", obj, want)


def each() -> None:
    posted = (post_all(0) + post_all(1, big=("ibcast", "iscatter", "ialltoall", "iallreduce"))
              + post_all(2, big=("igather", "iallgather", "ireduce")))
    finish(posted, SEED)


def crossed() -> None:
    posted = post_all(3) + post_all(4)
    finish(posted, SEED + 1000 * rank)   # (every rank completes in its own order)


def rounds() -> None:
    for k in range(200):
        posted = []
        for name, (nb, stock) in forms(k).items():
            posted.append((f"{name} round {k}", nb(comm), stock()))
            count(name)
            if len(posted) > 3:
                what, req, want = posted.pop(0)
                check(what, req.wait(), want)
        for what, req, want in posted:
            check(what, req.wait(), want)


def free() -> None:
    sub = cxlmpi.wrap(world.Dup())
    k = 5
    reqs = [(sub.iallgather(item(k, rank)), plain.allgather(item(k, rank))),
            (sub.ibcast(item(k, rank, True) if rank == 0 else None, 0),
             plain.bcast(item(k, rank, True) if rank == 0 else None, 0)),
            (sub.iallreduce(summable(k, rank)), plain.allreduce(summable(k, rank)))]
    calls.update(iallgather=1, ibcast=1, iallreduce=1)
    channel = sub.Get_attr(objects_progress._CHANNEL)   # (its private duplicate)
    sub.Free()
    for i, (req, want) in enumerate(reqs):
        check(f"after Free, call {i}", req.wait(), want)
    if size > 1 and channel.comm != MPI.COMM_NULL:
        problems.append(f"rank {rank}: the freed communicator's duplicate was not freed")
    again = cxlmpi.wrap(world.Dup())
    check("a new communicator", again.iallgather(rank).wait(), list(range(size)))
    calls["iallgather"] += 1
    again.Free()


def own() -> None:
    posted = post_all(6) + post_all(7, big=("ibcast", "igather", "iallreduce"))
    rng = random.Random(SEED)
    rng.shuffle(posted)
    half = len(posted) // 2
    for what, req, want in posted[:half]:
        if rng.random() < 0.5:
            check(f"{what} by wait", req.wait(), want)
        else:
            flag, obj = req.test()
            while not flag:
                flag, obj = req.test()
            check(f"{what} by test", obj, want)
    rest = posted[half:]
    mine = {"from": rank}
    stock = [plain.isend(mine, (rank + 1) % size, 8),
             plain.irecv(source=(rank - 1) % size, tag=8)]
    results = ObjectRequest.waitall([req for _, req, _ in rest] + stock)
    for (what, _, want), obj in zip(rest, results):
        check(f"{what} by ObjectRequest.waitall", obj, want)
    check("stock irecv beside ObjectRequest.waitall", results[-1], {"from": (rank - 1) % size})


def local() -> None:
    fresh = cxlmpi.wrap(world.Dup())
    k = 8
    posted = []
    for name in ("iallgather", "ibcast", "iallreduce"):
        nb, stock = forms(k)[name]
        if rank == 1:   # (rank 1 posts only once rank 0 has posted and sent)
            check("the message", plain.recv(source=0, tag=9), f"{name} posted")
        posted.append((f"{name} posted first", nb(fresh), None))
        calls[name] = calls.get(name, 0) + 1
        if rank == 0 and size > 1:
            plain.ssend(f"{name} posted", 1, tag=9)
    posted = [(what, req, stock()) for (what, req, _), (_, stock) in
              zip(posted, (forms(k)[name] for name in ("iallgather", "ibcast", "iallreduce")))]
    for what, req, want in posted:
        check(what, req.wait(), want)
    fresh.Free()


def stock_only() -> None:
    big = ("ibcast", "igather", "iscatter", "iallgather", "ialltoall", "ireduce",
           "iallreduce")
    posted = post_all(9, big=big)
    results = MPI.Request.waitall([req for _, req, _ in posted])
    for (what, _, want), obj in zip(posted, results):
        check(f"{what} by stock waitall alone", obj, want)


def check_pooled() -> None:
    """Every call made so far counted as a pool call (none with
    CXLMPI_OBJECTS=0: MPI carries every frame)."""
    want = {name: n if cxlmpi.config.get().objects else 0 for name, n in calls.items()}
    pool_calls = {name: cxlmpi.stats()[f"{name}(obj)"]["pool_calls"] for name in calls}
    if size > 1 and pool_calls != want:
        problems.append(f"rank {rank}: pool calls {pool_calls}, expected {want}")


def heap() -> None:
    """Frames of 256 KiB and more, in a few shapes: an array inside a dict,
    two arrays in a list, a bytearray (out-of-band buffers), and one that
    pickles in band (a long string)."""
    comm.Barrier()
    comm.Allreduce(np.zeros(1 << 16), np.zeros(1 << 16))   # (the pool is set up)
    for k in range(6):
        n = (32 << 10) * (k + 1) + 8 * rank            # (the sizes differ per rank)
        shapes = [{"a": np.arange(n, dtype=np.float64) * (k + 1)},
                  [np.full(n // 2, rank, np.int32), np.arange(n // 2, dtype=np.float64)],
                  bytearray(np.arange(8 * n, dtype=np.uint8).tobytes()),
                  "x" * (8 * n) + str(rank)]
        obj = shapes[k % len(shapes)]
        root = k % size
        m = (32 << 10) * (k + 1)                       # (reductions: one size)
        big = [np.arange(m, dtype=np.float64) + 100 * q + k for q in range(size)]
        posted = [
            ("ibcast", comm.ibcast(obj if rank == root else None, root),
             plain.bcast(obj if rank == root else None, root)),
            ("igather", comm.igather(obj, root), plain.gather(obj, root)),
            ("iscatter", comm.iscatter(big if rank == root else None, root),
             plain.scatter(big if rank == root else None, root)),
            ("iallgather", comm.iallgather(obj), plain.allgather(obj)),
            ("ialltoall", comm.ialltoall(big), plain.alltoall(big)),
            ("ireduce", comm.ireduce(big[rank], MPI.SUM, root),
             plain.reduce(big[rank], MPI.SUM, root)),
            ("iallreduce", comm.iallreduce(big[rank]), plain.allreduce(big[rank])),
        ]
        for name, req, want in posted:
            count(name)
            check(f"{name} k={k} through the heap", req.wait(), want)
    check_pooled()
    calls.clear()
    # The heap full (one array takes this rank's arena): MPI carries the
    # frames.  First every frame sent is answered, its block given back.
    plain.barrier()
    while objects_progress._SENDS:
        objects_progress._reap_sends(True)
    from cxlmpi.resident.arrays import arena_pool
    hog = cxlmpi.empty((arena_pool(comm).arena_free() - (64 << 10)) // 8, comm=comm)
    obj = np.arange(1 << 16, dtype=np.float64) + rank
    for name, req, want in [("iallgather", comm.iallgather(obj), plain.allgather(obj)),
                            ("ibcast", comm.ibcast(obj, 0), plain.bcast(obj, 0))]:
        calls[name] = calls.get(name, 0) + 1
        check(f"{name} with the heap full", req.wait(), want)
    del hog
    # Rank 0's arena alone full: in one call its frames go through MPI, its
    # peers' through the heap (each answered by rank 0 on the same pairs).
    plain.barrier()
    while objects_progress._SENDS:
        objects_progress._reap_sends(True)
    free = arena_pool(comm).arena_free()
    hog = cxlmpi.empty((free - (64 << 10)) // 8 if rank == 0 else 1, comm=comm)
    for k in range(4):
        obj = [np.arange(1 << 16, dtype=np.float64) * k + rank, f"rank {rank}"]
        check(f"iallgather {k}, rank 0's arena full", comm.iallgather(obj).wait(),
              plain.allgather(obj))
        big = [np.arange(1 << 16, dtype=np.float64) + 10 * q + k for q in range(size)]
        check(f"ialltoall {k}, rank 0's arena full", comm.ialltoall(big).wait(),
              plain.alltoall(big))
    del hog


def alias() -> None:
    comm.Allreduce(np.zeros(1 << 16), np.zeros(1 << 16))   # (the pool is set up)
    # (and the private duplicate, so that a post sends its headers at once:
    # without a progress thread nothing else would post them before a wait)
    check("the first call", comm.iallgather(rank).wait(), list(range(size)))
    calls["iallgather"] = 1
    n = 1 << 16   # (512 KiB arrays: their frames go through the heap)
    for k, root in enumerate(range(size)):
        sent = {"a": np.arange(n, dtype=np.float64) + k, "rank": rank}
        want_b = plain.bcast(sent if rank == root else None, root)
        want_g = plain.allgather(sent)
        want_r = plain.allreduce(sent["a"])
        if rank == root:
            got = comm.ibcast(sent, root).wait()
            got["a"][:] = -1.0            # (the root's own copy: MPI returns a new one)
            check(f"ibcast {k}: the root's own result", got["rank"], rank)
        else:
            req_b = comm.ibcast(None, root)
        req_g, req_r = comm.iallgather(sent), comm.iallreduce(sent["a"])
        if rank == root:                   # (the root completes first and writes)
            got_g, got_r = req_g.wait(), req_r.wait()
            got_g[rank]["a"][:] = -2.0
            got_r[:] = -3.0
            plain.barrier()
        else:
            plain.barrier()
            check(f"ibcast {k} after the root changed its result", req_b.wait(), want_b)
            got_g, got_r = req_g.wait(), req_r.wait()
            check(f"iallgather {k} after the root changed its result", got_g, want_g)
            check(f"iallreduce {k} after the root changed its result", got_r, want_r)
        for name in ("ibcast", "iallgather", "iallreduce"):
            calls[name] = calls.get(name, 0) + 1
    calls["iallgather"] -= 1   # (the first call: passed through)
    check_pooled()
    # what passed through: the first call, and every one without the heap
    objects = cxlmpi.config.get().objects
    passed = {name: 0 if objects else n for name, n in calls.items()}
    passed["iallgather"] += 1
    calls.clear()
    calls.update(passed)


def late() -> None:
    whole = cxlmpi.wrap(MPI.COMM_WORLD)   # (its pool: set up below, on the sender first)
    obj = {"a": np.arange(1 << 16, dtype=np.float64) * 3, "from": 1}
    x, y = np.arange(1 << 16, dtype=np.float64), np.zeros(1 << 16)
    if rank == 1:
        whole.Allreduce(x, y)
        req = comm.ibcast(obj, root=1)
    else:
        req = comm.ibcast(None, root=1)
        whole.Allreduce(x, y)
    check("ibcast through a heap set up after its post", req.wait(), plain.bcast(obj, 1))
    calls["ibcast"] = 1
    pooled = cxlmpi.stats()["ibcast(obj)"]["pool_calls"]
    if pooled != 1:
        problems.append(f"rank {rank}: ibcast pool calls {pooled}, not 1")
    calls.clear()


def freed() -> None:
    whole = cxlmpi.wrap(MPI.COMM_WORLD)
    whole.Allreduce(np.zeros(1 << 16), np.zeros(1 << 16))   # (COMM_WORLD's pool)
    sub = cxlmpi.wrap(world.Dup())
    check("the first call", sub.iallgather(rank).wait(), list(range(size)))
    obj = {"a": np.arange(1 << 16, dtype=np.float64), "from": 0}
    parts = [np.arange(1 << 15, dtype=np.float64) + q for q in range(size)]
    reqs = [("ibcast", sub.ibcast(obj if rank == 0 else None, 0), plain.bcast(obj, 0)),
            ("iallgather", sub.iallgather(parts[rank]), plain.allgather(parts[rank]))]
    sub.Free()
    for name, req, want in reqs:
        check(f"{name} waited after Free", req.wait(), want)
    calls.update(iallgather=1, ibcast=1)   # (the first call aside)
    check_pooled()
    calls.clear()
    calls["iallgather"] = 1   # (the first call: passed through)


def errors() -> None:
    def raises(what: str, error: type, post) -> None:
        try:
            post()
        except error:
            return
        except Exception as exc:   # noqa: BLE001
            problems.append(f"{what}: rank {rank} raised {exc!r}, not {error.__name__}")
            return
        problems.append(f"{what}: rank {rank} raised nothing")

    raises("root out of range", MPI.Exception, lambda: comm.ibcast(1, root=size))
    raises("root -1", MPI.Exception, lambda: comm.igather(1, root=-1))
    raises("scatter of p+1 objects", ValueError,
           lambda: comm.iscatter(list(range(size + 1)), root=0) if rank == 0 else
           (_ for _ in ()).throw(ValueError("(only the root reads it)")))
    raises("alltoall of p-1 objects", ValueError, lambda: comm.ialltoall([0] * (size - 1)))
    lock = __import__("threading").Lock()
    raises("an unpicklable object", TypeError, lambda: comm.iallgather(lock))
    # the communicator goes on: the calls above took no sequence number
    check("after the errors", comm.iallgather(rank).wait(), list(range(size)))
    calls["iallgather"] = 1


{"each": each, "crossed": crossed, "rounds": rounds, "free": free, "own": own,
 "local": local, "stock": stock_only, "errors": errors, "heap": heap, "alias": alias,
 "late": late, "freed": freed}[SCENARIO]()
figures = cxlmpi.stats()
counted = {name: figures[f"{name}(obj)"]["passthrough_calls"] for name in calls}
if counted != calls:
    problems.append(f"rank {rank}: stats counted {counted}, the script made {calls}")
problems = [p for ps in plain.allgather(problems) for p in ps]
# (the blocking object collectives between posts: through the pool where
# the job's settings send them there)
pooled = sum(figures[f"{name}(obj)"]["pool_calls"] for name in ("bcast", "allreduce"))
if rank == 0:
    print("RESULT " + json.dumps({"ok": not problems, "problems": problems[:10],
                                  "counted": counted, "blocking_pooled": pooled,
                                  "thread": bool(objects_progress._thread)}), flush=True)

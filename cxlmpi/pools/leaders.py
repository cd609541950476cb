"""The leaders' MPI step of a collective over several pool groups
(cxlmpi.pools.hierarchy): waiting for its requests with a timeout, and
telling the other groups' leaders when a rank of this group refused its
message of a call.

A leader whose group failed in its pool step never posts its part of the
leaders' step, so every wait here ends by CXLMPI_TIMEOUT at the latest.  A
refusal (a rank's count or block outside its buffer: it raises before the
pool touches a byte, and its group's pool tells the group's ranks) reaches
the other groups sooner: the group's leader sends the refusing rank's
number to every other leader, point to point on the leaders' own
communicator (`REFUSED_TAG`); a leader waiting in a leaders' step looks for
that message between its tests, and raises the refusal in its group as if
one of its own ranks had refused.  The message stays until a leader looks:
one whose step completed (the refusing group was not needed for it) finds
it in its next step, which that group never joins; after the
communicator's Free every leader receives what it was sent before the
leaders' communicator is freed (`Alarm.free`, `free_settled`).
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from array import array
from typing import Callable

from mpi4py import MPI

from .. import config

__all__ = ["Alarm", "wait", "drain", "settle", "abandon", "free_settled", "REFUSED_TAG"]

#: the tag of a refusal told to the other leaders (the leaders' communicator
#: carries Gather's spans, tag 1, and nothing else point to point)
REFUSED_TAG = 2
#: the tag of how many refusals a leader told each other one (Alarm.free)
COUNT_TAG = 3

# Requests of leaders' steps that timed out or were given up, with the
# buffers they may still write into or read from: kept for the life of the
# process (a request may not be freed before it completes, nor its buffer),
# with the Alarm of their leaders' communicator where they have one (it is
# not freed under one still in flight: `free_settled`).
_abandoned: list[tuple[list[MPI.Request], object]] = []
_lock = threading.Lock()


def abandon(reqs: list[MPI.Request | None], keep: object = None,
            owner: Alarm | None = None) -> None:
    """Leave `reqs` behind, with `keep`, for the life of the process (on
    the leaders' communicator of `owner`)."""
    live = [req for req in reqs if req is not None]
    if live:
        with _lock:
            (owner.left if owner is not None else _abandoned).append((live, keep))


def _quiet(left: list[tuple[list[MPI.Request], object]]) -> bool:
    """Whether every request of `left` has completed (those are
    forgotten): a leaders' communicator is not freed under one still in
    flight (Open MPI crashed progressing a nonblocking collective whose
    communicator had been freed).  Under `_lock`."""
    left[:] = [(reqs, keep) for reqs, keep in left if not MPI.Request.Testall(reqs)]
    return not left


def wait(reqs: list[MPI.Request | None], keep: object = None,
         look: Callable[[], None] | None = None, owner: Alarm | None = None) -> bool:
    """Complete `reqs` (None: none), as Waitall would, for at most
    CXLMPI_TIMEOUT: whether they completed (False: they are left behind).
    Tests first, then yields the core for 10 ms, then sleeps between tests
    (1 us doubling to 1 ms), as the pool's own waits do; `look()` is called
    between the tests once they no longer come back at once (it may
    raise).  Requests left behind are kept with `keep`, the buffers they
    may still write into."""
    live = [req for req in reqs if req is not None]
    if not live:
        return True
    timeout = config.get().timeout
    polls, first, nap = 0, 0.0, 1e-6
    while not MPI.Request.Testall(live):
        polls += 1
        if polls < 1024:
            continue
        if look is not None:
            try:
                look()
            except BaseException:
                abandon(live, keep, owner)
                raise
        now = time.monotonic()
        if first == 0.0:
            first = now
        elif timeout > 0 and now - first > timeout:
            abandon(live, keep, owner)
            return False
        if now - first < 0.01:
            os.sched_yield()
        else:
            time.sleep(nap)
            nap = min(2 * nap, 1e-3)
    return True


def drain(reqs: list[MPI.Request | None], keep: object = None,
          limit: float | None = None, owner: Alarm | None = None) -> None:
    """After a failure in a pipelined collective: let the leaders' requests
    still in flight complete, so that MPI writes into no buffer the caller
    got back -- for at most CXLMPI_TIMEOUT (or `limit` seconds), since their
    partners may have failed too and never post theirs (those requests are
    then left behind: the communicator's pool is broken and the call
    raises)."""
    live = [req for req in reqs if req is not None]
    if limit is None:
        timeout = config.get().timeout
        limit = timeout if timeout > 0 else 60.0
    if not settle(live, limit):
        abandon(live, keep, owner)


def settle(reqs: list[MPI.Request], limit: float) -> bool:
    """Test `reqs` for at most `limit` seconds: whether they completed."""
    deadline = time.monotonic() + limit
    while reqs and not MPI.Request.Testall(reqs):
        if time.monotonic() > deadline:
            return False
        time.sleep(1e-3)
    return True


class Alarm:
    """The refusals one leader tells the others, and hears of, point to
    point on the leaders' communicator (REFUSED_TAG).  A message left
    unreceived on a communicator that is then freed may be matched on a
    later communicator that MPI gives the same context (MPICH does: the
    point-to-point reduce of mpi4py's own `comm.reduce` received one), so
    the leaders' communicator is freed only in `free`, once every leader
    has received all that was sent to it."""

    def __init__(self, comm: MPI.Intracomm) -> None:
        free_settled()   # (the last communicators' exchanges may have ended)
        self.comm = comm
        n = comm.Get_size()
        self.sent = array("q", bytes(8 * n))   # messages sent to each leader
        self.got = array("q", bytes(8 * n))    # and received from each
        # requests on `comm` left behind (`abandon`): it is freed after them
        self.left: list[tuple[list[MPI.Request], object]] = []

    def tell(self, rank: int) -> None:
        """Tell every other leader that `rank` (of the whole communicator)
        refused its message of the current call (sent, never waited for:
        a few bytes)."""
        me = self.comm.Get_rank()
        for q in range(self.comm.Get_size()):
            if q != me:
                buf = array("q", [rank])
                abandon([self.comm.Isend([buf, MPI.INT64_T], q, REFUSED_TAG)], buf, self)
                self.sent[q] += 1

    def told(self) -> int:
        """The rank another leader said refused its message (`tell`), or -1
        where none has."""
        status = MPI.Status()
        message = self.comm.Improbe(MPI.ANY_SOURCE, REFUSED_TAG, status)
        if message is None:
            return -1
        buf = array("q", [-1])
        message.Recv([buf, MPI.INT64_T])
        self.got[status.Get_source()] += 1
        return buf[0]

    def free(self) -> None:
        """At the communicator's Free: tell each other leader how many
        messages this one sent it, and post the receives of what each sent
        this one (point to point: a nonblocking collective left behind by a
        failed step would match anything collective here); the leaders'
        communicator is freed once those complete and this leader has
        received all it was sent (`free_settled`).  Nothing here waits:
        MPI lets ranks free communicators in different orders, and a
        leader that waited for the others' counts here would wait for
        ever on a leader that frees another communicator first."""
        comm, self.comm = self.comm, None
        if comm is None or MPI.Is_finalized():
            return
        n, me = comm.Get_size(), comm.Get_rank()
        mine = [array("q", [self.sent[q]]) for q in range(n)]
        owed = [array("q", [0]) for _ in range(n)]
        reqs = [comm.Isend([mine[q], MPI.INT64_T], q, COUNT_TAG) for q in range(n) if q != me]
        reqs += [comm.Irecv([owed[q], MPI.INT64_T], q, COUNT_TAG) for q in range(n) if q != me]
        with _lock:
            _freeing.append((comm, reqs, mine, owed, self.got, self.left))
        free_settled()


# Leaders' communicators freed by their Alarm but not yet by MPI: (the
# communicator, the requests of its count exchange, their buffers, what
# this leader received from each other one, the requests left behind on it).
_freeing: list[tuple[MPI.Intracomm, list[MPI.Request], list[array], list[array], array,
                     list[tuple[list[MPI.Request], object]]]] = []


def free_settled(limit: float = 0.0) -> None:
    """Free the leaders' communicators whose count exchange (`Alarm.free`)
    completed, once this leader has received what the counts say it was
    sent (those messages were sent before the counts, and MPI does not
    let a later message overtake an earlier one) and every request left
    behind on it has completed.  Called at each `Alarm.free` and each new
    Alarm (a later communicator of the same leaders), and at exit, before
    MPI_Finalize, with `limit` seconds to wait: what is still pending then
    stays unfreed, its count receives cancelled (a leader that never freed
    its communicator, a request left behind that never completed: a leak,
    never a hang)."""
    if MPI.Is_finalized():
        return
    buf = array("q", [0])
    deadline = time.monotonic() + limit
    with _lock:
        while True:
            for entry in list(_freeing):
                comm, reqs, _, owed, got, left = entry
                if not MPI.Request.Testall(reqs) or not _quiet(left):
                    continue
                _freeing.remove(entry)
                for q, count in enumerate(owed):
                    for _ in range(count[0] - got[q]):
                        comm.Recv([buf, MPI.INT64_T], q, REFUSED_TAG)
                comm.Free()
            if not _freeing or time.monotonic() >= deadline:
                break
            time.sleep(1e-3)
        if limit:
            for entry in _freeing:
                reqs = entry[1]
                for req in reqs[len(reqs) // 2:]:   # (the receives)
                    if not req.Test():
                        req.Cancel()
                        req.Wait()   # (a cancelled receive completes)
            _freeing.clear()


@atexit.register
def _at_exit() -> None:
    # (before MPI_Finalize, which mpi4py runs after the atexit functions)
    free_settled(1.0)

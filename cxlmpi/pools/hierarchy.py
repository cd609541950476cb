"""Collectives over several pools: an intra-pool phase in each pool group's
pool, an inter-pool phase through MPI among the group leaders.

A communicator whose ranks span pools (hosts that do not share CXL memory,
or CXLMPI_POOL_GROUPS > 1 on one node) gets a Hierarchy in place of a Pool.
It offers the Pool methods the dispatcher calls for the collectives in
`ACROSS_GROUPS`; the others pass through to MPI on the whole communicator.

    Barrier    pool barrier, leaders' MPI Barrier, pool barrier
    Bcast      pool bcast in the root's group, MPI Bcast among leaders,
               pool bcast in every other group
    Allreduce  pool reduce to each leader, MPI Allreduce among leaders,
               pool bcast from each leader
    Reduce     pool reduce to each leader, MPI Reduce among leaders to the
               root's leader, then leader to root through the pool
    Allgather(v)
               pool gather to each leader (every block padded to the
               largest), an MPI Ibcast of each group's blocks among the
               leaders, pool bcast of each group's blocks as they arrive
    Gather     pool gather to each leader (the root's group: to the root),
               the leaders send their group's blocks to the root's leader,
               which passes each on to the root through the pool as it
               arrives

Bcast, Allreduce and Reduce are pipelined: the message is cut into
segments (`segments`: at most 8, none under CXLMPI_CHUNK_SIZE), and the
leaders' nonblocking MPI call on one segment runs while the pool moves the
next (the pool's waits keep MPI progressing), so the network and the pool
work at once instead of in turn.  Every rank cuts alike: from the message
size and the settings, which all hold.  Allgather(v) and Gather
pipeline by group: one group's blocks move through the pool while the
next group's are on the network.

A reduction combines each group's contributions first, then the groups': for
floating point the result can differ in the last bits from a flat reduction,
as it does between MPI libraries (MPI leaves the order open).  Every rank
still receives the same bits.
"""

from __future__ import annotations

import ctypes
from typing import Any, Callable

from mpi4py import MPI

from .. import config
from .._pool import OP_CODES, TYPE_CODES, Pool, PoolFailure
from . import leaders as step

__all__ = ["Hierarchy", "ACROSS_GROUPS"]

# (Not Gatherv: its ranks settle its path in a header step, which across
# groups goes through the leaders' MPI -- more than a small Gatherv costs
# in MPI itself: 67 us against 13 us at 4 ranks in two groups of one node.)
ACROSS_GROUPS = ("barrier", "bcast", "reduce", "allreduce", "allgather", "allgatherv",
                 "gather")

_MPI_TYPES = {
    "i8": MPI.INT8_T, "i16": MPI.INT16_T, "i32": MPI.INT32_T, "i64": MPI.INT64_T,
    "u8": MPI.UINT8_T, "u16": MPI.UINT16_T, "u32": MPI.UINT32_T, "u64": MPI.UINT64_T,
    "f32": MPI.FLOAT, "f64": MPI.DOUBLE, "c64": MPI.C_FLOAT_COMPLEX,
    "c128": MPI.C_DOUBLE_COMPLEX, "bool": MPI.C_BOOL, "byte": MPI.BYTE,
}
MPI_TYPE = {code: _MPI_TYPES[name] for name, code in TYPE_CODES.items()}
MPI_OP = {code: getattr(MPI, name) for name, code in OP_CODES.items()}
BYTE = TYPE_CODES["byte"]
# What went wrong in a group's pool at a header step (Hierarchy.header)
_MISMATCH, _FOLLOW = 1, 2
#: the tag of a Gather's spans sent to the root's leader (on the leaders'
#: own communicator, which carries nothing else point to point)
GATHER_TAG = 1


#: the most segments a pipelined collective is cut into
MAX_SEGMENTS = 8


def segments(count: int, itemsize: int, chunk: int) -> list[tuple[int, int]]:
    """(first element, elements) of each segment of a pipelined collective
    of `count` elements: at most MAX_SEGMENTS, all but the last of the same
    whole number of elements, at least `chunk` bytes rounded up to 4 KiB --
    the same on every rank."""
    nbytes = count * itemsize
    seg = max(chunk, -(-nbytes // MAX_SEGMENTS))
    seg = -(-seg // 4096) * 4096
    per = max(seg // itemsize, 1)
    return [(i, min(per, count - i)) for i in range(0, count, per)]


def _buffer(address: int, count: int, itemsize: int, tcode: int) -> list:
    """An MPI message [buffer, count, datatype] on memory at `address`."""
    raw = (ctypes.c_char * (count * itemsize)).from_address(address)
    return [memoryview(raw).cast("B"), count, MPI_TYPE[tcode]]


class Hierarchy:
    """This rank's view of a communicator spanning several pool groups."""

    def __init__(self, rank: int, groups: list[list[int]], pool: Pool | None,
                 leaders: MPI.Intracomm | None) -> None:
        self.groups = groups
        self.where = {r: (g, i) for g, ranks in enumerate(groups) for i, r in enumerate(ranks)}
        self.group, _ = self.where[rank]
        self.rank = rank
        self.pool = pool              # None in a group of one rank
        self.hosts = 1                # hosts of the largest group (cxlmpi.pools.group)
        self.leaders = leaders        # MPI among group leaders; None elsewhere
        # the refusals told to the other leaders and heard from them
        self._alarm = step.Alarm(leaders) if leaders is not None else None
        # What adaptive selection (cxlmpi._shim.Routes) reads of a pool: the
        # ranks, the chunk, where pool arrays live (no zero copy across
        # groups), and a call counter that every rank of the communicator
        # advances alike -- by one per call of a method below, however
        # many pool steps its group takes (a group's own pool counts those).
        self.size = len(self.where)
        self.chunk_nbytes = config.get().chunk_size
        self.zerocopy_min_nbytes = 1 << 62
        self._ops = ctypes.c_uint64(0)
        # the group's signatures of a call that did not match, kept over the
        # steps that told the other groups (see header)
        self._signed: list[tuple] | None = None
        # the leaders' MPI step of the last call timed out (_await): whom
        # the error names
        self._late_leaders = False
        # the rank of another group that refused its message, told by its
        # leader (see refused); the call at which this leader told the
        # others of its own group's refusal
        self._relayed: list[int] = []
        self._told = -1

    # --------------------------------------------------- Pool's interface
    def close(self) -> None:
        """Close the group's pool and stop using the leaders' communicator
        (freed in `free`, where every leader has received what it was
        told)."""
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        self.leaders = None

    def free(self) -> None:
        """Collective (the communicator's Free): close, and free the
        leaders' communicator (cxlmpi.pools.leaders.Alarm.free)."""
        self.close()
        alarm, self._alarm = self._alarm, None
        if alarm is not None:
            alarm.free()

    @property
    def closed(self) -> bool:
        return self.pool is None and self.leaders is None

    def missing_ranks(self) -> list[int]:
        if self._late_leaders:   # (the other groups' leaders: which one is not known)
            return [g[0] for i, g in enumerate(self.groups) if i != self.group]
        if self.pool is None or self.pool.closed:
            return []
        ranks = self.groups[self.group]
        return [ranks[q] for q in self.pool.missing_ranks()]

    def _local(self, method: str, *args: object) -> Any:
        """A pool call in this rank's group (its result; None without a
        pool); failures name ranks of the whole communicator."""
        if self.pool is None:
            return None
        try:
            return getattr(self.pool, method)(*args)
        except PoolFailure as exc:
            raise self._group_failure(exc) from None

    def _group_failure(self, exc: PoolFailure) -> PoolFailure:
        """A failure of the group's pool as the whole communicator sees it:
        ranks of the communicator; a peer that sent the call to MPI cannot
        be followed half way through a hierarchical collective, a mismatch
        here.  A leader whose group refused a message tells the other
        leaders (cxlmpi.pools.leaders)."""
        code = PoolFailure.MISMATCH if exc.passed else exc.code
        rank = self.groups[self.group][exc.rank] if exc.rank >= 0 else -1
        if self.leaders is not None:   # (a refusing rank may have closed its pool: left)
            refused = self.refused()
            if refused:
                self._tell(refused[0])
        return PoolFailure(code, rank, exc.what, exc.still_s, exc.lease_s)

    def _tell(self, rank: int) -> None:
        """Tell the other leaders that `rank` refused its message of the
        current call (once a call)."""
        if self.leaders is not None and self._told != self._ops.value:
            self._told = self._ops.value
            self._alarm.tell(rank)

    def _look(self, what: str) -> None:
        """Between the tests of a leaders' step: where another leader told
        of a refusal, pass it on to this group (its ranks raise it at their
        step) and raise it (see refused)."""
        rank = self._alarm.told()
        if rank < 0:
            return
        self._relayed.append(rank)
        if self.pool is not None:
            self.pool.refuse(rank)
        raise PoolFailure(PoolFailure.MISMATCH, rank, what)

    def ops_address(self) -> int:
        """The address of the call counter (see Pool.ops_address)."""
        return ctypes.addressof(self._ops)

    def arena_span(self) -> tuple[int, int]:
        """No arenas: across groups every call copies (Pool.arena_span)."""
        return 0, 0

    def _count(self) -> None:
        self._ops.value += 1
        self._signed = None

    def _await(self, reqs: list[MPI.Request | None], what: str,
               keep: object = None) -> None:
        """Complete the leaders' requests `reqs` (None: none), as Waitall
        would, for at most CXLMPI_TIMEOUT (cxlmpi.pools.leaders.wait): a
        leader whose group failed in its pool step (a timeout, a peer gone:
        it raised there) never posts its part, and a Wait for it waited for
        ever -- the other leaders stood in MPI while the ranks that raised
        sat in MPI_Finalize waiting for them.  On the timeout the requests
        are left behind, with `keep` (the buffers they may still write:
        never freed), and PoolFailure (timed out) names the other groups'
        leaders (`missing_ranks`); where another leader tells of a refusal
        meanwhile, its mismatch (`_look`)."""
        if not step.wait(reqs, keep, lambda: self._look(what), self._alarm):
            self._late_leaders = True
            raise PoolFailure(PoolFailure.TIMEOUT, -1, what)

    def note_pass(self) -> None:
        """This rank sends its current call to MPI (see Pool.note_pass)."""
        self._count()
        if self.pool is not None:
            self.pool.note_pass()

    def signatures(self) -> list[tuple]:
        """The group's signatures of its last call (see Pool.signatures)."""
        if self._signed is not None:
            return self._signed
        return self.pool.signatures() if self.pool is not None else []

    def out_of_step(self) -> list[int]:
        """The ranks of this group that found its calls out of step (see
        Pool.out_of_step), as ranks of the communicator."""
        if self.pool is None:
            return []
        return [self.groups[self.group][q] for q in self.pool.out_of_step()]

    def refused(self) -> list[int]:
        """The ranks of the communicator that refused a message: of this
        group (Pool.refused), or of another, as its leader told (`_look`)."""
        if self.pool is None or self.pool.closed:
            return list(self._relayed)
        group = self.groups[self.group]
        return [group[q] if relay < 0 else relay for q, relay in self.pool.refusers()]

    def refuse(self) -> None:
        """Pool.refuse in this rank's group; a leader also tells the other
        leaders (the others learn of it from their pool step)."""
        if self.pool is not None:
            self.pool.refuse()
        self._tell(self.rank)

    def barrier(self) -> None:
        self._count()
        self._local("barrier")
        if self.leaders is not None:
            self._await([self.leaders.Ibarrier()], "Barrier")
        self._local("barrier")

    def _pipeline(self, segs: list[tuple[int, int]],
                  start: Callable[[int, int], MPI.Request | None],
                  finish: Callable[[int, int], None], what: str,
                  keep: object = None) -> None:
        """Run `start(first, n)` on each segment in turn (a pool phase, then
        the leaders' nonblocking MPI call: its request, or None), and
        `finish(first, n)` on each once its request completed -- segment
        k's after segment k + 1's start, so that the MPI call of one runs
        while the pool moves the next.  Every rank runs the same pool
        phases in the same order; `keep`: a scratch buffer the requests
        write into (see _await)."""
        pending: list[tuple[int, int, MPI.Request | None]] = []
        try:
            for first, n in segs:
                pending.append((first, n, start(first, n)))
                if len(pending) == 2:
                    self._finish(pending[0], finish, what, keep)
                    del pending[0]
            if pending:
                self._finish(pending[0], finish, what, keep)
                del pending[0]
        except BaseException:
            self._drain([req for _, _, req in pending], keep)
            raise

    def bcast(self, address: int, nbytes: int, root: int) -> None:
        self._count()
        g_root, l_root = self.where[root]
        leaders = self.leaders
        segs = segments(nbytes, 1, config.get().chunk_size)
        if self.group == g_root:
            reqs: list[MPI.Request] = []
            try:
                for first, n in segs:
                    self._local("bcast", address + first, n, l_root)
                    if leaders is not None:
                        reqs.append(leaders.Ibcast(_buffer(address + first, n, 1, BYTE),
                                                   g_root))
            except BaseException:
                self._drain(reqs)
                raise
            self._await(reqs, "Bcast")
            return
        # every segment's MPI call posted at once (in order on every leader),
        # each passed on in the group once it arrived
        reqs = [leaders.Ibcast(_buffer(address + first, n, 1, BYTE), g_root)
                for first, n in segs] if leaders is not None else []
        try:
            for k, (first, n) in enumerate(segs):
                if reqs:
                    self._await([reqs[k]], "Bcast")
                self._local("bcast", address + first, n, 0)
        except BaseException:
            self._drain(reqs)
            raise

    def reduce(self, sendaddr: int, recvaddr: int, count: int, itemsize: int,
               op: int, tcode: int, root: int) -> None:
        self._count()
        leaders = self.leaders
        segs = segments(count, itemsize, config.get().chunk_size)
        if root < 0:                                  # Allreduce
            def start(first: int, n: int) -> MPI.Request | None:
                at = first * itemsize
                self._reduce_local(sendaddr + at, recvaddr + at, n, itemsize, op, tcode)
                if leaders is None:
                    return None
                return leaders.Iallreduce(MPI.IN_PLACE,
                                          _buffer(recvaddr + at, n, itemsize, tcode),
                                          MPI_OP[op])

            def spread(first: int, n: int) -> None:
                self._local("bcast", recvaddr + first * itemsize, n * itemsize, 0)

            self._pipeline(segs, start, spread, "Allreduce")
            return
        g_root, l_root = self.where[root]
        nbytes = count * itemsize
        scratch = None
        dst = 0
        if leaders is not None:
            if self.rank == root:
                dst = recvaddr
            else:
                scratch = ctypes.create_string_buffer(max(nbytes, 1))
                dst = ctypes.addressof(scratch)

        def reduce_start(first: int, n: int) -> MPI.Request | None:
            at = first * itemsize
            self._reduce_local(sendaddr + at, dst + at if dst else 0, n, itemsize, op, tcode)
            if leaders is None:
                return None
            msg = _buffer(dst + at, n, itemsize, tcode)
            if self.group == g_root:
                return leaders.Ireduce(MPI.IN_PLACE, msg, MPI_OP[op], g_root)
            return leaders.Ireduce(msg, None, MPI_OP[op], g_root)

        def to_root(first: int, n: int) -> None:
            if self.group != g_root or l_root == 0:
                return
            at = first * itemsize
            self._forward(dst + at, recvaddr + at if self.rank == root else 0, n * itemsize,
                          l_root, "Reduce")

        self._pipeline(segs, reduce_start, to_root, "Reduce", scratch)

    def _reduce_local(self, sendaddr: int, dst: int, count: int, itemsize: int,
                      op: int, tcode: int) -> None:
        """The group's reduction into `dst` at the leader."""
        if self.pool is not None:
            self._local("reduce", sendaddr, dst, count, itemsize, op, tcode, 0)
        elif dst != sendaddr:
            ctypes.memmove(dst, sendaddr, count * itemsize)

    # ------------------------------------------------ gathers, header step

    def agree(self, value: int, what: str = "header step", root: int = -1,
              pairs: int = 0) -> int:
        """A header step that settles a call's path (see Pool.agree): the
        maximum of every rank's `value`, 0 when any published 0.  (`pairs`,
        the block checksum, is checked within each group's pool only.)"""
        return self.header(value, what, root, pairs)[0]

    def header(self, value: int, what: str = "header step", root: int = -1,
               pairs: int = 0, report: int = 0, extra: int = 0,
               extra2: int = 0) -> tuple[int, int, int]:
        """The header step of a learning call (see Pool.header): every rank
        publishes `value`; returns (the maximum, or 0 when any rank
        published 0; the largest `extra` and `extra2` of any rank).  Each
        group agrees in its pool, the leaders through one MPI Allreduce (MAX
        of: whether a group published 0, its value, its largest extras, the report and
        its complement, which tell a mismatch, and what went wrong in a
        group), and each leader passes the outcome on through its pool.

        What one group meets, every group learns: a mismatch in a group's
        pool makes every rank raise one; a rank that sent the call to MPI
        (its buffer is not one the pool takes) makes every rank follow it
        there (PoolFailure `passed`) -- its group's other ranks at once,
        having told the leaders, since that group cannot meet in its pool
        again for this call.  Only a leader that sent the call to MPI
        cannot tell the others (Limits in the README; docs: Pools that span hosts)."""
        self._count()
        most, most2 = extra, extra2
        failure = None
        trouble = 0
        if self.pool is not None:
            try:
                value, most, most2 = self.pool.header(value, what, root, 0, report, extra,
                                                      extra2)
            except PoolFailure as exc:
                if not (exc.passed or exc.mismatch):
                    raise self._group_failure(exc) from None
                failure = exc
                trouble = _FOLLOW if exc.passed else _MISMATCH
                value = most = most2 = 0
                signed = self.pool.signatures()
        if self.leaders is not None:
            mask = (1 << 64) - 1
            both = (ctypes.c_uint64 * 7)(int(value == 0), value, most, most2, report,
                                         ~report & mask, trouble)
            self._await([self.leaders.Iallreduce(MPI.IN_PLACE, [both, MPI.UINT64_T],
                                                 MPI.MAX)], what + " header", both)
            value = 0 if both[0] else both[1]
            most, most2 = both[2], both[3]
            mismatch = both[4] != ~both[5] & mask     # max(report) != min(report)
            trouble = max(both[6], _MISMATCH if mismatch else 0)
        if self.pool is not None and (failure is None or not failure.passed):
            out = (ctypes.c_uint64 * 4)(value, most, most2, trouble)
            self._local("bcast", ctypes.addressof(out), ctypes.sizeof(out), 0)
            value, most, most2, trouble = out
        if trouble == _FOLLOW:   # (a passer's group set it; the leaders' MAX keeps it)
            raise PoolFailure(PoolFailure.PASSED, -1, what)
        if trouble == _MISMATCH:
            if failure is not None:
                self._signed = signed
                raise self._group_failure(failure)
            raise PoolFailure(PoolFailure.MISMATCH, -1, what + " header")
        return value, most, most2

    def _forward(self, src: int, dst: int, nbytes: int, to: int, what: str) -> None:
        """`nbytes` from the group's leader (at `src`) to the group's rank
        `to` (a local index; at `dst`) through the pool: a step every rank
        of the group takes (the others send and receive nothing)."""
        n = len(self.groups[self.group])
        leader = self.leaders is not None
        self._local("gather", src if leader else 0, nbytes if leader else 0,
                    [dst] * n, [nbytes if q == 0 else 0 for q in range(n)], to, nbytes, what)

    def gather(self, sendaddr: int, send_nbytes: int, recv_addrs: list[int],
               recv_nbytes: list[int], root: int, max_nbytes: int, what: str,
               pairs: int = 0) -> None:
        """Allgather(v) (root < 0) and Gather over the pool groups (the
        block checksum `pairs` is left to MPI's own checks: it sums to zero
        only over the whole communicator, not per group).

        Every block is padded to the largest (`max_nbytes`, which every
        rank holds), so group g's blocks fill a span of the whole at a
        place every rank computes alike.  A group gathers its blocks at its
        leader (the root's group: at the root), in their place; the leaders
        then move each group's span -- Allgather: an Ibcast per group, all
        posted at once; Gather: to the root's leader -- and each span goes
        on through the pool as soon as it arrived, while the next is still
        on the network: the groups' spans pipeline the two phases."""
        self._count()
        slot = max_nbytes
        if slot == 0:       # nothing moves (every rank holds the same slot)
            return
        ngroups = len(self.groups)
        counts = [len(g) * slot for g in self.groups]
        displs = [sum(counts[:g]) for g in range(ngroups)]
        rooted = root >= 0
        g_root, l_root = self.where[root] if rooted else (-1, 0)
        leader = self.leaders is not None
        in_root_group = self.group == g_root
        # The whole result, on every rank that receives it and on the
        # leaders that pass it on; a Gather's other leaders hold their span.
        # A receiver whose blocks lie one after the other in the groups'
        # order, each `slot` long (Allgather, Gather: ranks in consecutive
        # groups), receives in place: no scratch, no copy into place.
        receives = not rooted or self.rank == root
        order = [r for ranks in self.groups for r in ranks]
        first = recv_addrs[order[0]] if receives else 0
        if receives and all(recv_nbytes[r] == slot and recv_addrs[r] == first + i * slot
                            for i, r in enumerate(order)):
            buf, whole = None, first
        else:
            whole_here = receives or (leader and in_root_group)
            buf = ctypes.create_string_buffer(sum(counts) if whole_here
                                              else counts[self.group] if leader else 1)
            base = ctypes.addressof(buf)
            whole = base if whole_here else base - displs[self.group]
        # 1. the group's blocks, each in its place in the whole, at the
        #    leader (in the root's group: at the root)
        local = l_root if in_root_group else 0
        group = self.groups[self.group]
        at = whole + displs[self.group]
        if self.pool is not None:
            into = [at + i * slot for i in range(len(group))] if group[local] == self.rank \
                else [0] * len(group)
            self._local("gather", sendaddr, send_nbytes, into, [slot] * len(group), local,
                        slot, what)
        else:
            ctypes.memmove(at, sendaddr, send_nbytes)
        span = [(whole + displs[g], counts[g]) for g in range(ngroups)]
        # 2. among the leaders, and 3. on through the pool, span by span
        reqs: list[MPI.Request] = []
        try:
            if not rooted:
                if leader:
                    reqs = [self.leaders.Ibcast(_buffer(*span[g], 1, BYTE), g)
                            for g in range(ngroups)]
                for g in [self.group] + [g for g in range(ngroups) if g != self.group]:
                    if g != self.group and reqs:
                        self._await([reqs[g]], what, buf)
                    self._local("bcast", *span[g], 0)
                    self._place(g, span[g][0], slot, recv_addrs, recv_nbytes)
                self._await(reqs, what, buf)
                return
            if leader and not in_root_group:
                self._await([self.leaders.Isend(_buffer(*span[self.group], 1, BYTE), g_root,
                                                GATHER_TAG)], what, buf)
                return
            if not in_root_group:
                return
            if leader:
                reqs = [self.leaders.Irecv(_buffer(*span[g], 1, BYTE), g, GATHER_TAG)
                        if g != g_root else MPI.REQUEST_NULL for g in range(ngroups)]
            for g in range(ngroups):
                if g != g_root:
                    if reqs:
                        self._await([reqs[g]], what, buf)
                    if l_root != 0:                 # leader -> root
                        self._forward(span[g][0], span[g][0], counts[g], l_root, what)
                if self.rank == root:
                    self._place(g, span[g][0], slot, recv_addrs, recv_nbytes)
            self._await(reqs, what, buf)
        except BaseException:
            self._drain(reqs, buf)
            raise

    def _place(self, g: int, at: int, slot: int, recv_addrs: list[int],
               recv_nbytes: list[int]) -> None:
        """Group g's blocks from its span of the whole (at `at`) to where
        the caller wants them."""
        for r in self.groups[g]:
            if recv_nbytes[r] and recv_addrs[r] != at:
                ctypes.memmove(recv_addrs[r], at, min(recv_nbytes[r], slot))
            at += slot


    def _finish(self, pending: tuple[int, int, MPI.Request | None],
                finish: Callable[[int, int], None], what: str, keep: object) -> None:
        first, n, req = pending
        self._await([req], what, keep)
        finish(first, n)

    def _drain(self, reqs: list[MPI.Request | None], keep: object = None) -> None:
        """`leaders.drain` after a failure -- none after the leaders' step
        timed out (another CXLMPI_TIMEOUT for the same leaders): the
        requests are left behind with `keep`, as _await leaves its own; a
        short one after a refusal was told (what a live partner posted
        completes at once; the refusing group's leader posts nothing)."""
        if self._late_leaders:
            step.abandon(reqs, keep, self._alarm)
        else:
            step.drain(reqs, keep, 0.1 if self._relayed or self._told == self._ops.value
                       else None, self._alarm)

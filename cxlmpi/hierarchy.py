"""Collectives over several pools: an intra-pool phase in each pool group's
pool, an inter-pool phase through MPI among the group leaders.

A communicator whose ranks span pools (hosts that do not share CXL memory,
or CXLMPI_POOL_GROUPS > 1 on one node) gets a Hierarchy in place of a Pool.
It offers the Pool methods the dispatcher calls for the collectives in
`COLLECTIVES`; the others pass through to MPI on the whole communicator.

    Barrier    pool barrier, leaders' MPI Barrier, pool barrier
    Bcast      pool bcast in the root's group, MPI Bcast among leaders,
               pool bcast in every other group
    Allreduce  pool reduce to each leader, MPI Allreduce among leaders,
               pool bcast from each leader
    Reduce     pool reduce to each leader, MPI Reduce among leaders to the
               root's leader, then leader to root through the pool
    Allgather(v), Gather(v)
               pool gather to each leader (every block padded to the
               largest), MPI Allgatherv / Gatherv among leaders, then pool
               bcast of everything (Gather: leader to root); each receiver
               puts the blocks where they belong

Bcast, Allreduce and Reduce are pipelined: the message is cut into
segments (`segments`: at most 8, none under CXLMPI_CHUNK_SIZE), and the
leaders' nonblocking MPI call on one segment runs while the pool moves the
next (the pool's waits keep MPI progressing), so the network and the pool
work at once instead of in turn.  Every rank cuts alike: from the message
size and the settings, which all hold.

A reduction combines each group's contributions first, then the groups': for
floating point the result can differ in the last bits from a flat reduction,
as it does between MPI libraries (MPI leaves the order open).  Every rank
still receives the same bits.
"""

from __future__ import annotations

import ctypes
import time
from typing import Any, Callable

from mpi4py import MPI

from . import config
from ._pool import OP_CODES, TYPE_CODES, Pool, PoolFailure

__all__ = ["Hierarchy", "COLLECTIVES"]

COLLECTIVES = ("barrier", "bcast", "reduce", "allreduce", "allgather", "allgatherv",
               "gather", "gatherv")

_MPI_TYPES = {
    "i8": MPI.INT8_T, "i16": MPI.INT16_T, "i32": MPI.INT32_T, "i64": MPI.INT64_T,
    "u8": MPI.UINT8_T, "u16": MPI.UINT16_T, "u32": MPI.UINT32_T, "u64": MPI.UINT64_T,
    "f32": MPI.FLOAT, "f64": MPI.DOUBLE, "c64": MPI.C_FLOAT_COMPLEX,
    "c128": MPI.C_DOUBLE_COMPLEX, "bool": MPI.C_BOOL, "byte": MPI.BYTE,
}
MPI_TYPE = {code: _MPI_TYPES[name] for name, code in TYPE_CODES.items()}
MPI_OP = {code: getattr(MPI, name) for name, code in OP_CODES.items()}


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
        self.hosts = 1                # hosts of the largest group (cxlmpi.group)
        self.leaders = leaders        # MPI among group leaders; None elsewhere

    # --------------------------------------------------- Pool's interface
    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        if self.leaders is not None:
            try:
                if not MPI.Is_finalized():
                    self.leaders.Free()
            finally:
                self.leaders = None

    @property
    def closed(self) -> bool:
        return self.pool is None and self.leaders is None

    def missing_ranks(self) -> list[int]:
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
            # A peer that sent the call to MPI cannot be followed half way
            # through a hierarchical collective: a mismatch here.
            code = PoolFailure.MISMATCH if exc.passed else exc.code
            rank = self.groups[self.group][exc.rank] if exc.rank >= 0 else -1
            raise PoolFailure(code, rank, exc.what) from None

    def note_pass(self) -> None:
        """This rank sends its current call to MPI (see Pool.note_pass)."""
        if self.pool is not None:
            self.pool.note_pass()

    def signatures(self) -> list[tuple]:
        """The group's signatures of its last call (see Pool.signatures)."""
        return self.pool.signatures() if self.pool is not None else []

    def barrier(self) -> None:
        self._local("barrier")
        if self.leaders is not None:
            self.leaders.Barrier()
        self._local("barrier")

    @staticmethod
    def _pipeline(segs: list[tuple[int, int]],
                  start: Callable[[int, int], MPI.Request | None],
                  finish: Callable[[int, int], None]) -> None:
        """Run `start(first, n)` on each segment in turn (a pool phase, then
        the leaders' nonblocking MPI call: its request, or None), and
        `finish(first, n)` on each once its request completed -- segment
        k's after segment k + 1's start, so that the MPI call of one runs
        while the pool moves the next.  Every rank runs the same pool
        phases in the same order."""
        pending: list[tuple[int, int, MPI.Request | None]] = []
        try:
            for first, n in segs:
                pending.append((first, n, start(first, n)))
                if len(pending) == 2:
                    _finish(pending[0], finish)
                    del pending[0]
            if pending:
                _finish(pending[0], finish)
                del pending[0]
        except BaseException:
            _drain([req for _, _, req in pending])
            raise

    def bcast(self, address: int, nbytes: int, root: int) -> None:
        g_root, l_root = self.where[root]
        leaders = self.leaders
        segs = segments(nbytes, 1, config.get().chunk_size)
        byte = TYPE_CODES["byte"]
        if self.group == g_root:
            reqs: list[MPI.Request] = []
            try:
                for first, n in segs:
                    self._local("bcast", address + first, n, l_root)
                    if leaders is not None:
                        reqs.append(leaders.Ibcast(_buffer(address + first, n, 1, byte),
                                                   g_root))
            except BaseException:
                _drain(reqs)
                raise
            MPI.Request.Waitall(reqs)
            return
        # every segment's MPI call posted at once (in order on every leader),
        # each passed on in the group once it arrived
        reqs = [leaders.Ibcast(_buffer(address + first, n, 1, byte), g_root)
                for first, n in segs] if leaders is not None else []
        try:
            for k, (first, n) in enumerate(segs):
                if reqs:
                    reqs[k].Wait()
                self._local("bcast", address + first, n, 0)
        except BaseException:
            _drain(reqs)
            raise

    def reduce(self, sendaddr: int, recvaddr: int, count: int, itemsize: int,
               op: int, tcode: int, root: int) -> None:
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

            self._pipeline(segs, start, spread)
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
        n_group = len(self.groups[self.group])

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
            at, size = first * itemsize, n * itemsize    # leader -> root
            self._local("gather", dst + at if dst else 0, size if dst else 0,
                        [recvaddr + at if self.rank == root else 0] * n_group,
                        [size if q == 0 else 0 for q in range(n_group)], l_root,
                        size, "Reduce")

        self._pipeline(segs, reduce_start, to_root)

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
        """The header step of Gatherv & co.: the maximum over all ranks, or
        0 when any rank published 0.  The block checksum (`pairs`) sums to
        zero only over the whole communicator, not per group: across pool
        groups the counts are left to MPI's own checks."""
        if self.pool is not None:
            value = self._local("agree", value, what, root)
        if self.leaders is not None:
            any_zero = self.leaders.allreduce(int(value == 0), MPI.MAX)
            value = 0 if any_zero else self.leaders.allreduce(value, MPI.MAX)
        if self.pool is not None:
            out = ctypes.c_uint64(value)
            self._local("bcast", ctypes.addressof(out), 8, 0)
            value = out.value
        return value

    def gather(self, sendaddr: int, send_nbytes: int, recv_addrs: list[int],
               recv_nbytes: list[int], root: int, max_nbytes: int, what: str,
               pairs: int = 0) -> None:
        """Allgather(v) (root < 0) and Gather(v) over the pool groups (the
        block checksum `pairs` is not checked across groups: see agree)."""
        group = self.groups[self.group]
        size = len(self.where)
        slot = max_nbytes
        leader = self.leaders is not None
        # 1. each group's blocks, padded to `slot`, at its leader
        packed = ctypes.create_string_buffer(max(len(group) * slot, 1)) if leader else None
        base = ctypes.addressof(packed) if leader else 0
        if self.pool is not None:
            self._local("gather", sendaddr, send_nbytes,
                        [base + i * slot for i in range(len(group))], [slot] * len(group),
                        0, slot, what)
        elif send_nbytes:
            ctypes.memmove(base, sendaddr, send_nbytes)
        # 2. among leaders: every group's blocks, in group order
        counts = [len(g) * slot for g in self.groups]
        displs = [sum(counts[:g]) for g in range(len(self.groups))]
        everything = None
        g_root = self.where[root][0] if root >= 0 else -1
        if leader or (root >= 0 and self.rank == root) or root < 0:
            everything = ctypes.create_string_buffer(max(size * slot, 1))
        whole = ctypes.addressof(everything) if everything is not None else 0
        if leader and slot:
            mine = _buffer(base, len(group) * slot, 1, TYPE_CODES["byte"])
            into = [_buffer(whole, size * slot, 1, TYPE_CODES["byte"])[0], counts, displs,
                    MPI_TYPE[TYPE_CODES["byte"]]]
            if root < 0:
                self.leaders.Allgatherv(mine, into)
            else:
                self.leaders.Gatherv(mine, into if self.group == g_root else None, g_root)
        # 3. to every rank (Allgather) or from the leader to the root (Gather)
        if root < 0:
            self._local("bcast", whole, size * slot, 0)
        elif self.group == g_root and self.where[root][1] != 0:
            n = len(group)
            self._local("gather", whole if leader else 0, size * slot if leader else 0,
                        [whole if self.rank == root else 0] * n,
                        [size * slot if q == 0 else 0 for q in range(n)],
                        self.where[root][1], size * slot, what)
        # 4. each receiver puts the blocks where they belong
        if root < 0 or self.rank == root:
            at = 0
            for ranks in self.groups:
                for r in ranks:
                    if recv_nbytes[r] and recv_addrs[r] != whole + at:
                        ctypes.memmove(recv_addrs[r], whole + at, min(recv_nbytes[r], slot))
                    at += slot


def _finish(pending: tuple[int, int, MPI.Request | None],
            finish: Callable[[int, int], None]) -> None:
    first, n, req = pending
    if req is not None:
        req.Wait()
    finish(first, n)


def _drain(reqs: list[MPI.Request | None]) -> None:
    """After a failure in a pipelined collective: let the leaders' requests
    still in flight complete, so that MPI writes into no buffer the caller
    got back -- for at most CXLMPI_TIMEOUT, since their partners may have
    failed too and never post theirs (those requests are then left
    behind: the communicator's pool is broken and the call raises)."""
    live = [req for req in reqs if req is not None]
    timeout = config.get().timeout
    deadline = time.monotonic() + (timeout if timeout > 0 else 60.0)
    while live and not MPI.Request.Testall(live):
        if time.monotonic() > deadline:
            return
        time.sleep(1e-3)

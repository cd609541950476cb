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

A reduction combines each group's contributions first, then the groups': for
floating point the result can differ in the last bits from a flat reduction,
as it does between MPI libraries (MPI leaves the order open).  Every rank
still receives the same bits.
"""

from __future__ import annotations

import ctypes
from typing import Any

from mpi4py import MPI

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

    def bcast(self, address: int, nbytes: int, root: int) -> None:
        g_root, l_root = self.where[root]
        if self.group == g_root:
            self._local("bcast", address, nbytes, l_root)
        if self.leaders is not None and nbytes:
            self.leaders.Bcast(_buffer(address, nbytes, 1, TYPE_CODES["byte"]), g_root)
        if self.group != g_root:
            self._local("bcast", address, nbytes, 0)

    def reduce(self, sendaddr: int, recvaddr: int, count: int, itemsize: int,
               op: int, tcode: int, root: int) -> None:
        nbytes = count * itemsize
        leader = self.leaders is not None
        if root < 0:                                  # Allreduce
            self._reduce_local(sendaddr, recvaddr, count, itemsize, op, tcode)
            if leader and count:
                self.leaders.Allreduce(MPI.IN_PLACE,
                                       _buffer(recvaddr, count, itemsize, tcode), MPI_OP[op])
            self._local("bcast", recvaddr, nbytes, 0)
            return
        g_root, l_root = self.where[root]
        scratch = None
        dst = 0
        if leader:
            if self.rank == root:
                dst = recvaddr
            else:
                scratch = ctypes.create_string_buffer(max(nbytes, 1))
                dst = ctypes.addressof(scratch)
        self._reduce_local(sendaddr, dst, count, itemsize, op, tcode)
        if leader and count:
            msg = _buffer(dst, count, itemsize, tcode)
            if self.group == g_root:
                self.leaders.Reduce(MPI.IN_PLACE, msg, MPI_OP[op], g_root)
            else:
                self.leaders.Reduce(msg, None, MPI_OP[op], g_root)
        if self.group == g_root and l_root != 0:      # leader -> root
            n = len(self.groups[self.group])
            sizes = [nbytes if q == 0 else 0 for q in range(n)]
            self._local("gather", dst if leader else 0, nbytes if leader else 0,
                        [recvaddr if self.rank == root else 0] * n, sizes, l_root,
                        nbytes, "Reduce")

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

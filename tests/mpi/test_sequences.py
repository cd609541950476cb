"""Back-to-back collectives of changing sizes and roots with no barrier in
between, and several communicators interleaved."""

from __future__ import annotations

import numpy as np
from common import PLAIN, RANK, agree, counts_for, make_data, same
from mpi4py import MPI

import cxlmpi


def _random_program(comms, plains, steps: int, seed: int) -> bool:
    rng = np.random.default_rng(seed)  # same seed on every rank: same program
    counts = counts_for(np.float64)
    ok = True
    for step in range(steps):
        k = int(rng.integers(len(comms)))
        comm, plain = comms[k], plains[k]
        if comm == MPI.COMM_NULL:
            continue
        size, rank = comm.Get_size(), comm.Get_rank()
        count = int(rng.choice(counts))
        root = int(rng.integers(1 << 30)) % size  # same draws whatever the size
        kind = int(rng.integers(9))
        dtype = [np.float64, np.int32, np.complex128, np.int8][int(rng.integers(4))]
        data = make_data(dtype, count, step)
        if kind == 0:
            want = np.empty_like(data)
            got = np.empty_like(data)
            plain.Allreduce(data, want)
            comm.Allreduce(data, got)
            ok &= same(got, want, MPI.SUM)
        elif kind == 1:
            src = make_data(dtype, count, step, rank=root)
            got = src.copy() if rank == root else np.zeros_like(src)
            comm.Bcast(got, root)
            ok &= bool(np.array_equal(got, src))
        elif kind == 2:
            want = np.zeros_like(data)
            got = np.zeros_like(data)
            plain.Reduce(data, want, MPI.SUM, root)
            comm.Reduce(data, got, MPI.SUM, root)
            ok &= rank != root or same(got, want, MPI.SUM)
        elif kind == 3:
            comm.Barrier()
        else:
            block = max(0, count // size)
            name = ["Allgather", "Alltoall", "Reduce_scatter_block", "Scan",
                    "Gather"][kind - 4]
            if name in ("Allgather", "Gather"):
                send = data[:block]
                want, got = np.zeros(block * size, dtype), np.zeros(block * size, dtype)
            elif name == "Scan":
                send = data
                want, got = np.zeros_like(data), np.zeros_like(data)
            elif name == "Alltoall":
                send = data[:block * size]
                want, got = np.zeros_like(send), np.zeros_like(send)
            else:
                send = data[:block * size]
                want, got = np.zeros(block, dtype), np.zeros(block, dtype)
            if name == "Gather":
                plain.Gather(send, want, root)
                comm.Gather(send, got, root)
                ok &= rank != root or bool(np.array_equal(got, want))
            else:
                getattr(plain, name)(send, want)
                getattr(comm, name)(send, got)
                ok &= same(got, want, MPI.SUM)
    return ok


def test_back_to_back_no_barrier(comm):
    """Many calls in a row; a fast rank must never overwrite a slot a slow
    one is still reading."""
    ok = _random_program([comm], [PLAIN], 300, 7)
    agree(ok, "back-to-back sequence")


def test_interleaved_communicators(comm):
    dup = comm.Dup()
    half_plain = PLAIN.Split(RANK % 2, RANK)
    half = cxlmpi.wrap(half_plain.Dup())
    world = cxlmpi.wrap(PLAIN)  # same handle as PLAIN: pool and stock mixed
    try:
        agree(isinstance(dup, cxlmpi.CXLComm), "Dup is wrapped")
        ok = _random_program([comm, dup, half, world],
                             [PLAIN, PLAIN, half_plain, PLAIN], 200, 8)
        agree(ok, "interleaved communicators")
    finally:
        half.Free()
        half_plain.Free()
        dup.Free()


def test_varying_sizes_descending_then_ascending(comm):
    counts = counts_for(np.float64)
    ok = True
    for count in counts[::-1] + counts:
        data = make_data(np.float64, count, 9)
        want = np.zeros(count)
        PLAIN.Allreduce(data, want, MPI.MAX)
        got = np.zeros(count)
        comm.Allreduce(data, got, MPI.MAX)
        ok &= same(got, want, MPI.MAX)
    agree(ok, "sizes up and down")


def test_size_one_split(comm):
    """A communicator of one rank (everything passes through)."""
    solo = comm.Split(RANK, 0)
    try:
        data = make_data(np.float64, counts_for(np.float64)[-1], 12)
        got = np.zeros_like(data)
        solo.Allreduce(data, got)
        agree(np.array_equal(got, data) and solo.Get_size() == 1, "size-one comm")
    finally:
        solo.Free()

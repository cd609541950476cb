"""A rank busy in MPI while its peers wait in a pool collective.

    mpiexec -n N python overlap.py SCENARIO

Rank 0 does something in MPI that completes only if the other ranks let MPI
progress; they are meanwhile in a pool collective on a wrapped communicator
(rank 0 joins it afterwards; a pool-sized Allreduce: Barrier goes to MPI
under CXLMPI_ORDERING):

- rma:        passive-target RMA (Lock_all, Put, Flush_all, Unlock_all)
- accumulate: 200 passive-target Accumulates of 1 MiB onto each peer, each
              flushed: the peers' waits must progress every packet of it
              (0.14 s per Accumulate when they progressed once per sleep;
              0.08 s for all under stock MPI)
- rendezvous: a 4 MiB Send to rank 1, which posted the Irecv earlier
- ibcast:     a pending 4 MiB Ibcast from the last rank, which rank 0 waits
              for before joining the pool collective
- persistent: a persistent 4 MiB send to rank 1 (Send_init/Start/Wait),
              whose persistent receive rank 1 started earlier

Prints RESULT {...}: whether every value equals the stock reference (the
RMA values put, the message sent, the broadcast data, and the pool
collective's result against stock MPI's on the same data).
"""

import json
import sys

import numpy as np
from mpi4py import MPI

import cxlmpi

scenario = sys.argv[1]
plain = MPI.COMM_WORLD
comm = cxlmpi.wrap(plain.Dup())
rank, size = comm.Get_rank(), comm.Get_size()
data = np.arange(1 << 15, dtype=np.float64) * (rank + 1)   # 256 KiB
got = np.empty_like(data)
comm.Allreduce(data, got)                                # sets the pool up
ok = {}

if scenario == "rma":
    mem = np.zeros(1)
    win = MPI.Win.Create(mem, comm=plain)
    if rank == 0:
        win.Lock_all()
        for target in range(1, size):
            win.Put(np.array([10.0 * target]), target)
        win.Flush_all()
        win.Unlock_all()
    comm.Allreduce(data, got)   # the others wait here (in the pool) while rank 0 puts
    win.Free()
    ok["rma"] = rank == 0 or mem[0] == 10.0 * rank
    pooled = "allreduce"
elif scenario == "accumulate":
    rounds = 200
    mem = np.zeros(1 << 17)                                  # 1 MiB
    win = MPI.Win.Create(mem, comm=plain)
    if rank == 0:
        ones = np.ones_like(mem)
        win.Lock_all()
        for _ in range(rounds):
            for target in range(1, size):
                win.Accumulate(ones, target, op=MPI.SUM)
            win.Flush_all()
        win.Unlock_all()
    comm.Allreduce(data, got)   # the others wait here (in the pool) meanwhile
    win.Free()
    ok["accumulate"] = rank == 0 or bool(np.all(mem == rounds))
    pooled = "allreduce"
elif scenario == "rendezvous":
    message = np.arange(1 << 19, dtype=np.float64)          # 4 MiB: rendezvous
    inbox = np.zeros_like(message)
    req = plain.Irecv(inbox, source=0, tag=7) if rank == 1 else None
    if rank == 0:
        plain.Send(message, dest=1, tag=7)   # needs rank 1 to progress
    comm.Allreduce(data, got)
    if req is not None:
        req.Wait()
        ok["message"] = bool(np.array_equal(inbox, message))
    pooled = "allreduce"
elif scenario == "ibcast":
    root = size - 1
    payload = np.arange(1 << 19, dtype=np.float64) + 3
    box = payload.copy() if rank == root else np.zeros_like(payload)
    req = plain.Ibcast(box, root=root)
    if rank == 0:
        req.Wait()      # needs the root (in the pool collective) to progress
    comm.Allreduce(data, got)
    if rank != 0:
        req.Wait()
    ok["ibcast"] = bool(np.array_equal(box, payload))
    pooled = "allreduce"
elif scenario == "persistent":
    message = np.arange(1 << 19, dtype=np.float64) * 2
    inbox = np.zeros_like(message)
    req = plain.Recv_init(inbox, source=0, tag=8) if rank == 1 else None
    if req is not None:
        req.Start()
    if rank == 0:
        send = plain.Send_init(message, dest=1, tag=8)
        send.Start()
        send.Wait()          # needs rank 1 to progress
        send.Free()
    comm.Allreduce(data, got)
    if req is not None:
        req.Wait()
        req.Free()
        ok["message"] = bool(np.array_equal(inbox, message))
    pooled = "allreduce"
else:
    raise SystemExit(f"unknown scenario {scenario!r}")

if pooled == "allreduce":
    want = np.empty_like(data)
    plain.Allreduce(data, want)
    ok["allreduce"] = bool(np.array_equal(got, want))
stats = cxlmpi.stats()[pooled]
ok["in_pool"] = stats["pool_calls"] >= 1
everything = plain.allreduce(all(ok.values()), MPI.LAND)
if rank == 0:
    print("RESULT", json.dumps({"ok": everything, "rank0": ok}), flush=True)
comm.Free()

"""A message past its buffer where MPI could not run it on its scratch copy.

    mpiexec -n N python scratch_without_library.py

Every rank behaves as where the MPI library's functions were not found
(`_without_library`: pass-through calls go through mpi4py, which hands MPI
the user's buffers).  Each rank's receive vector of a small Alltoallv (4
bytes a block: every rank would send it to MPI at once) names 2 bytes
more than its buffer holds; the memory past the buffer is the script's
own.  MPI must not write there: every rank raises the refusal
(CXLMPIMessageError), where before each ran the call through stock MPI on
its scratch-less buffer and wrote past it.  Prints RESULT {"raised": the
ranks that raised the refusal, "past": the ranks whose memory past the
buffer changed} on rank 0.
"""

import json

import numpy as np
from mpi4py import MPI

import cxlmpi
from cxlmpi import _shim
from cxlmpi.errors import CXLMPIMessageError

_shim._without_library()
world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
comm = cxlmpi.wrap(world.Dup())
block = 4
counts, displs = [block] * size, [block * q for q in range(size)]
send = np.arange(block * size, dtype=np.uint8) + 5 * rank
mem = np.zeros(block * size + 64, np.uint8)
try:
    comm.Alltoallv([send, counts, displs, MPI.BYTE],
                   [mem[:block * size - 2], counts, displs, MPI.BYTE])
    raised = False
except CXLMPIMessageError:
    raised = True
past = bool(np.any(mem[block * size - 2:]))
every = world.gather((raised, past), root=0)
comm.Free()
if rank == 0:
    print("RESULT " + json.dumps({"raised": [q for q, e in enumerate(every) if e[0]],
                                  "past": [q for q, e in enumerate(every) if e[1]]}),
          flush=True)

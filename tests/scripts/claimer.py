"""Another job's claimer, played by rank 0 of handed_over.py and
handed_heap.py: it frees the partition at `offset` of the job's pool file and
writes its own bytes there, as a claimer on another host does to a job that
stood still past its lease."""

from mpi4py import MPI

from cxlmpi import config
from cxlmpi.memory import backends

FILL = b"\x42"


def hand_over(world: MPI.Intracomm, offset: int) -> int:
    """Collective: rank 0 hands the partition at `offset` over (between two
    barriers); returns its bytes on every rank."""
    spec = backends.parse_spec(config.get().pool)
    nbytes = 0
    world.Barrier()
    if world.Get_rank() == 0:
        dev = backends._open(spec, create=False)
        [entry] = [e for e in dev.entries() if e["offset"] == offset]
        nbytes = entry["nbytes"]
        dev._free_entry(entry["index"], offset, nbytes)
        with open(spec.path, "r+b") as f:
            f.seek(offset)
            f.write(FILL * nbytes)
        dev.close()
    nbytes = world.bcast(nbytes, root=0)
    world.Barrier()
    return nbytes


def intact(world: MPI.Intracomm, offset: int, nbytes: int) -> bool:
    """Collective: whether the other job's bytes are as it wrote them (rank
    0 reads them; True elsewhere)."""
    world.Barrier()
    if world.Get_rank() != 0:
        return True
    with open(backends.parse_spec(config.get().pool).path, "rb") as f:
        f.seek(offset)
        return f.read(nbytes) == FILL * nbytes

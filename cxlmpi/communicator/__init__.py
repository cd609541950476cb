"""The communicator layer: CXLComm, the wrapped Intracomm whose buffer
collectives are the compiled dispatcher's (cxlmpi._shim.CommBase:
pyx/shim/*.pxi) and whose derived communicators come back wrapped
(`cxlcomm`); its lower-case (pickle) collectives (`objects`), and their
nonblocking forms, an extension of mpi4py's API (`objects_nb`; the calls in
flight: `objects_progress`); the counts of all of them that
``cxlmpi.stats()`` reports (`stats`)."""

from .. import startup  # noqa: F401  (MPI is started before this package looks it up)

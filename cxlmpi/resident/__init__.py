"""Pool-resident arrays, on which collectives run zero-copy: made by the
program (``cxlmpi.empty`` & co., `arrays`) or by NumPy itself through the
allocation hook (``cxlmpi.alloc``, `alloc`)."""

from .. import startup  # noqa: F401  (MPI is started before this package looks it up)

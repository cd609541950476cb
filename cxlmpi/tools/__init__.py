"""cxlmpi's command-line tools, apart from the library: nothing here is
imported by ``import cxlmpi``.

- ``bench``: stock MPI vs cxlmpi, collective by collective (``python -m cxlmpi.bench``):
  its command line; ``operations`` (the collectives measured, their buffers,
  --validate), ``measure`` (OSU's method, the alternating rounds), ``report``
  (table, CSV, JSON, plot), ``learning`` (--learning: what adaptive
  selection's learning costs)
- ``tune``: where the pool wins on this machine, as a CXLMPI_TUNING file
  (``python -m cxlmpi.tune --output``), or adaptive selection's cache
  filled (``fill``)
"""

from .. import startup  # noqa: F401  (MPI is started before this package looks it up)

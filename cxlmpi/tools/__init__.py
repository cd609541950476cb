"""cxlmpi's command-line tools, apart from the library: nothing here is
imported by ``import cxlmpi``.

- ``bench``: stock MPI vs cxlmpi, collective by collective (``python -m cxlmpi.bench``)
- ``tune``: where the pool wins on this machine, as a CXLMPI_TUNING file
  (``python -m cxlmpi.tune``)
"""

"""What ``python -m cxlmpi`` reports: ``--info`` (and the reference's tables of
settings and options, `info`) and ``--pool-status`` / ``--pool-reset`` (a
pool file's or device's partition table, `admin`)."""

from .. import startup  # noqa: F401  (MPI is started before this package looks it up)

"""Each communicator's pools: which ranks share one and setting it up
(`group`, through the set-up's own exchanges, `agree`), several pools as
one across pool groups (`hierarchy`), the state kept per communicator and
found by the compiled hot path (`state`), its path selection from set-up
to free (`selection`), MPI kept progressing while a rank waits in the pool
(`progress`)."""

from .. import startup  # noqa: F401  (MPI is started before this package looks it up)

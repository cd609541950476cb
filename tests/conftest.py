"""The driver tests run under plain pytest; tests/mpi/ holds the bodies they
launch under mpiexec (never collected here) and tests/scripts/ the programs."""

collect_ignore = ["mpi", "scripts"]

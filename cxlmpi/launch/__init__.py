"""Putting cxlmpi in front of a program: patching MPI.COMM_WORLD and
MPI.COMM_SELF (`entry`), the command line of ``python -m cxlmpi``
(`command_line`) and running the program under it (`runner`), patched
once the program has started MPI (`hook`).  Starting MPI where cxlmpi is
used before the program starts it is cxlmpi.startup's (a layer below)."""

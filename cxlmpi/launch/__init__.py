"""Putting cxlmpi in front of a program: patching MPI.COMM_WORLD and
MPI.COMM_SELF (`entry`), starting MPI where the program starts it itself
(`startup`), the command line of ``python -m cxlmpi`` (`command_line`) and
running the program under it (`runner`)."""

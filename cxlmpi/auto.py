"""``import cxlmpi.auto`` patches MPI.COMM_WORLD and MPI.COMM_SELF."""

from .launch.entry import patch

patch()

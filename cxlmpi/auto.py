"""``import cxlmpi.auto`` patches MPI.COMM_WORLD and MPI.COMM_SELF."""

from .patch import patch

patch()

"""``import cxlmpi.auto`` patches MPI.COMM_WORLD and MPI.COMM_SELF."""

from .entry import patch

patch()

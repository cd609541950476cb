"""Fixtures of the MPI test bodies: the wrapped communicator under test."""

from __future__ import annotations

import pytest
from common import PLAIN

import cxlmpi


@pytest.fixture(scope="module")
def comm():
    """A wrapped duplicate of COMM_WORLD (freed after the module)."""
    wrapped = cxlmpi.wrap(PLAIN.Dup())
    yield wrapped
    wrapped.Free()

"""Under ``python -m cxlmpi``: another thread is inside the import of a
cxlmpi module (a library importing cxlmpi lazily) while this thread starts
MPI by importing mpi4py.MPI.  The patch waits only for this thread's own
cxlmpi imports: COMM_WORLD is cxlmpi's right after the import, while the
other thread still blocks in its import.  The helper's module
(``cxlmpi._blocking_import_test``, found by a finder of this script) holds
its import open until this thread has looked.  Rank 0 prints
``THREADS <json>``: per rank, whether COMM_WORLD was cxlmpi's then, and an
allreduce of the ranks (stock's value: the sum)."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import sys
import threading

NAME = "cxlmpi._blocking_import_test"
entered, release = threading.Event(), threading.Event()


class _Blocking(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        return importlib.machinery.ModuleSpec(fullname, self) if fullname == NAME else None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        entered.set()
        release.wait()


sys.meta_path.append(_Blocking())
helper = threading.Thread(target=lambda: __import__(NAME))
helper.start()
entered.wait()
from mpi4py import MPI  # noqa: E402  (starts MPI: the runner patches now)

world = MPI.COMM_WORLD
patched = type(world).__module__.startswith("cxlmpi")
release.set()
helper.join()
total = world.allreduce(world.Get_rank())
everyone = world.gather({"patched": patched, "sum": total}, root=0)
if world.Get_rank() == 0:
    print("THREADS " + json.dumps(everyone), flush=True)

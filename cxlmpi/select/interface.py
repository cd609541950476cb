"""The interface between the two rooms of path selection.

- The policy, in Python (this package): which paths a class tries, when it
  settles, when it checks again (`Selector`, one per communicator's pool,
  a `Learner` per class).  It runs only in a header step, which every rank
  of the pool takes or none does, so every rank decides alike.
- The timing rules, compiled (pyx/shim/routes.pxi: `Routes`, and the hot
  path's `take`, `skip`, `took` beside it): what a call takes when its class
  is settled, without Python; which calls a timed run counts and how (end
  to end, its untimed first half); when to stop for a header step.

They meet here and nowhere else.  `cxlmpi.pools.selection.attach` binds a
`RouteTable` to its `Policy` (``routes.selector``) when a communicator's pool
is set up; the communicator's state then holds only the route table.

What the compiled half calls back (`Policy`), only in a header step:
``report()`` before it, ``delivered(...)`` once every rank completed it,
``pick(...)`` for the call that asked.  What the policy hands the compiled
half (`RouteTable`): each class's path and until which call it holds
(``set``), the timed run to make (``start_run``), the first runs of classes
not met yet (``first_runs``); it reads back the run's time (``peek_run``),
the placement a class's last pool call found (``placement``) and the pool's
call counter (``ops``), the same on every rank at a call.

The numbers they exchange are the path codes of cxlmpi.select.classes:
``MPI_PATH`` (0, stock MPI), 1 + variant flags (the pool), and in the table
``SLOW`` (no decision: ask the policy in a header step) and ``NEW`` (a class
no call has met: its first call opens a run on MPI by itself); a report's
time is nanoseconds per call, ``CUT_SHORT`` for a run cut short in its
untimed half.  A class is (collective index of config.COLLECTIVES, size
class, placement 0 private / 1 pool).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

__all__ = ["Policy", "RouteTable", "RunReport"]

# The run in flight as the route table reports it: (collective, size
# class, placement, path code, this rank's seconds, calls timed, whether
# it is still in its untimed first calls).
RunReport = tuple[int, int, int, int, float, int, bool]


class Policy(Protocol):
    """What the compiled half calls back, in a header step only."""

    def report(self) -> tuple[int, int]:
        """(id, this rank's nanoseconds per call) of the report the header
        step carries: the run in flight; (0, 0) when there is none."""

    def delivered(self, nanoseconds: int, spent_ns: int = 0) -> None:
        """The header step completed on every rank: the slowest rank's time
        of the report, and the largest time a rank spent in its previous
        header call beyond the call's path (0: none measured)."""

    def likely(self, which: int, sc: int, pl: int) -> int:
        """The path code a posted call of class (which, sc, pl) takes while
        the class has settled none (a pool path: 1 + variant flags)."""

    def pick(self, which: int, nbytes: int, ops: int) -> tuple[int, bool]:
        """(path code, whether the call is timed) for a call of collective
        `which` of `nbytes` (the agreed size) at the pool's call `ops`."""


class RouteTable(Protocol):
    """What the compiled route table (cxlmpi._shim.Routes) offers the policy."""

    selector: Policy

    def set(self, which: int, sc: int, pl: int, code: int, due: int) -> None:
        """Class (which, sc, pl) takes path `code` until the call counter
        reaches `due` (SLOW: ask the policy)."""

    def first_runs(self, calls: Sequence[int], skips: Sequence[int]) -> None:
        """A class of size class sc not met yet opens with a run of calls[sc]
        calls on MPI without a header step (0: with one), the first
        skips[sc] after its opening call untimed."""

    def start_run(self, which: int, sc: int, pl: int, code: int, due: int,
                  skip: int = 0) -> None:
        """Time the calls of a class on `code` until the counter reaches
        `due` or the next header step; the first `skip` after its opening
        call only restart the timing."""

    def peek_run(self) -> RunReport | None:
        """The run in flight, None when there is none."""

    def finish_run(self) -> None:
        """End the run in flight (a header step every rank completed)."""

    def break_run(self) -> None:
        """The next call of a run timed end to end starts its timing afresh."""

    def placement(self, which: int, sc: int) -> int:
        """0 private, 1 pool: what the class's last pool call found."""

    def ops(self) -> int:
        """The pool's call counter (the same on every rank at a call)."""
